"""``python -m scheduler``: sweep, reap and keep partitions, in one loop;
relay webhooks in a thread of their own.

The composition root of the scheduler process. No leader: run as many as
you like; SKIP LOCKED, the shared pacing bucket and the guarded reaper make
them cooperate through Postgres and Redis alone.
"""

from __future__ import annotations

import logging
import signal
import time

import redis

from paycron.breaker import CircuitBreaker
from paycron.db import make_pool
from paycron.metrics import serve_metrics
from paycron.observability import configure_logging
from paycron.pacing import ClaimPacer
from scheduler.partition_keeper import PartitionKeeper
from scheduler.reaper import Reaper
from scheduler.relay import RelayConfig, WebhookRelay
from scheduler.sweeper import Sweeper

log = logging.getLogger("paycron.scheduler")

#: Partitions are checked hourly: the horizon has a week of margin.
KEEPER_INTERVAL_SECONDS = 3600


def main() -> None:
    configure_logging()
    # Importing tasks configures Sentry and the broker from the environment.
    from tasks import broker, config, execute_payments
    from tasks.execute import encode_claims

    serve_metrics(config.metrics_port, component="scheduler")
    client = redis.Redis.from_url(config.redis_url or "redis://127.0.0.1:6379/0")
    pool = make_pool(config, max_size=4, name="scheduler")
    queue_key = f"{broker.namespace}:{config.queue_name}"

    def enqueue(claims, probe):
        execute_payments.send(encode_claims(list(claims)), probe)

    def queued_claims() -> int:
        return client.llen(queue_key) * config.group_size

    sweeper = Sweeper(config=config, pool=pool, pacer=ClaimPacer(client, config),
                      breaker=CircuitBreaker(client, config), enqueue=enqueue,
                      queued_claims=queued_claims)
    reaper = Reaper(config=config, pool=pool)
    keeper = PartitionKeeper(config=config, pool=pool)
    # Webhooks in their own thread and pool: a slow endpoint never delays a sweep.
    relay_config = RelayConfig.from_config(config)
    relay = WebhookRelay(pool=make_pool(config, max_size=relay_config.pool_size, name="relay"),
                         config=relay_config)
    relay.start()

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    next_keep = 0.0
    log.info("scheduler started: rate=%s/s batch=%s lease=%ss group=%s",
             config.gateway_rate_limit, config.claim_batch, config.lease_seconds,
             config.group_size)
    while not stop:
        try:
            if time.monotonic() >= next_keep:
                keeper.run_once()
                next_keep = time.monotonic() + KEEPER_INTERVAL_SECONDS
            reaper.run_once()
            counts = sweeper.run_once()
            if counts.claimed:
                log.info("sweep %s", counts)
        except Exception:  # a database or Redis outage: log, back off, go on
            log.exception("scheduler tick failed")
            time.sleep(min(5.0, config.sweep_interval_seconds * 2))
            continue
        # Sleep only when the sweep came back short (drained or paced).
        time.sleep(config.sweep_interval_seconds)
    relay.close()
    relay.pool.close()
    pool.close()


if __name__ == "__main__":
    main()
