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
from dramatiq.asyncio import get_event_loop_thread
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware
from dramatiq.middleware.asyncio import AsyncIO

from paycron.config import Config
from paycron.engine.aio import use_uvloop
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


class DrainCalls(Middleware):
    """A stopping worker lets its loop's groups end before the loop stops.

    Dramatiq stops a worker by stopping its consumers and threads, then
    calls the middlewares' ``after_worker_shutdown`` in reverse order: this
    one, added after :class:`AsyncIO`, runs before AsyncIO closes the loop.
    Nothing admits a group any more; the groups running finish their calls
    (each bounded by its lease) and write their outcomes, as the threaded
    dispatcher's pools do when its process exits. Without it every deploy
    would leave the calls in flight to their leases: in doubt, looked up,
    counted as expiries."""

    def __init__(self, timeout: float):
        self.timeout = timeout

    def after_worker_shutdown(self, broker, worker) -> None:
        thread = get_event_loop_thread()
        if thread is None or not thread.loop.is_running():
            return
        from tasks.runtime import drain_async_dispatcher

        left = thread.run_coroutine(drain_async_dispatcher(self.timeout))
        if left:
            log.warning("stopping with %d groups still running: their leases return them", left)


loop = "none"
if config.execution == "asyncio":
    # One event loop per process runs the async actor (paycron/engine/aio.py).
    loop = use_uvloop()
    broker.add_middleware(AsyncIO())
    broker.add_middleware(DrainCalls(timeout=config.lease_seconds))
log.info("executor: %s (EXECUTOR=%s), event loop: %s", config.execution, config.executor, loop)
dramatiq.set_broker(broker)
