"""The breaker and the shared call window for a worker's event loop
(``EXECUTOR=asyncio``): the same Redis keys and rules as
:class:`~paycron.limits.breaker.CircuitBreaker` and
:class:`~paycron.limits.pacing.CallLimiter`, over ``redis.asyncio``, so a
threaded and an async worker share one breaker and one window.

A group costs two round trips to Redis where the threaded executor's
costs three (four after a failure): the breaker asked and the first tokens
taken in one script (:meth:`AsyncCallLimiter.admit`), its calls counted
and the window judged in another (:meth:`AsyncCircuitBreaker.record`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis.asyncio

from paycron.config import Config
from paycron.limits.breaker import BreakerState, CircuitBreaker
from paycron.limits.pacing import _WINDOW

_HERE = Path(__file__).parent
_RECORD = (_HERE / "breaker_record.lua").read_text()
#: The breaker's check, then the window's take (call_window.lua whole).
_ADMIT = (_HERE / "breaker_gate.lua").read_text() + _WINDOW


class AsyncCircuitBreaker:
    """What the executor asks of the breaker: its state, a group's calls
    counted, a probe's end. Opening and closing are the blocking breaker's
    (the same keys)."""

    def __init__(self, client: redis.asyncio.Redis, breaker: CircuitBreaker):
        self._redis = client
        self.sync = breaker
        self._record = client.register_script(_RECORD)

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
        config = b._config
        bad = await self._record(
            keys=[b._calls, b._fails],
            args=[
                int(b._clock()),
                config.circuit_window_seconds,
                calls,
                failures,
                config.circuit_min_calls,
                repr(float(config.circuit_failure_ratio)),
            ],
        )
        if int(bad):
            await asyncio.to_thread(b.open)

    async def probe_finished(self, *, failed: bool) -> None:
        await asyncio.to_thread(self.sync.probe_finished, failed=failed)


class AsyncCallLimiter:
    """:class:`~paycron.limits.pacing.CallLimiter` on the loop: waiting for
    the window sleeps this task only."""

    def __init__(self, client: redis.asyncio.Redis, config: Config):
        self._take = client.register_script(_WINDOW)
        self._admit = client.register_script(_ADMIT)
        self._key = f"{config.redis_namespace}:pacing:calls"
        self.limit = config.gateway_rate_limit

    async def admit(self, want: int, *, breaker: AsyncCircuitBreaker, probe: bool) -> int:
        """A group's first tokens, if the breaker lets it call: the breaker
        asked (:meth:`AsyncCircuitBreaker.state`'s rule) and the window's
        tokens taken in one round trip. 0 while the breaker holds calls
        (open; half-open and this group is not the probe): no token taken,
        the group is released. Else at least one, waiting for the window."""
        b = breaker.sync
        granted, wait_ms = await self._admit(
            keys=[self._key, b._open_until],
            args=[want, self.limit, repr(b._clock()), 1 if probe else 0],
        )
        if int(granted) < 0:  # -1 open, -2 half-open and not the probe
            return 0
        if int(granted) > 0:
            return int(granted)
        await asyncio.sleep(int(wait_ms) / 1000)
        return await self.acquire_some(want)

    async def acquire_some(self, want: int) -> int:
        while True:
            granted, wait_ms = await self._take(keys=[self._key], args=[want, self.limit])
            if int(granted) > 0:
                return int(granted)
            await asyncio.sleep(int(wait_ms) / 1000)
