"""dramatiq peer: Redis broker, a no-op actor (run: dramatiq bench.peers.dramatiq_app -p 1 -t 8)."""

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

broker = RedisBroker(url=os.environ["BENCH_PEER_URL"])
dramatiq.set_broker(broker)


@dramatiq.actor(max_retries=0)
def noop(payload):
    return None
