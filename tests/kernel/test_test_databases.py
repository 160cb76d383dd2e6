"""A test process's database is a copy of today's template (tests/conftest.py):
migrated and partitioned as a fresh build would be, rebuilt when the
migrations change, and earlier days' templates are dropped."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime

import psycopg

from paycron.config import Config
from paycron.store import partitions
from paycron.store.db import connect
from paycron.store.migrate import migration_files, pending_migrations
from tests.conftest import (
    ADMIN_DSN,
    _drop_templates_before,
    create_migrated_database,
    drop_database,
    template_name,
)


def test_a_copy_is_migrated_and_has_every_partition(database_url):
    name = f"paycron_test_copy_{uuid.uuid4().hex[:8]}"
    url = create_migrated_database(name)
    try:
        config = Config(database_url=url)
        with connect(config) as conn:
            assert pending_migrations(conn) == []
            assert partitions.ensure_partitions(conn, config) == []  # none missing
    finally:
        drop_database(name)


def test_the_template_is_the_days_and_the_schemas(monkeypatch):
    today = datetime.now(UTC).date()
    assert template_name(today) != template_name(date(2001, 1, 1))
    before = template_name(today)
    monkeypatch.setattr("tests.conftest.migration_files", lambda: migration_files()[:-1])
    assert template_name(today) != before


def test_earlier_days_templates_are_dropped_and_todays_kept(database_url):
    today = datetime.now(UTC).date()
    old = f"paycron_template_20010101_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{old}"')
        try:
            _drop_templates_before(admin, today)
            names = {r[0] for r in admin.execute("SELECT datname FROM pg_database")}
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{old}"')
    assert old not in names
    assert template_name(today) in names  # this run's, made for database_url
