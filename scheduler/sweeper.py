"""The sweep: claim due rows fairly across payers, commit, then enqueue them.

Any number of sweepers run at once with no leader: ``FOR UPDATE SKIP
LOCKED`` hands each a disjoint batch. The sweep drains while batches claim
anything, paced by one token bucket in Redis shared by every scheduler, and
keeps only CLAIM_AHEAD_SECONDS of the ceiling queued beyond what is in
flight: a deeper queue is a FIFO again, and a payer that falls due later
would wait behind it (docs/design.md). The room left is counted and claimed under one lock
shared by every sweeper (``lock_claim_room``), so concurrent sweeps never
each fill the same room. When the queue is full it looks again shortly
rather than after a whole interval. While the circuit breaker is
open it claims nothing; half-open, the one sweeper that wins the probe token
claims the single oldest due row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from psycopg_pool import ConnectionPool

from paycron.config import Config
from paycron.limits.breaker import BreakerState, CircuitBreaker
from paycron.limits.pacing import ClaimPacer
from paycron.observability import metrics
from paycron.store.partitions import live_bound
from paycron.store.transitions import (
    ENQUEUE_FAILED,
    Claim,
    claim_due,
    claim_within_room,
    count_queued,
    next_due_wait,
    release,
)
from scheduler.service import PeriodicService
from scheduler.wake import DueWake

log = logging.getLogger("paycron.sweeper")

#: Claims queued beyond those in flight: about this many seconds of the ceiling.
CLAIM_AHEAD_SECONDS = 2.0
#: With the queue full (or the pace spent), the sweep looks again this soon.
PACED_RECHECK_SECONDS = 0.2

#: The shortest sleep before a known run_at (timer and clock slack).
MIN_WAIT_SECONDS = 0.002

#: enqueue(claims, probe) sends one message for a group of claims.
Enqueue = Callable[[Sequence[Claim], bool], None]


@dataclass(frozen=True)
class SweepSettings:
    """What the sweep reads of the configuration (validated by :class:`Config`)."""

    interval_seconds: float
    claim_batch: int
    lease_seconds: float
    group_size: int
    claim_ahead: int  # claims queued beyond those in flight, at most
    processor: str = "fake"  # payments first called elsewhere are not claimed
    prompt_start: bool = True  # wake at the next known run_at (and on notifications)

    @classmethod
    def from_config(cls, config: Config) -> SweepSettings:
        return cls(
            interval_seconds=config.sweep_interval_seconds,
            claim_batch=config.claim_batch,
            lease_seconds=config.lease_seconds,
            group_size=config.group_size,
            claim_ahead=max(1, round(config.gateway_rate_limit * CLAIM_AHEAD_SECONDS)),
            processor=config.gateway,
            prompt_start=config.prompt_start,
        )


@dataclass
class SweepCounts:
    claimed: int = 0
    messages: int = 0
    batches: int = 0
    probe: bool = False
    breaker: str = BreakerState.CLOSED.value
    paced: bool = False  # stopped by the queue bound or the pace, not by a drained schedule
    next_due: float | None = None  # seconds until the next known run_at within the interval


class Sweeper(PeriodicService):
    name = "sweeper"

    def __init__(
        self,
        *,
        settings: SweepSettings,
        pool: ConnectionPool,
        pacer: ClaimPacer,
        breaker: CircuitBreaker,
        enqueue: Enqueue,
        wake: DueWake | None = None,
    ):
        self.settings = settings
        self.interval_seconds = settings.interval_seconds
        self.pool = pool
        self.pacer = pacer
        self.breaker = breaker
        self.enqueue = enqueue
        self.wake = wake

    def wait_after(self, counts: SweepCounts) -> float:
        if counts.paced:
            return PACED_RECHECK_SECONDS
        if counts.next_due is not None:
            return min(self.interval_seconds, max(MIN_WAIT_SECONDS, counts.next_due))
        return self.interval_seconds

    def sleep(self, stop, seconds: float) -> None:
        """Until the next known run_at or the interval, or a create's
        notification of a payment due sooner, whichever comes first."""
        if self.wake is None:
            stop.wait(seconds)
        else:
            self.wake.wait(seconds)

    def _send(self, claims: Sequence[Claim], counts: SweepCounts, probe: bool = False) -> None:
        size = self.settings.group_size
        for i in range(0, len(claims), size):
            try:
                self.enqueue(claims[i : i + size], probe)
            except Exception:
                # The broker refused, or its reply was lost after it took the
                # message: hand back what was not started (no budget, no lease
                # to wait out; a claim a worker already started is left to
                # it), then let the run fail as it would.
                release(self.pool, claims[i:], reason=ENQUEUE_FAILED)
                raise
            counts.messages += 1

    def _claim(self, limit: int, live_from: datetime | None = None) -> list[Claim]:
        with self.pool.connection() as conn:
            claims = claim_due(
                conn,
                limit=limit,
                lease_seconds=self.settings.lease_seconds,
                processor=self.settings.processor,
                live_from=live_from,
            )
        # Committed: from here a crash leaves leased rows for the reaper.
        metrics.CLAIMS.inc(len(claims))
        return claims

    def _claim_within_room(
        self, limit: int, live_from: datetime | None = None
    ) -> tuple[list[Claim], int]:
        """Up to ``limit`` claims within the queue's room, and that room
        (counted and claimed under the lock every sweeper takes)."""
        with self.pool.connection() as conn:
            claims, room = claim_within_room(
                conn,
                limit=limit,
                claim_ahead=self.settings.claim_ahead,
                lease_seconds=self.settings.lease_seconds,
                processor=self.settings.processor,
                live_from=live_from,
            )
        # Committed (and the lock released): a crash leaves leases to the reaper.
        metrics.CLAIMS.inc(len(claims))
        return claims, room

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
        # What is queued, from Postgres (the schedule of record), not from
        # the broker's private layout: a first look sizes the pace's tokens;
        # the room is counted again, under the lock, with each claim.
        with self.pool.connection() as conn:
            # Read once per run: every claim of the run prunes with it.
            live_from = live_bound(conn)
            room = self.settings.claim_ahead - count_queued(conn, live_from)
        counts.paced = True
        while room > 0:
            granted = self.pacer.take(min(self.settings.claim_batch, room))
            if granted == 0:
                break
            claims, room = self._claim_within_room(granted, live_from)
            self.pacer.give_back(granted - len(claims))
            self._send(claims, counts)
            counts.claimed += len(claims)
            counts.batches += 1
            # A short batch may only mean some payer had less than its fair
            # share: go on until a batch claims nothing. One that claims
            # nothing for want of room (another sweep filled it) is paced.
            if not claims:
                counts.paced = room <= 0
                break
            room -= len(claims)
        if not counts.paced and self.settings.prompt_start:
            with self.pool.connection() as conn:
                counts.next_due = next_due_wait(
                    conn, within=self.interval_seconds, live_from=live_from
                )
        if counts.claimed:
            log.info("sweep %s", counts)
        return counts
