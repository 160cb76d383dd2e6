"""What an actor needs, built once per worker process on first use (after
Dramatiq has forked, so no socket is shared with a parent): the executor,
its call pool, and the dispatcher that keeps the in-flight limit."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from paycron.config import Config
from paycron.engine.execution import Executor
from paycron.engine.inflight import Dispatcher, InFlightLimit
from paycron.limits.breaker import CircuitBreaker
from paycron.limits.pacing import CallLimiter
from paycron.observability.metrics import serve_metrics
from paycron.processors.factory import build_processor
from paycron.store.db import make_pool, make_redis

_lock = threading.Lock()
_dispatcher: Dispatcher | None = None


def build_dispatcher(config: Config) -> Dispatcher:
    serve_metrics(config.metrics_port, component="worker", host=config.metrics_host)
    client = make_redis(config)
    most = config.gateway_max_in_flight  # the in-flight limit's ceiling
    limit = InFlightLimit(
        rate=config.gateway_rate_limit, max_in_flight=most, floor=config.group_size
    )
    call_limiter = CallLimiter(client, config)
    executor = Executor(
        config=config,
        # Groups hold a connection only for their two statements, never across a call.
        pool=make_pool(config, max_size=config.db_pool_max, name="worker"),
        gateway=build_processor(config, max_connections=most, call_limiter=call_limiter),
        breaker=CircuitBreaker(client, config),
        call_limiter=call_limiter,
        calls=ThreadPoolExecutor(max_workers=most, thread_name_prefix="gateway-call"),
        on_latency=limit.observe,
    )
    groups = ThreadPoolExecutor(max_workers=most, thread_name_prefix="group")
    return Dispatcher(executor=executor, limit=limit, groups=groups)


def dispatcher(config: Config) -> Dispatcher:
    global _dispatcher
    if _dispatcher is None:
        with _lock:
            if _dispatcher is None:
                _dispatcher = build_dispatcher(config)
    return _dispatcher
