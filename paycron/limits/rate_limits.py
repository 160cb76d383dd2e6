"""Requests per actor: one token bucket per actor in Redis (docs/design.md).

Each request takes one token from its actor's bucket, a batch create one
per item (``token_bucket.lua``, the claim pacer's script: one round trip,
Redis's clock, so every web process shares the bucket). A charge takes all
its tokens at once or none: a batch that does not fit is refused whole,
before anything is written, and costs nothing. The bucket holds
``API_RATE_BURST`` tokens and refills at ``API_RATE_LIMIT`` per second; a
charge it cannot cover refuses with :class:`RateLimited`, whose
``retry_after`` is when it would fit. Another actor's bucket is never touched.

Availability first: when Redis cannot be asked, the request is served. The
failure is counted (``paycron_rate_limiter_errors``) and logged at most once
per :data:`LOG_EVERY_SECONDS`, and for :data:`BYPASS_SECONDS` after it the
limiter does not ask again, so a hanging Redis costs one timeout per
process per interval, not one per request.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path

import redis

from paycron.config import Config
from paycron.errors import RateLimited
from paycron.observability.metrics import RATE_LIMITER_ERRORS

log = logging.getLogger("paycron.rate_limits")

_BUCKET = (Path(__file__).parent / "token_bucket.lua").read_text()
#: After a Redis failure, requests are served unchecked this long (then it asks again).
BYPASS_SECONDS = 1.0
#: At most one warning per this many seconds, with how many failures it covers.
LOG_EVERY_SECONDS = 60.0


class ActorRateLimiter:
    def __init__(
        self, client: redis.Redis, config: Config, *, clock: Callable[[], float] = time.monotonic
    ):
        self._take = client.register_script(_BUCKET)
        self._prefix = f"{config.redis_namespace}:ratelimit:"
        self.rate = config.api_rate_limit
        self.burst = config.api_rate_burst
        self._clock = clock
        self._lock = threading.Lock()
        self._bypass_until = -math.inf
        self._logged_at = -math.inf
        self._unlogged = 0

    def charge(self, actor: str, tokens: int = 1) -> None:
        """Take ``tokens`` (a request, or a batch's items) from ``actor``'s
        bucket, all or none; :class:`RateLimited` when they are not all there."""
        if self._clock() < self._bypass_until:
            return
        try:
            granted = int(
                self._take(keys=[self._prefix + actor], args=[tokens, self.rate, self.burst, "1"])
            )
        except (redis.RedisError, OSError) as exc:
            self._failed(exc)
            return
        if granted < tokens:
            # the script answers minus the whole tokens still missing
            raise RateLimited(max(1, math.ceil(-granted / self.rate)))

    def _failed(self, exc: Exception) -> None:
        RATE_LIMITER_ERRORS.inc()
        now = self._clock()
        with self._lock:
            self._bypass_until = now + BYPASS_SECONDS
            self._unlogged += 1
            if now - self._logged_at < LOG_EVERY_SECONDS:
                return
            failures, self._unlogged, self._logged_at = self._unlogged, 0, now
        log.warning(
            "rate limiter: Redis unavailable (%s: %s); serving requests unlimited "
            "(%d failure(s) since the last warning)",
            type(exc).__name__,
            exc,
            failures,
        )
