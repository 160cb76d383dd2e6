"""The worker process's composition root (``dramatiq tasks`` imports it in
each worker process): config from the environment, its servers reached and
its schema current, Sentry as "worker" (before the broker: its Dramatiq
integration patches the broker's constructor), the Redis broker. What an
actor needs at run time is built per process in tasks/runtime.py."""

from __future__ import annotations

import logging
import signal
import threading

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware.asyncio import AsyncIO

from paycron.config import Config
from paycron.observability.sentry import init_sentry
from paycron.observability.startup import one_line_errors, preflight, schema_pending
from paycron.store.migrate import wait_until_current
from tasks.prompt_broker import PromptRedisBroker

log = logging.getLogger("paycron.worker")


def _wait_for_schema(config: Config) -> None:
    """Migrations pending (the release step has not run yet): wait, one line
    per interval, before taking any message; SIGTERM meanwhile ends the process."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if not wait_until_current(lambda: schema_pending(config), stop, log=log):
            raise SystemExit(0)
    finally:
        signal.signal(signal.SIGTERM, previous)


# A wrong setting or a server that does not answer: one line, exit 2.
with one_line_errors("worker"):
    config = Config.from_env()
    init_sentry(config, component="worker")
    preflight(config)
    _wait_for_schema(config)

broker = (PromptRedisBroker if config.prompt_start else RedisBroker)(
    url=config.redis_url, namespace=f"{config.redis_namespace}-dramatiq"
)
if config.execution == "asyncio":
    # One event loop per process runs the async actor (paycron/engine/aio.py).
    broker.add_middleware(AsyncIO())
dramatiq.set_broker(broker)
