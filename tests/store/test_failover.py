"""Surviving a database failover (docs/operations.md), mechanism by mechanism, on a
private primary with a synchronous standby (bench.servers.ReplicatedPostgres:
the system's PostgreSQL binaries, as the ``postgres`` user). The whole
system through a failover is bench/failover.py (``--short`` in
tests/processes/test_failover_short.py)."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from bench.servers import ReplicatedPostgres
from paycron.config import Config
from paycron.store import apikeys
from paycron.store.db import CONNINFO_DEFAULTS, connect, connection_kwargs, make_pool
from paycron.store.migrate import migrate
from paycron.store.partitions import ensure_partitions
from web import close_app

#: The web's bound on a write, its commit's wait for the standby included.
BOUND = 0.5


def _start_pair() -> ReplicatedPostgres:
    pair = ReplicatedPostgres(synchronous=True)
    pair.start()
    config = Config(database_url=pair.url, horizon_days=2)  # few partitions: a fast set-up
    with connect(config) as conn:
        migrate(conn)
        ensure_partitions(conn, config)
    return pair


@pytest.fixture(scope="module")
def pair():
    """A primary with a synchronous standby, shared by the tests that only
    stop and restart the standby (each leaves it streaming again)."""
    servers = _start_pair()
    yield servers
    servers.destroy()


@pytest.fixture
def fresh_pair():
    """A pair of its own, for a test that kills the primary."""
    servers = _start_pair()
    yield servers
    servers.destroy()


@contextlib.contextmanager
def standby_down(pair: ReplicatedPostgres):
    """The standby is dead in the block (a test may start it again itself);
    streaming again after it, for the next test."""
    pair.stop_standby()
    try:
        yield
    finally:
        if pair.standby.postmaster_pid() is None:
            pair.start_standby()


def _app(config: Config, url: str):
    from web import create_app

    return create_app(config.with_overrides(database_url=url, web_statement_timeout=BOUND))


def _key(url: str, actor: str) -> dict:
    with connect(Config(database_url=url)) as conn:
        key, _ = apikeys.create_api_key(conn, actor)
    return {"Authorization": f"Bearer {key}"}


def _body(payee: str) -> dict:
    due = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    return {"payee": payee, "amount": 1250, "dueAt": due.isoformat()}


def _count(url: str, payee: str) -> int:
    with connect(Config(database_url=url)) as conn:
        return conn.execute(
            "SELECT count(*) AS n FROM payments WHERE payee = %s AND due_at"
            " BETWEEN now() AND now() + interval '2 hours'",
            (payee,),
        ).fetchone()["n"]


def _in_thread(call, timeout: float):
    """``call()``'s result, or the thread still running after ``timeout``."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", call()), daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(timeout)
    return thread, result, time.monotonic() - started


# -- the URL ------------------------------------------------------------------------


def test_a_database_url_gets_failover_defaults_it_does_not_set_itself():
    kwargs = connection_kwargs(database_url="postgresql://u@a:5432,b:5433/db?connect_timeout=9")
    assert kwargs["target_session_attrs"] == "read-write"
    assert "connect_timeout" not in kwargs  # the URL's own 9 s stands
    assert {k: kwargs[k] for k in CONNINFO_DEFAULTS if k != "connect_timeout"} == {
        k: v for k, v in CONNINFO_DEFAULTS.items() if k != "connect_timeout"
    }
    own = connection_kwargs(database_url="postgresql://u@a/db?target_session_attrs=any")
    assert "target_session_attrs" not in own


# -- a lost standby: commits wait -------------------------------------------------------


def test_a_statement_timeout_never_bounds_a_commit_wait(pair):
    """Why the web bounds a write itself: Postgres stops a session's
    statement_timeout before it commits, so a commit waiting for a lost
    synchronous standby outlives any statement_timeout (here 0.2 s)."""
    with psycopg.connect(pair.url, autocommit=True, options="-c statement_timeout=200") as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS waits (n int)")
        with standby_down(pair):
            thread, result, _ = _in_thread(
                lambda: conn.execute("INSERT INTO waits VALUES (1)"), 1.5
            )
            assert thread.is_alive(), "the commit did not wait for the standby"
            pair.start_standby()
            thread.join(10)
        assert not thread.is_alive() and "value" in result


def test_engine_sessions_wait_out_a_lost_standby_and_never_cut_the_wait(pair):
    """The sweeper's and workers' pools: no statement timeout whatever the
    database's default, no bound of their own. A commit waits until a standby
    is back, then succeeds with no warning (nothing committed on the primary
    alone)."""
    with connect(Config(database_url=pair.url)) as admin:
        admin.execute("CREATE TABLE IF NOT EXISTS waits (n int)")
        admin.execute("ALTER DATABASE paycron SET statement_timeout = '200ms'")
    try:
        config = Config(database_url=pair.url, db_pool_max=2)
        with make_pool(config, name="worker") as pool, pool.connection() as conn:
            assert conn.execute("SHOW statement_timeout").fetchone()["statement_timeout"] == "0"
            warnings = []
            conn.add_notice_handler(lambda d: warnings.append(d.message_primary))
            with standby_down(pair):
                thread, result, _ = _in_thread(
                    lambda: conn.execute("INSERT INTO waits VALUES (2) RETURNING n").fetchone(),
                    2 * BOUND + 1,
                )
                assert thread.is_alive(), "the engine's commit did not wait for the standby"
                pair.start_standby()
                thread.join(10)
            assert result.get("value") == {"n": 2} and warnings == []
    finally:
        with connect(Config(database_url=pair.url)) as admin:
            admin.execute("ALTER DATABASE paycron RESET statement_timeout")


def test_a_create_whose_commit_wait_passes_its_bound_answers_503_outcome_unknown(config, pair):
    """The create commits on the primary, waits for the lost standby, and is
    cut at the bound: 503 OUTCOME_UNKNOWN, not a 201 that one more failure
    could make a lie. The row is there (a cancelled wait does not undo the
    commit). A retry with the same key while the standby is still down
    answers 503 again (a replay answers only what the standby holds); once
    the standby is back the retry returns that same payment, and there is
    one payment for the key."""
    app = _app(config, pair.url)
    alice = _key(pair.url, "alice")
    try:
        with standby_down(pair):
            _outcome_unknown_then_replayed(pair, app.test_client(), alice)
    finally:
        close_app(app)


def _outcome_unknown_then_replayed(pair: ReplicatedPostgres, client, alice: dict) -> None:
    payee = f"outcome-{uuid.uuid4().hex[:8]}"
    headers, body = {**alice, "Idempotency-Key": payee}, _body(payee)

    def create():
        return client.post("/v1/scheduled-payments", json=body, headers=headers)

    thread, result, elapsed = _in_thread(create, 10 * BOUND)
    assert not thread.is_alive(), "the create waited for the standby past its bound"
    first = result["value"]
    assert first.status_code == 503, first.get_data(as_text=True)
    assert first.mimetype == "application/problem+json"
    assert first.get_json()["code"] == "OUTCOME_UNKNOWN"
    assert "Idempotency-Key" in first.get_json()["detail"]
    assert BOUND <= elapsed < BOUND + 2
    assert _count(pair.url, payee) == 1  # committed on the primary alone

    again = create()
    assert again.status_code == 503 and again.get_json()["code"] == "OUTCOME_UNKNOWN"

    pair.start_standby()
    replay = create()
    assert replay.status_code == 201, replay.get_data(as_text=True)
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert _count(pair.url, payee) == 1
    fresh = client.post(
        "/v1/scheduled-payments",
        json=_body(payee + "-b"),
        headers={**alice, "Idempotency-Key": payee + "-b"},
    )
    assert fresh.status_code == 201 and "Idempotent-Replayed" not in fresh.headers


def test_a_create_the_standby_confirms_in_time_answers_201(config, pair):
    app = _app(config, pair.url)
    try:
        alice = _key(pair.url, "alice")
        payee = f"in-time-{uuid.uuid4().hex[:8]}"
        response = app.test_client().post(
            "/v1/scheduled-payments", json=_body(payee), headers={**alice, "Idempotency-Key": payee}
        )
        assert response.status_code == 201, response.get_data(as_text=True)
        with psycopg.connect(pair.standby.dsn("paycron")) as standby:
            assert (
                standby.execute(
                    "SELECT count(*) FROM payments WHERE payee = %s", (payee,)
                ).fetchone()[0]
                == 1
            )
    finally:
        close_app(app)


# -- the primary dies ----------------------------------------------------------------------


#: How long the pair has no primary in the failover test: long enough that
#: psycopg_pool's own backoff (1, 2, 4, 8 s ...) would next try ~7 s after
#: the promotion.
OUTAGE = 7.5


def _poll(pool, until: float) -> int:
    """Ask ``pool`` for a connection the way a service loop does, until one
    comes or the monotonic ``until``; how many requests failed."""
    failures = 0
    while time.monotonic() < until:
        try:
            with pool.connection(timeout=0.5) as conn:
                conn.execute("SELECT 1")
                return failures
        except Exception:  # noqa: BLE001 - PoolTimeout, a dead connection
            failures += 1
    return failures


def test_pools_and_readyz_follow_a_failover_without_a_restart(config, fresh_pair):
    """Kill the primary: /readyz answers 503 while no server accepts writes,
    and an engine pool is asked for connections all along (a sweeper's
    loop). Promote the standby 7.5 s after the kill: the same app and pool
    reach it within a few seconds, with no restart, every connection that
    died with the old primary replaced before it is handed out; what was
    committed before the kill is there, and the old primary stays down."""
    pair = fresh_pair
    app = _app(config, pair.url)
    engine_pool = make_pool(Config(database_url=pair.url, db_pool_max=2), name="worker")
    # Idle through the outage with all its connections open: they die together.
    idle_pool = make_pool(Config(database_url=pair.url, db_pool_max=8), min_size=8, name="idle")
    try:
        idle_pool.wait(timeout=10)
        client = app.test_client()
        alice = _key(pair.url, "alice")
        assert client.get("/readyz").status_code == 200
        created = client.post(
            "/v1/scheduled-payments",
            json=_body("before-kill"),
            headers={**alice, "Idempotency-Key": "before-kill"},
        )
        assert created.status_code == 201
        with engine_pool.connection() as conn:
            old_port = conn.info.port

        killed_at = time.monotonic()
        pair.kill_primary()
        down = client.get("/readyz")
        assert down.status_code == 503 and down.get_json()["checks"]["postgres"] == "down"
        assert _poll(engine_pool, killed_at + OUTAGE) > 0  # no primary: every ask fails

        pair.promote()
        promoted_at = time.monotonic()
        with idle_pool.connection() as conn:  # its 8 dead ones discarded at the first check
            conn.execute("SELECT 1")
        idle_back = time.monotonic() - promoted_at
        _poll(engine_pool, promoted_at + 10)
        engine_back = time.monotonic() - promoted_at
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() - promoted_at < 10, "the web never reached the new primary"
            time.sleep(0.1)
        web_back = time.monotonic() - promoted_at
        # Within ~2 s of the promotion: not psycopg_pool's next backoff (~7 s
        # later), nor one dead connection per pause of 1, 2, 4 s.
        assert idle_back < 3 and engine_back < 4 and web_back < 4, (
            idle_back,
            engine_back,
            web_back,
        )
        with engine_pool.connection() as conn:
            assert conn.info.port == pair.primary.port != old_port
        got = client.get(f"/v1/scheduled-payments/{created.get_json()['id']}", headers=alice)
        assert got.status_code == 200
        after = client.post(
            "/v1/scheduled-payments",
            json=_body("after-promote"),
            headers={**alice, "Idempotency-Key": "after-promote"},
        )
        assert after.status_code == 201, after.get_data(as_text=True)
        assert not pair.killed[0].is_primary()  # it stays down
    finally:
        idle_pool.close()
        engine_pool.close()
        close_app(app)
