"""Claim pacing: one token bucket in Redis shared by every scheduler.

N schedulers together claim no faster than the gateway can be called: the
bucket refills at ``GATEWAY_RATE_LIMIT`` per second and holds at most what
the workers can call in a quarter of a lease, so a claimed row is called
long before its lease runs out.
"""

from __future__ import annotations

from pathlib import Path

import redis

from paycron.config import Config

_SCRIPT = (Path(__file__).parent / "token_bucket.lua").read_text()


class ClaimPacer:
    def __init__(self, client: redis.Redis, config: Config):
        self._take = client.register_script(_SCRIPT)
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
