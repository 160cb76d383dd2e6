"""``python -m scheduler``: the scheduler process's composition root.

It reads :class:`Config`, reports to Sentry as "scheduler", builds the
pools, the Redis client and a broker to send with, and runs each periodic
service (sweeper, reaper, partition keeper, history roller, webhook relay,
gateway events, console bulk actions) in a thread of its own until SIGTERM.
No leader: run as many as you like; SKIP LOCKED, advisory locks, the shared
pacing bucket and the guarded reaper make them cooperate through Postgres
and Redis alone. It sends the workers' message (paycron.engine.messages)
without importing the worker's wiring.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass

from dramatiq.brokers.redis import RedisBroker
from psycopg_pool import ConnectionPool

from paycron.config import Config
from paycron.engine.messages import execute_message
from paycron.limits.breaker import CircuitBreaker
from paycron.limits.pacing import CallLimiter, ClaimPacer
from paycron.observability.metrics import serve_metrics
from paycron.observability.sentry import configure_logging, init_sentry
from paycron.observability.startup import one_line_errors, preflight, schema_pending
from paycron.processors.factory import build_processor
from paycron.store.db import make_pool, make_redis
from paycron.store.migrate import wait_until_current
from scheduler import gateway_events
from scheduler.console_bulk import ConsoleBulkRunner
from scheduler.gateway_events import GatewayEventService
from scheduler.history import HistoryRoller
from scheduler.partition_keeper import PartitionKeeper
from scheduler.reaper import Reaper
from scheduler.relay import RelayConfig, WebhookRelay
from scheduler.service import PeriodicService
from scheduler.sweeper import Sweeper, SweepSettings
from scheduler.wake import DueWake

log = logging.getLogger("paycron.scheduler")


@dataclass
class Scheduler:
    """Everything one scheduler process runs, and what it must close."""

    services: list[PeriodicService]
    pools: list[ConnectionPool]
    broker: RedisBroker

    wake: DueWake | None = None

    def run(self, stop: threading.Event) -> None:
        threads = [service.start(stop) for service in self.services]
        if self.wake is not None:
            threads.append(self.wake.start(stop))
        stop.wait()
        for thread in threads:
            thread.join()
        self.close()

    def close(self) -> None:
        for service in self.services:
            service.close()
        for pool in self.pools:
            pool.close()
        self.broker.close()


def build(config: Config) -> Scheduler:
    """Wire the scheduler from ``config`` (Sentry first, as every root does)."""
    init_sentry(config, component="scheduler")
    relay_config = RelayConfig.from_config(config)  # validated before anything starts
    client = make_redis(config)
    broker = RedisBroker(url=config.redis_url, namespace=f"{config.redis_namespace}-dramatiq")
    # One connection per service on it (sweeper, reaper, keeper, roller) and one spare.
    pool = make_pool(config, max_size=5, name="scheduler")
    # Webhooks have their own pool: a slow endpoint never holds a sweep's connection.
    relay_pool = make_pool(config, max_size=relay_config.pool_size, name="relay")
    # And the processor's events theirs: a burst of them never delays a sweep.
    events_pool = make_pool(config, max_size=6, name="gateway-events")

    def enqueue(claims, probe):
        broker.enqueue(execute_message(claims, probe=probe, queue_name=config.queue_name))

    breaker = CircuitBreaker(client, config)
    wake = DueWake(config) if config.prompt_start else None
    services = [
        Sweeper(
            settings=SweepSettings.from_config(config),
            pool=pool,
            pacer=ClaimPacer(client, config),
            breaker=breaker,
            enqueue=enqueue,
            wake=wake,
        ),
        Reaper(config=config, pool=pool),
        # The console's bulk dead-letter actions, a chunk at a time.
        ConsoleBulkRunner(
            pool=pool,
            gateway=build_processor(
                config, max_connections=4, call_limiter=CallLimiter(client, config)
            ),
        ),
        PartitionKeeper(config=config, pool=pool),
        HistoryRoller.from_config(config, pool=pool),
        WebhookRelay(pool=relay_pool, config=relay_config),
        # Retrieves take tokens from the workers' call window: polling never
        # pushes charges past the processor's rate limit.
        GatewayEventService(
            config=config,
            pool=events_pool,
            # As many keep-alive connections as retrieves in flight: a smaller
            # pool discards one per burst ("Connection pool is full") and
            # pays a new TLS handshake each time.
            gateway=build_processor(
                config,
                max_connections=gateway_events.CONCURRENCY,
                call_limiter=CallLimiter(client, config),
            ),
        ),
    ]
    return Scheduler(
        services=services, pools=[pool, relay_pool, events_pool], broker=broker, wake=wake
    )


def main() -> None:
    configure_logging()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # A wrong setting or a server that does not answer: one line, exit 2.
    with one_line_errors("scheduler"):
        config = Config.from_env()
        init_sentry(config, component="scheduler")
        preflight(config)
        # Migrations pending (the release step has not run): wait for them,
        # saying so once per interval, rather than fail every sweep.
        if not wait_until_current(lambda: schema_pending(config), stop, log=log):
            return
        scheduler = build(config)
    serve_metrics(config.metrics_port, component="scheduler", host=config.metrics_host)
    log.info(
        "scheduler started: rate=%s/s batch=%s lease=%ss group=%s",
        config.gateway_rate_limit,
        config.claim_batch,
        config.lease_seconds,
        config.group_size,
    )
    scheduler.run(stop)


if __name__ == "__main__":
    main()
