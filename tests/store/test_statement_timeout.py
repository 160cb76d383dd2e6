"""WEB_STATEMENT_TIMEOUT: the web pool's sessions cancel a long statement and
the request answers 503 UNAVAILABLE; no other process's sessions get one."""

from __future__ import annotations

import time
from datetime import datetime

import psycopg
import pytest

from paycron.config import Config
from paycron.sql import q
from paycron.store.db import connect, make_pool
from tests.conftest import future, iso
from tests.factories import insert_payment
from web import close_app


def statement_timeout(pool_or_conn) -> str:
    if isinstance(pool_or_conn, psycopg.Connection):
        return pool_or_conn.execute("SHOW statement_timeout").fetchone()["statement_timeout"]
    with pool_or_conn.connection() as conn:
        return statement_timeout(conn)


def test_a_statement_past_the_timeout_answers_503_not_500(config, alice, conn, database_url):
    """A cancel waits on a row another session holds locked: past the web's
    timeout (50 ms here) the statement is cancelled and the answer is 503.
    The locker's session ends itself after 2 s idle (releasing the lock), so
    without the timeout the cancel would wait for it and answer 200."""
    from web import create_app

    row = insert_payment(conn, payer="alice", status="PENDING")
    app = create_app(config.with_overrides(web_statement_timeout=0.05))
    locker = psycopg.connect(database_url)
    try:
        locker.execute("SET idle_in_transaction_session_timeout = '2s'")
        locker.execute("SELECT 1 FROM payments WHERE id = %s FOR UPDATE", (row["id"],))
        started = time.monotonic()
        response = app.test_client().delete(f"/v1/scheduled-payments/{row['id']}", headers=alice)
        elapsed = time.monotonic() - started
    finally:
        locker.close()
        close_app(app)
    assert response.status_code == 503, response.get_data(as_text=True)
    assert response.mimetype == "application/problem+json"
    assert response.get_json()["code"] == "UNAVAILABLE"
    assert elapsed < 1.5


def test_only_the_web_pool_has_a_statement_timeout(app, database_url):
    assert statement_timeout(app.extensions["paycron.pool"]) == "5s"  # the default
    assert statement_timeout(app.extensions["paycron.create_pool"]) == "5s"
    config = Config(database_url=database_url)
    with make_pool(config, name="worker") as pool:  # scheduler, workers, relay
        assert statement_timeout(pool) == "0"
    with connect(config) as conn:  # CLI, migrations
        assert statement_timeout(conn) == "0"


def test_zero_means_no_timeout(config):
    from web import create_app

    app = create_app(config.with_overrides(web_statement_timeout=0))
    try:
        assert statement_timeout(app.extensions["paycron.pool"]) == "0"
    finally:
        close_app(app)


@pytest.mark.parametrize("db_pool_max", [2, 3, 10])
def test_the_web_pools_share_db_pool_max(config, db_pool_max):
    from web import create_app

    app = create_app(config.with_overrides(db_pool_max=db_pool_max))
    try:
        sizes = [app.extensions[name].max_size for name in ("paycron.pool", "paycron.create_pool")]
    finally:
        close_app(app)
    assert sum(sizes) == db_pool_max and min(sizes) >= 1


def test_a_create_waits_once_for_the_bound_not_once_per_session(config, alice, database_url):
    """A create that writes nothing on its own session is done again on the
    usual one, within what is left of the same WEB_STATEMENT_TIMEOUT. Here
    the first try waits 0.6 s for a concurrent create of the same key, and
    the replay then waits on that key's row: the answer comes at the bound
    (1 s), not 0.6 s after it."""
    import threading

    from paycron.store import payments
    from web import create_app

    body = {"payee": "acme", "amount": 2500, "dueAt": iso(future())}
    new = payments.NewPayment(
        payee="acme",
        amount_minor=2500,
        currency="USD",
        due_at=datetime.fromisoformat(body["dueAt"]),
    )
    params = payments.creation(
        actor="alice", key="k", body_hash=payments.request_hash(body), new=new, processor="fake"
    )
    app = create_app(config.with_overrides(web_statement_timeout=1.0))
    first = psycopg.connect(database_url)
    holder = psycopg.connect(database_url)
    first.execute(q("create_payment"), params)  # uncommitted: the same key, in flight

    def commit():
        time.sleep(0.6)
        first.commit()

    def hold_the_keys():
        # Queued (by then the create's first try is waiting for the key) behind
        # the two writers of the table, this lock is granted the moment they
        # end, before the replay's write can take the table: the replay then
        # waits on it. Taking the key's row after the commit instead raced
        # the replay, and lost under load.
        time.sleep(0.3)
        holder.execute("LOCK TABLE idempotency_keys IN SHARE MODE")

    threads = [threading.Thread(target=commit), threading.Thread(target=hold_the_keys)]
    try:
        for thread in threads:
            thread.start()
        started = time.monotonic()
        response = app.test_client().post(
            "/v1/scheduled-payments", json=body, headers={**alice, "Idempotency-Key": "k"}
        )
        elapsed = time.monotonic() - started
    finally:
        for thread in threads:
            thread.join()
        holder.rollback()
        holder.close()
        first.close()
        close_app(app)
    assert response.status_code == 503, response.get_data(as_text=True)
    assert 0.9 < elapsed < 1.45, elapsed
