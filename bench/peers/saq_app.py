"""saq peer: a no-op job (run: saq bench.peers.saq_app.settings), concurrency 100."""

import os

from saq import Queue


async def noop(ctx, *, payload):
    return None


queue = Queue.from_url(os.environ["BENCH_PEER_URL"])

settings = {
    "queue": queue,
    "functions": [noop],
    "concurrency": 100,
}
