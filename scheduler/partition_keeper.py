"""Partition upkeep: day partitions exist for the whole horizon, and days
older than ``PARTITION_RETENTION_DAYS`` are detached once fully settled."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from psycopg_pool import ConnectionPool

from paycron.config import Config
from paycron.store.partitions import (
    days_ahead,
    detach_settled,
    ensure_partitions,
    raise_live_bound,
)
from scheduler.service import PeriodicService

log = logging.getLogger("paycron.partitions")

#: Partitions are checked hourly: the horizon has a week of margin.
KEEPER_INTERVAL_SECONDS = 3600.0


@dataclass
class KeeperCounts:
    created: int = 0
    detached: int = 0
    days_ahead: int = 0
    live_from: datetime | None = None  # the live bound after the run


class PartitionKeeper(PeriodicService):
    name = "partition-keeper"
    interval_seconds = KEEPER_INTERVAL_SECONDS

    def __init__(self, *, config: Config, pool: ConnectionPool):
        self.config = config  # horizon, margin and retention
        self.pool = pool

    def run_once(self) -> KeeperCounts:
        with self.pool.connection() as conn:
            created = ensure_partitions(conn, self.config)
            detached = detach_settled(conn, self.config)
            ahead = days_ahead(conn)
            # Claims prune every settled day below it at plan time.
            live_from = raise_live_bound(conn)
        if created or detached:
            log.info("partitions created=%s detached=%s", created, detached)
        return KeeperCounts(
            created=len(created), detached=len(detached), days_ahead=ahead, live_from=live_from
        )
