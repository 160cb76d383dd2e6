"""The sweep: claim due rows, commit, then enqueue them.

Any number of sweepers run at once with no leader: ``FOR UPDATE SKIP
LOCKED`` hands each a disjoint batch. The sweep drains while batches come
back full, paced by one token bucket in Redis shared by every scheduler,
and keeps no more work queued than the workers can call in a quarter of a
lease. While the circuit breaker is open it claims nothing; half-open, the
one sweeper that wins the probe token claims the single oldest due row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from psycopg_pool import ConnectionPool

from paycron import metrics
from paycron.breaker import BreakerState, CircuitBreaker
from paycron.config import Config
from paycron.pacing import ClaimPacer
from paycron.transitions import Claim, claim_due

log = logging.getLogger("paycron.sweeper")

#: enqueue(claims, probe) sends one message for a group of claims.
Enqueue = Callable[[Sequence[Claim], bool], None]


@dataclass
class SweepCounts:
    claimed: int = 0
    messages: int = 0
    batches: int = 0
    probe: bool = False
    breaker: str = BreakerState.CLOSED.value


class Sweeper:
    def __init__(self, *, config: Config, pool: ConnectionPool, pacer: ClaimPacer,
                 breaker: CircuitBreaker, enqueue: Enqueue,
                 queued_claims: Callable[[], int] = lambda: 0):
        self.config = config
        self.pool = pool
        self.pacer = pacer
        self.breaker = breaker
        self.enqueue = enqueue
        self.queued_claims = queued_claims
        self.stopping = False

    def _send(self, claims: Sequence[Claim], counts: SweepCounts, probe: bool = False) -> None:
        size = self.config.group_size
        for i in range(0, len(claims), size):
            self.enqueue(claims[i:i + size], probe)
            counts.messages += 1

    def run_once(self) -> SweepCounts:
        counts = SweepCounts()
        state = self.breaker.state()
        counts.breaker = state.value
        if state is BreakerState.OPEN:
            return counts
        if state is BreakerState.HALF_OPEN:
            if self.breaker.try_probe():
                with self.pool.connection() as conn:
                    claims = claim_due(conn, limit=1, lease_seconds=self.config.lease_seconds)
                if claims:
                    metrics.CLAIMS.inc(len(claims))
                    self._send(claims, counts, probe=True)
                    counts.claimed, counts.probe = 1, True
                else:  # nothing due: no evidence either way, so close
                    self.breaker.close()
            return counts
        room = self.pacer.capacity - self.queued_claims()
        while not self.stopping and room > 0:
            granted = self.pacer.take(min(self.config.claim_batch, room))
            if granted == 0:
                break
            with self.pool.connection() as conn:
                claims = claim_due(conn, limit=granted, lease_seconds=self.config.lease_seconds)
            # Committed: from here a crash leaves leased rows for the reaper.
            metrics.CLAIMS.inc(len(claims))
            self.pacer.give_back(granted - len(claims))
            self._send(claims, counts)
            counts.claimed += len(claims)
            counts.batches += 1
            room -= len(claims)
            if len(claims) < granted:
                break
        return counts

    def run(self, *, interval: float | None = None) -> None:
        interval = self.config.sweep_interval_seconds if interval is None else interval
        while not self.stopping:
            counts = self.run_once()
            if counts.claimed:
                log.info("sweep claimed=%d messages=%d batches=%d", counts.claimed,
                         counts.messages, counts.batches)
            time.sleep(interval)
