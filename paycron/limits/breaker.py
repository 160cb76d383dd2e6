"""The circuit breaker, its state in Redis so every process shares it.

Closed: calls flow. When at least ``CIRCUIT_MIN_CALLS`` calls in the last
``circuit_window_seconds`` were recorded and at least
``CIRCUIT_FAILURE_RATIO`` of them failed retryably (5xx, timeouts, dropped;
429s and declines are not failures), it opens: sweepers stop claiming and
workers release what they hold without using budget. After
``CIRCUIT_OPEN_SECONDS`` it is half-open: exactly one sweeper wins the probe
token (``SET NX``) and claims the single oldest due row; the probe's success
closes the breaker, its failure re-opens it.
"""

from __future__ import annotations

import time
from enum import StrEnum

import redis

from paycron.config import Config


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(self, client: redis.Redis, config: Config, clock=time.time):
        self._redis = client
        self._config = config
        self._clock = clock
        ns = f"{config.redis_namespace}:breaker"
        self._open_until = f"{ns}:open_until"
        self._probe = f"{ns}:probe"
        self._calls = f"{ns}:calls"
        self._fails = f"{ns}:fails"

    def state(self) -> BreakerState:
        raw = self._redis.get(self._open_until)
        if raw is None:
            return BreakerState.CLOSED
        return BreakerState.OPEN if self._clock() < float(raw) else BreakerState.HALF_OPEN

    def try_probe(self) -> bool:
        """Half-open: the one caller that gets True claims one row as the probe.
        The token expires with a lease, so a lost probe is retried."""
        ttl = max(1, int(self._config.lease_seconds))
        return bool(self._redis.set(self._probe, "1", nx=True, ex=ttl))

    def record(self, *, calls: int, failures: int) -> None:
        """Count a group's calls; trip the breaker when the window is bad."""
        if calls <= 0:
            return
        second = int(self._clock())
        window = self._config.circuit_window_seconds
        pipe = self._redis.pipeline(transaction=False)
        pipe.incrby(f"{self._calls}:{second}", calls)
        pipe.expire(f"{self._calls}:{second}", window + 5)
        if failures:
            pipe.incrby(f"{self._fails}:{second}", failures)
            pipe.expire(f"{self._fails}:{second}", window + 5)
        pipe.execute()
        if failures and self._window_is_bad(second, window):
            self.open()

    def _window_is_bad(self, second: int, window: int) -> bool:
        seconds = range(second - window + 1, second + 1)
        values = self._redis.mget(
            [f"{self._calls}:{s}" for s in seconds] + [f"{self._fails}:{s}" for s in seconds]
        )
        counts = [int(v or 0) for v in values]
        calls, fails = sum(counts[:window]), sum(counts[window:])
        return (
            calls >= self._config.circuit_min_calls
            and fails >= self._config.circuit_failure_ratio * calls
        )

    def open(self) -> None:
        until = self._clock() + self._config.circuit_open_seconds
        pipe = self._redis.pipeline()
        pipe.set(self._open_until, repr(until))
        pipe.delete(self._probe)
        pipe.execute()

    def close(self) -> None:
        """The probe succeeded (or an operator closed it): forget the bad window."""
        keys = [self._open_until, self._probe]
        keys += list(self._redis.scan_iter(match=f"{self._calls}:*", count=500))
        keys += list(self._redis.scan_iter(match=f"{self._fails}:*", count=500))
        self._redis.delete(*keys)

    def probe_finished(self, *, failed: bool) -> None:
        if failed:
            self.open()
        else:
            self.close()
