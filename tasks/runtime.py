"""What an actor needs, built once per worker process on first use (after
Dramatiq has forked, so no socket is shared with a parent): the executor,
its call pool, and the dispatcher that keeps the in-flight limit; with
``EXECUTOR=asyncio``, their async twins, built on the process's event loop."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from paycron.config import Config
from paycron.engine.aio import AsyncExecutor
from paycron.engine.execution import Executor
from paycron.engine.inflight import AsyncDispatcher, AsyncInFlightLimit, Dispatcher, InFlightLimit
from paycron.limits.aio import AsyncCallLimiter, AsyncCircuitBreaker
from paycron.limits.breaker import CircuitBreaker
from paycron.limits.pacing import CallLimiter
from paycron.observability.metrics import serve_metrics
from paycron.processors.factory import build_async_charger, build_processor
from paycron.store.aio import async_redis, make_async_pool
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


async def build_async_dispatcher(config: Config) -> AsyncDispatcher:
    """``EXECUTOR=asyncio``: the same parts on this process's event loop; a
    blocking twin (a pool of 2, the blocking client) for the rare paths,
    whose calls run side by side on the executor's threads."""
    serve_metrics(config.metrics_port, component="worker", host=config.metrics_host)
    client = make_redis(config)
    aclient = async_redis(config)
    most = config.gateway_max_in_flight
    limit = AsyncInFlightLimit(
        rate=config.gateway_rate_limit, max_in_flight=most, floor=config.group_size
    )
    call_limiter = CallLimiter(client, config)
    blocking = Executor(
        config=config,
        pool=make_pool(config, max_size=2, name="worker-rare"),
        gateway=build_processor(config, max_connections=most, call_limiter=call_limiter),
        breaker=CircuitBreaker(client, config),
        call_limiter=call_limiter,
    )
    executor = AsyncExecutor(
        blocking=blocking,
        # Groups hold a connection only for their two statements, never across a call.
        pool=await make_async_pool(config, max_size=config.db_pool_max, name="worker"),
        breaker=AsyncCircuitBreaker(aclient, blocking.breaker),
        call_limiter=AsyncCallLimiter(aclient, config),
        charger=build_async_charger(config, max_connections=most),
        on_latency=limit.observe,
    )
    return AsyncDispatcher(executor=executor, limit=limit)


_async_dispatcher: AsyncDispatcher | None = None
_building: asyncio.Lock | None = None


async def async_dispatcher(config: Config) -> AsyncDispatcher:
    global _async_dispatcher, _building
    if _async_dispatcher is None:
        _building = _building or asyncio.Lock()
        async with _building:
            if _async_dispatcher is None:
                _async_dispatcher = await build_async_dispatcher(config)
    return _async_dispatcher


async def drain_async_dispatcher(timeout: float) -> int:
    """A stopping worker's last step on its loop (tasks/broker.py): the
    groups still running end first; how many did not within ``timeout``."""
    if _async_dispatcher is None:
        return 0
    return await _async_dispatcher.drain(timeout)


def dispatcher(config: Config) -> Dispatcher:
    global _dispatcher
    if _dispatcher is None:
        with _lock:
            if _dispatcher is None:
                _dispatcher = build_dispatcher(config)
    return _dispatcher
