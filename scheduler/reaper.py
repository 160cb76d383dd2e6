"""The reaper: PROCESSING rows whose lease ran out go back to PENDING.

Guarded on status + lease + attempt (River #1302 is what an id-only guard
does); where each row goes is :func:`paycron.domain.policy.after_lease_expiry`'s
decision. The next claim re-asks the gateway with the same key, which
answers for the lost call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from psycopg_pool import ConnectionPool

from paycron.config import Config
from paycron.observability import metrics
from paycron.store.transitions import reap_expired
from scheduler.service import PeriodicService

log = logging.getLogger("paycron.reaper")

#: Rows per reap statement; a reaper loops while batches come back full.
REAP_BATCH = 500


@dataclass
class ReapCounts:
    reaped: int = 0
    parked: int = 0
    in_doubt: int = 0


class Reaper(PeriodicService):
    name = "reaper"

    def __init__(self, *, config: Config, pool: ConnectionPool, batch: int = REAP_BATCH):
        self.config = config  # the policy's settings (MAX_LEASE_EXPIRIES)
        # Leases are minutes long: checking as often as the sweep is plenty.
        self.interval_seconds = config.sweep_interval_seconds
        self.pool = pool
        self.batch = batch

    def run_once(self) -> ReapCounts:
        counts = ReapCounts()
        while True:
            with self.pool.connection() as conn:
                rows = reap_expired(conn, limit=self.batch, config=self.config)
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
