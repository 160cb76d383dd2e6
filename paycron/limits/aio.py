"""The breaker and the shared call window for a worker's event loop
(``EXECUTOR=asyncio``): the same Redis keys, scripts and rules as
:class:`~paycron.limits.breaker.CircuitBreaker` and
:class:`~paycron.limits.pacing.CallLimiter`, over ``redis.asyncio``, so a
threaded and an async worker share one breaker and one window."""

from __future__ import annotations

import asyncio

import redis.asyncio

from paycron.config import Config
from paycron.limits.breaker import BreakerState, CircuitBreaker
from paycron.limits.pacing import _WINDOW


class AsyncCircuitBreaker:
    """What the executor asks of the breaker: its state, a group's calls
    counted, a probe's end. Opening and closing are the blocking breaker's
    (the same keys)."""

    def __init__(self, client: redis.asyncio.Redis, breaker: CircuitBreaker):
        self._redis = client
        self.sync = breaker

    async def state(self) -> BreakerState:
        raw = await self._redis.get(self.sync._open_until)
        if raw is None:
            return BreakerState.CLOSED
        return BreakerState.OPEN if self.sync._clock() < float(raw) else BreakerState.HALF_OPEN

    async def record(self, *, calls: int, failures: int) -> None:
        """:meth:`CircuitBreaker.record`: count a group's calls; trip when the window is bad."""
        if calls <= 0:
            return
        b = self.sync
        second = int(b._clock())
        window = b._config.circuit_window_seconds
        pipe = self._redis.pipeline(transaction=False)
        pipe.incrby(f"{b._calls}:{second}", calls)
        pipe.expire(f"{b._calls}:{second}", window + 5)
        if failures:
            pipe.incrby(f"{b._fails}:{second}", failures)
            pipe.expire(f"{b._fails}:{second}", window + 5)
        await pipe.execute()
        if failures and await self._window_is_bad(second, window):
            await asyncio.to_thread(b.open)

    async def _window_is_bad(self, second: int, window: int) -> bool:
        b = self.sync
        seconds = range(second - window + 1, second + 1)
        values = await self._redis.mget(
            [f"{b._calls}:{s}" for s in seconds] + [f"{b._fails}:{s}" for s in seconds]
        )
        counts = [int(v or 0) for v in values]
        calls, fails = sum(counts[:window]), sum(counts[window:])
        return (
            calls >= b._config.circuit_min_calls
            and fails >= b._config.circuit_failure_ratio * calls
        )

    async def probe_finished(self, *, failed: bool) -> None:
        await asyncio.to_thread(self.sync.probe_finished, failed=failed)


class AsyncCallLimiter:
    """:class:`~paycron.limits.pacing.CallLimiter` on the loop: waiting for
    the window sleeps this task only."""

    def __init__(self, client: redis.asyncio.Redis, config: Config):
        self._take = client.register_script(_WINDOW)
        self._key = f"{config.redis_namespace}:pacing:calls"
        self.limit = config.gateway_rate_limit

    async def acquire_some(self, want: int) -> int:
        while True:
            granted, wait_ms = await self._take(keys=[self._key], args=[want, self.limit])
            if int(granted) > 0:
                return int(granted)
            await asyncio.sleep(int(wait_ms) / 1000)
