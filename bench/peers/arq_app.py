"""arq peer: a no-op job (run: arq bench.peers.arq_app.WorkerSettings), max_jobs 100."""

import os

from arq.connections import RedisSettings


async def noop(ctx, payload):
    return None


class WorkerSettings:
    functions = [noop]
    redis_settings = RedisSettings.from_dsn(os.environ["BENCH_PEER_URL"])
    max_jobs = 100
    keep_result = 0
    poll_delay = 0.05
    burst = False
    log_results = False
