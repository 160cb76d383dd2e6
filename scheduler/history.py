"""The history roller: keeps ``history_minutes`` (the console's 1 h / 24 h /
7 d charts) rolled up from attempts and dead letters, and its retention
bounded (docs/console.md, "History"). Every scheduler runs one; an
advisory lock lets one roll at a time, and a roll is a recomputation, so a
crash or a second roller never double counts (``paycron.store.history``)."""

from __future__ import annotations

from datetime import timedelta

from psycopg_pool import ConnectionPool

from paycron.config import Config
from paycron.errors import ConfigError
from paycron.store import history
from paycron.store.history import RollupCounts
from scheduler.service import PeriodicService

#: A minute is rolled within this long of its end: the charts' freshest
#: point is at most a minute and this old.
ROLLUP_INTERVAL_SECONDS = 15.0


class HistoryRoller(PeriodicService):
    name = "history-roller"
    interval_seconds = ROLLUP_INTERVAL_SECONDS

    def __init__(
        self,
        *,
        pool: ConnectionPool,
        retention: timedelta = history.DEFAULT_RETENTION,
        settle: timedelta = history.DEFAULT_SETTLE,
        batch_minutes: int = history.DEFAULT_BATCH_MINUTES,
    ):
        if retention < timedelta(days=7):
            raise ConfigError("the history keeps at least 7 days: the console charts a week")
        if batch_minutes < 1:
            raise ConfigError("the history roller's batch is at least one minute")
        self.pool = pool
        self.retention, self.settle, self.batch_minutes = retention, settle, batch_minutes

    @classmethod
    def from_config(cls, config: Config, *, pool: ConnectionPool) -> HistoryRoller:
        """A minute settles once its calls' leases can have run out twice."""
        settle = max(history.DEFAULT_SETTLE, timedelta(seconds=2 * config.lease_seconds))
        return cls(pool=pool, settle=settle)

    def run_once(self) -> RollupCounts:
        with self.pool.connection() as conn:
            return history.roll_up_pending(
                conn,
                retention=self.retention,
                settle=self.settle,
                batch_minutes=self.batch_minutes,
            )
