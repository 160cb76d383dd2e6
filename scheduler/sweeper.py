"""The sweep: claim due rows, commit, then enqueue them.

Any number of sweepers run at once with no leader: ``FOR UPDATE SKIP
LOCKED`` hands each a disjoint batch. The sweep drains while batches come
back full, paced by one token bucket in Redis shared by every scheduler,
and keeps no more work claimed and unfinished than the workers can call in
a quarter of a lease. While the circuit breaker is open it claims nothing;
half-open, the one sweeper that wins the probe token claims the single
oldest due row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from psycopg_pool import ConnectionPool

from paycron import metrics
from paycron.breaker import BreakerState, CircuitBreaker
from paycron.config import Config
from paycron.pacing import ClaimPacer
from paycron.transitions import Claim, claim_due, count_unfinished
from scheduler.service import PeriodicService

log = logging.getLogger("paycron.sweeper")

#: enqueue(claims, probe) sends one message for a group of claims.
Enqueue = Callable[[Sequence[Claim], bool], None]


@dataclass(frozen=True)
class SweepSettings:
    """What the sweep reads of the configuration (validated by :class:`Config`)."""

    interval_seconds: float
    claim_batch: int
    lease_seconds: float
    group_size: int

    @classmethod
    def from_config(cls, config: Config) -> SweepSettings:
        return cls(interval_seconds=config.sweep_interval_seconds,
                   claim_batch=config.claim_batch, lease_seconds=config.lease_seconds,
                   group_size=config.group_size)


@dataclass
class SweepCounts:
    claimed: int = 0
    messages: int = 0
    batches: int = 0
    probe: bool = False
    breaker: str = BreakerState.CLOSED.value


class Sweeper(PeriodicService):
    name = "sweeper"

    def __init__(self, *, settings: SweepSettings, pool: ConnectionPool, pacer: ClaimPacer,
                 breaker: CircuitBreaker, enqueue: Enqueue):
        self.settings = settings
        self.interval_seconds = settings.interval_seconds
        self.pool = pool
        self.pacer = pacer
        self.breaker = breaker
        self.enqueue = enqueue

    def _send(self, claims: Sequence[Claim], counts: SweepCounts, probe: bool = False) -> None:
        size = self.settings.group_size
        for i in range(0, len(claims), size):
            self.enqueue(claims[i:i + size], probe)
            counts.messages += 1

    def _claim(self, limit: int) -> list[Claim]:
        with self.pool.connection() as conn:
            claims = claim_due(conn, limit=limit, lease_seconds=self.settings.lease_seconds)
        # Committed: from here a crash leaves leased rows for the reaper.
        metrics.CLAIMS.inc(len(claims))
        return claims

    def run_once(self) -> SweepCounts:
        counts = SweepCounts()
        state = self.breaker.state()
        counts.breaker = state.value
        if state is BreakerState.OPEN:
            return counts
        if state is BreakerState.HALF_OPEN:
            if self.breaker.try_probe():
                claims = self._claim(1)
                if claims:
                    self._send(claims, counts, probe=True)
                    counts.claimed, counts.probe = 1, True
                else:  # nothing due: no evidence either way, so close
                    self.breaker.close()
            return counts
        # Claimed and not yet finished (queued or in flight), from Postgres:
        # the schedule of record, not the broker's private layout.
        with self.pool.connection() as conn:
            room = self.pacer.capacity - count_unfinished(conn)
        while room > 0:
            granted = self.pacer.take(min(self.settings.claim_batch, room))
            if granted == 0:
                break
            claims = self._claim(granted)
            self.pacer.give_back(granted - len(claims))
            self._send(claims, counts)
            counts.claimed += len(claims)
            counts.batches += 1
            room -= len(claims)
            if len(claims) < granted:
                break
        if counts.claimed:
            log.info("sweep %s", counts)
        return counts
