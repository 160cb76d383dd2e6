"""Ordered SQL migrations, each applied exactly once, under an advisory lock.

Two ``paycron migrate`` runs at the same time are safe: the second waits on
the lock, then finds every file already recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
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
