"""The database's clock, for comparing times the database wrote.

``calls_land_by`` and ``in_doubt_since`` are written with Postgres's
``now()``; deciding whether a lookup's *none* is conclusive, or whether a
processor may have forgotten a key, compares them with "now" — which must
be the database's, not an app host's: a host whose clock runs ten minutes
fast would take a *none* as conclusive ten minutes early, inside the settle
margin, and move the key while a call can still land.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from paycron.sql import q
from paycron.store.db import Connection, Pool

#: The database's clock is read again after this long; in between it is
#: carried forward on this host's monotonic clock (which drifts by
#: microseconds per minute, and never jumps as a wall clock may).
DEFAULT_REFRESH_SECONDS = 30.0


def database_now(conn: Connection) -> datetime:
    """The database's clock, now (aware UTC)."""
    row = conn.execute(q("database_now")).fetchone()
    assert row is not None  # a SELECT of one value returns one row
    return row["now"]


class DatabaseClock:
    """The database's clock for a process that compares often (the executor):
    read from Postgres at most every ``refresh_seconds`` and carried forward
    on the monotonic clock. The reading is taken as of the answer's arrival,
    so it errs early — on the side of "not yet conclusive"."""

    def __init__(
        self,
        pool: Pool,
        *,
        refresh_seconds: float = DEFAULT_REFRESH_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self._pool = pool
        self._refresh = refresh_seconds
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._read: tuple[datetime, float] | None = None

    def now(self) -> datetime:
        with self._lock:
            if self._read is None or self._monotonic() - self._read[1] > self._refresh:
                with self._pool.connection() as conn:
                    self._read = (database_now(conn), self._monotonic())
            at, read_at = self._read
            return at + timedelta(seconds=self._monotonic() - read_at)
