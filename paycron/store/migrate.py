"""Ordered SQL migrations, each applied exactly once, under an advisory lock.

Two ``paycron migrate`` runs at the same time are safe: the second waits on
the lock, then finds every file already recorded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from paycron.sql import q
from paycron.store.db import Connection

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
#: Arbitrary but fixed: the advisory lock key every migrate run shares.
MIGRATE_LOCK_KEY = 0x70617963  # "payc"


def migration_files(directory: Path = MIGRATIONS_DIR) -> list[Path]:
    return sorted(directory.glob("[0-9][0-9][0-9]_*.sql"))


@contextmanager
def schema_lock(conn: Connection) -> Iterator[None]:
    """Serialize DDL (migrations, partition creation) across processes.

    Even ``CREATE TABLE IF NOT EXISTS`` races with itself in Postgres (a
    unique violation in the catalog), so every schema change takes it.
    """
    conn.execute(q("lock_migrations"), {"key": MIGRATE_LOCK_KEY})
    try:
        yield
    finally:
        conn.execute(q("unlock_migrations"), {"key": MIGRATE_LOCK_KEY})


def migrate(conn: Connection, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply the pending migrations; returns the names applied by this call."""
    applied: list[str] = []
    with schema_lock(conn):
        conn.execute(q("migrations_table"))
        done = {row["name"] for row in conn.execute(q("applied_migrations"))}
        for path in migration_files(directory):
            if path.name in done:
                continue
            with conn.transaction():
                conn.execute(path.read_text())
                conn.execute(q("record_migration"), {"name": path.name})
            applied.append(path.name)
    return applied


#: The one line every process says when its schema is behind its code.
RUN_MIGRATE = "run `paycron migrate`"


def pending_migrations(conn: Connection, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """The migrations this code expects (the files shipped with it) that the
    database has not applied, oldest first. Empty: the schema is current
    (a database migrated by newer code is current for this code too)."""
    expected = [path.name for path in migration_files(directory)]
    ledger = conn.execute(q("migrations_table_exists")).fetchone()
    if ledger is None or not ledger["present"]:
        return expected
    done = {row["name"] for row in conn.execute(q("applied_migrations"))}
    return [name for name in expected if name not in done]


def describe_pending(pending: list[str]) -> str:
    """One line for a log or an answer: how many, the first of them, what to do."""
    first = pending[0] if pending else "-"
    more = f" and {len(pending) - 1} more" if len(pending) > 1 else ""
    return f"database schema is behind this code ({first}{more} not applied): {RUN_MIGRATE}"


#: How often a process whose schema is behind looks again (and says so once).
SCHEMA_WAIT_SECONDS = 10.0


def wait_until_current(
    pending: Callable[[], list[str]],
    stop: threading.Event,
    *,
    log: logging.Logger,
    interval: float = SCHEMA_WAIT_SECONDS,
) -> bool:
    """Return True once ``pending()`` is empty; until then log one line per
    ``interval`` (how far behind, and ``paycron migrate``). False when ``stop``
    is set first. The scheduler and the workers start this way, so a deploy
    whose release step has not run yet waits for it instead of failing every
    statement."""
    while True:
        missing = pending()
        if not missing:
            return True
        log.warning("%s; waiting (checking every %gs)", describe_pending(missing), interval)
        if stop.wait(interval):
            return False
