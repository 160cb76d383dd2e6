"""Requests per actor: one token bucket per actor in Redis (docs/design.md).

Each request takes one token from its actor's bucket, a batch create one
per item (``token_bucket.lua``, the claim pacer's script: one round trip,
Redis's clock, so every web process shares the bucket). A charge takes all
its tokens at once or none: a batch that does not fit is refused whole,
before anything is written, and costs nothing. The bucket holds
``API_RATE_BURST`` tokens and refills at ``API_RATE_LIMIT`` per second; a
charge it cannot cover refuses with :class:`RateLimited`, whose
``retry_after`` is when it would fit. Another actor's bucket is never touched.

A busy actor's requests do not each pay a round trip: with the tokens it
needs, a process takes a few more for that actor's next requests (an
*allowance*: at most as many as the actor used in this process over the
last :data:`ALLOWANCE_SECONDS`, :data:`MAX_ALLOWANCE` and 2% of the burst)
and spends them locally until they run out or
:data:`ALLOWANCE_SECONDS` pass; what is left goes back to the bucket with
the process's next charge for that actor. Every token still comes from the
one bucket, so the limit holds across processes exactly as before; what an
allowance changes is that an actor at its limit may be refused by one
process while another holds a few of its tokens (at most
:data:`MAX_ALLOWANCE` per process, for at most :data:`ALLOWANCE_SECONDS`).
An actor sending a request now and then takes no allowance, and a small
bucket (under 50 tokens) never gives one.

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
from dataclasses import dataclass
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
#: How long a process spends an allowance before giving back what is left.
ALLOWANCE_SECONDS = 0.1
#: The most tokens a process takes ahead for one actor.
MAX_ALLOWANCE = 16
#: Actors with an allowance a process remembers; beyond it, expired ones are forgotten.
MAX_ACTORS = 10_000


@dataclass(eq=False)
class _Allowance:
    """Tokens this process took ahead for one actor, spendable until ``until``."""

    tokens: int
    until: float
    #: tokens the actor used here since ``since``: the size of its next allowance
    used: int
    since: float


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
        self._allowances: dict[str, _Allowance] = {}
        self._max_allowance = min(MAX_ALLOWANCE, self.burst // 50)
        #: Round trips to Redis so far (each charge not covered by an allowance).
        self.round_trips = 0

    def charge(self, actor: str, tokens: int = 1) -> None:
        """Take ``tokens`` (a request, or a batch's items) from ``actor``'s
        bucket, all or none; :class:`RateLimited` when they are not all there."""
        now = self._clock()
        if now < self._bypass_until:
            return
        with self._lock:
            held = self._allowances.get(actor)
            if held is not None and now < held.until and held.tokens >= tokens:
                held.tokens -= tokens
                held.used += tokens
                return
            returned, extra = 0, 0
            if held is not None:
                returned, held.tokens = held.tokens, 0
                if now - held.since <= 2 * ALLOWANCE_SECONDS:
                    extra = min(self._max_allowance, held.used)
        try:
            self.round_trips += 1
            granted = int(
                self._take(
                    keys=[self._prefix + actor],
                    args=[tokens, self.rate, self.burst, "1", extra, returned],
                )
            )
        except (redis.RedisError, OSError) as exc:
            self._failed(exc)
            return
        if granted < tokens:
            # the script answers minus the whole tokens still missing
            raise RateLimited(max(1, math.ceil(-granted / self.rate)))
        if self._max_allowance:
            self._keep(actor, granted - tokens, tokens, now)

    def _keep(self, actor: str, tokens: int, used: int, now: float) -> None:
        """Start ``actor``'s allowance here (``tokens`` spare, possibly none)."""
        with self._lock:
            held = self._allowances.get(actor)
            if held is not None and held.tokens:
                tokens += held.tokens  # a concurrent charge's spare (same process)
            self._allowances[actor] = _Allowance(tokens, now + ALLOWANCE_SECONDS, used, now)
            if len(self._allowances) > MAX_ACTORS:
                # forgotten with what is left of them: at most MAX_ALLOWANCE each
                self._allowances = {
                    a: held for a, held in self._allowances.items() if now < held.until
                }

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
