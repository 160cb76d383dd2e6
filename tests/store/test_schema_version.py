"""The schema version: the code knows the migrations it expects (the files
shipped with it) and says, on one line, when the database lacks some."""

from __future__ import annotations

import logging
import threading
import uuid

import pytest

from paycron.config import Config
from paycron.store.db import connect
from paycron.store.migrate import (
    RUN_MIGRATE,
    describe_pending,
    migrate,
    migration_files,
    pending_migrations,
    wait_until_current,
)
from tests.conftest import create_database, drop_database

EXPECTED = [path.name for path in migration_files()]


@pytest.fixture
def empty_database():
    name = f"paycron_test_empty_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    yield url
    drop_database(name)


def test_a_database_never_migrated_lacks_every_migration(empty_database):
    with connect(Config(database_url=empty_database)) as conn:
        assert pending_migrations(conn) == EXPECTED
        migrate(conn)
        assert pending_migrations(conn) == []


def test_a_database_behind_the_code_lacks_exactly_the_unapplied_ones(empty_database):
    with connect(Config(database_url=empty_database)) as conn:
        migrate(conn)
        conn.execute("DELETE FROM schema_migrations WHERE name = %s", (EXPECTED[-1],))
        assert pending_migrations(conn) == [EXPECTED[-1]]


def test_a_database_ahead_of_the_code_is_current_for_it(conn):
    conn.execute("INSERT INTO schema_migrations (name) VALUES ('999_from_newer_code.sql')")
    try:
        assert pending_migrations(conn) == []
    finally:
        conn.execute("DELETE FROM schema_migrations WHERE name = '999_from_newer_code.sql'")


def test_the_line_names_the_first_missing_one_and_the_command():
    line = describe_pending(["010_console.sql", "011_awaiting_gateway.sql"])
    assert "010_console.sql and 1 more" in line and line.endswith(RUN_MIGRATE)
    assert "\n" not in line


def test_waiting_says_so_once_per_check_and_ends_when_current(caplog):
    answers = iter([["011_x.sql"], ["011_x.sql"], []])
    with caplog.at_level(logging.WARNING):
        assert wait_until_current(
            lambda: next(answers), threading.Event(), log=logging.getLogger("t"), interval=0
        )
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("run `paycron migrate`" in line for line in lines)


def test_waiting_ends_when_the_process_is_told_to_stop():
    stop = threading.Event()
    stop.set()
    assert not wait_until_current(
        lambda: ["011_x.sql"], stop, log=logging.getLogger("t"), interval=60
    )
