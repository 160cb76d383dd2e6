"""The reaper: PROCESSING rows whose lease ran out go back to PENDING.

Guarded on status + lease + attempt (River #1302 is what an id-only guard
does); where each row goes is :func:`paycron.domain.policy.after_lease_expiry`'s
decision. The next claim re-asks the gateway with the same key, which
answers for the lost call.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from paycron.config import Config
from paycron.domain import policy
from paycron.observability import metrics
from paycron.store import transitions
from paycron.store.db import Connection, Pool
from scheduler.service import PeriodicService

log = logging.getLogger("paycron.reaper")

#: Rows per reap statement; a reaper loops while batches come back full.
REAP_BATCH = 500


def reap_batch(conn: Connection, *, limit: int, config: Config) -> list[dict]:
    """One batch: the store locks up to ``limit`` expired rows, the policy
    decides where each goes, the store writes it (one transaction); the rows
    it moved."""
    return transitions.reap_expired(
        conn,
        limit=limit,
        decide=functools.partial(policy.after_lease_expiry, config=config),
        counts=policy.counts_expiry,
        land_seconds=config.in_flight_bound_seconds,
    )


@dataclass
class ReapCounts:
    reaped: int = 0
    parked: int = 0
    in_doubt: int = 0


class Reaper(PeriodicService):
    name = "reaper"

    def __init__(self, *, config: Config, pool: Pool, batch: int = REAP_BATCH):
        self.config = config  # the policy's settings (MAX_LEASE_EXPIRIES)
        # Leases are minutes long: checking as often as the sweep is plenty.
        self.interval_seconds = config.sweep_interval_seconds
        self.pool = pool
        self.batch = batch

    def run_once(self) -> ReapCounts:
        counts = ReapCounts()
        while True:
            with self.pool.connection() as conn:
                rows = reap_batch(conn, limit=self.batch, config=self.config)
            counts.reaped += len(rows)
            counts.parked += sum(1 for r in rows if r["status"] == "FAILED")
            counts.in_doubt += sum(1 for r in rows if r["in_doubt"])
            if len(rows) < self.batch:
                break
        metrics.LEASE_EXPIRATIONS.inc(counts.reaped)
        metrics.DEAD_LETTERS.labels("LEASE_EXPIRED_REPEATEDLY").inc(counts.parked)
        if counts.reaped:
            log.warning("reaped expired leases: %s", counts)
        return counts
