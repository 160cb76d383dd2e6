"""Pacing to the gateway's rate, shared through Redis by every process.

:class:`ClaimPacer` — one token bucket shared by every scheduler: N
schedulers together claim no faster than the gateway can be called. It
refills at ``GATEWAY_RATE_LIMIT`` per second and holds at most what the
workers can call in a quarter of a lease, so a claimed row is called long
before its lease runs out.

:class:`CallLimiter` — every worker's gateway calls together stay within
``GATEWAY_RATE_LIMIT`` per wall-clock second (the window processors
publish). A worker blocks for a token rather than failing, so a rate limit
never burns a retry or drops a message.
"""

from __future__ import annotations

import time
from pathlib import Path

import redis

from paycron.config import Config

_BUCKET = (Path(__file__).parent / "token_bucket.lua").read_text()
_WINDOW = (Path(__file__).parent / "call_window.lua").read_text()


class ClaimPacer:
    def __init__(self, client: redis.Redis, config: Config):
        self._take = client.register_script(_BUCKET)
        self._key = f"{config.redis_namespace}:pacing:claims"
        self.rate = config.gateway_rate_limit
        self.capacity = max(1, int(config.gateway_rate_limit * config.lease_seconds / 4))

    def take(self, want: int) -> int:
        """Up to ``want`` claim tokens, possibly 0."""
        if want <= 0:
            return 0
        return int(self._take(keys=[self._key], args=[want, self.rate, self.capacity]))

    def give_back(self, unused: int) -> None:
        """Return tokens a claim did not use (fewer rows were due than granted)."""
        if unused > 0:
            self._take(keys=[self._key], args=[-unused, self.rate, self.capacity])


def _sleep(seconds: float) -> None:
    # ``time.sleep`` looked up at each call, never bound at import: gunicorn's
    # master imports this module before its gevent worker patches ``time``,
    # and the unpatched sleep would stop every greenlet of the worker.
    time.sleep(seconds)


class CallLimiter:
    def __init__(self, client: redis.Redis, config: Config, sleep=None, clock=time.monotonic):
        self._take = client.register_script(_WINDOW)
        self._key = f"{config.redis_namespace}:pacing:calls"
        self.limit = config.gateway_rate_limit
        self._sleep = sleep or _sleep
        self._clock = clock

    def acquire_some(self, want: int, *, within: float | None = None) -> int:
        """Block until at least one of ``want`` calls fits in the window;
        return how many were granted (at most ``want``). With ``within``
        (seconds), wait no longer than that: 0 when no call fitted in time."""
        until = None if within is None else self._clock() + within
        while True:
            granted, wait_ms = self._take(keys=[self._key], args=[want, self.limit])
            if int(granted) > 0:
                return int(granted)
            pause = int(wait_ms) / 1000
            if until is not None:
                left = until - self._clock()
                if left <= pause:
                    return 0
            self._sleep(pause)
