"""/readyz knows the migrations the code expects: pending ones are 503 with
what to do, and a request that meets a missing table answers 503 saying the
same, never a 500."""

from __future__ import annotations

import uuid

import pytest

from paycron.config import Config
from paycron.store.db import connect
from paycron.store.migrate import migrate
from tests.conftest import create_database, drop_database, future, iso
from web import close_app


@pytest.fixture
def unmigrated_app(config):
    from web import create_app

    name = f"paycron_test_unmigrated_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    app = create_app(config.with_overrides(database_url=url))
    yield app, url
    close_app(app)
    drop_database(name)


def test_pending_migrations_make_readyz_503_and_say_run_migrate(unmigrated_app):
    app, url = unmigrated_app
    client = app.test_client()
    answer = client.get("/readyz")
    assert answer.status_code == 503
    body = answer.get_json()
    assert body["checks"] == {"postgres": "ok", "redis": "ok", "schema": "pending"}
    assert "run `paycron migrate`" in body["detail"]

    with connect(Config(database_url=url)) as conn:
        migrate(conn)
    answer = client.get("/readyz")
    assert answer.status_code == 200, answer.get_json()
    assert answer.get_json()["checks"]["schema"] == "ok" and answer.get_json()["detail"] is None


def test_a_request_meeting_a_missing_table_is_503_with_the_step_not_500(unmigrated_app):
    app, _ = unmigrated_app
    answer = app.test_client().post(
        "/v1/scheduled-payments",
        json={"payee": "bob", "amount": 100, "dueAt": iso(future())},
        headers={"Authorization": "Bearer pk_nothing", "Idempotency-Key": "k1"},
    )
    assert answer.status_code == 503
    assert answer.get_json()["code"] == "SCHEMA_NOT_CURRENT"
    assert "run `paycron migrate`" in answer.get_json()["detail"]


def test_a_current_schema_is_ready(client):
    answer = client.get("/readyz")
    assert answer.status_code == 200
    assert answer.get_json()["checks"] == {"postgres": "ok", "redis": "ok", "schema": "ok"}
