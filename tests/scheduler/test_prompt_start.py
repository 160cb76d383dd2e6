"""A prompt start: the sweep sleeps until the next known run_at, wakes when a
create announces a payment due within the interval, and the workers' idle
consumers look for messages often. The interval stays the safety net."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from paycron.store import payments
from paycron.store.db import connect
from scheduler.sweeper import MIN_WAIT_SECONDS
from scheduler.wake import DueWake
from tests.conftest import iso
from tests.factories import insert_payment
from tests.inprocess import Engine


@pytest.fixture
def engine(config):
    eng = Engine(config.with_overrides(sweep_interval_seconds=2.0))
    yield eng
    eng.close()


def test_the_sweep_sleeps_until_the_next_run_at_within_the_interval(engine, conn):
    insert_payment(conn, due_at=datetime.now(UTC) + timedelta(milliseconds=700))
    counts = engine.sweeper.run_once()
    assert counts.claimed == 0
    assert 0.3 < counts.next_due <= 0.7
    assert engine.sweeper.wait_after(counts) == counts.next_due


def test_nothing_due_within_the_interval_sleeps_the_interval(engine, conn):
    insert_payment(conn, due_at=datetime.now(UTC) + timedelta(seconds=30))
    counts = engine.sweeper.run_once()
    assert counts.next_due is None
    assert engine.sweeper.wait_after(counts) == 2.0


def test_a_due_row_the_sweep_leaves_alone_never_makes_it_spin(engine, conn):
    """Due, but first called at another processor: not claimed, and not a
    reason to wake again before the interval."""
    insert_payment(conn, due_at=datetime.now(UTC) - timedelta(seconds=1), processor="stripe")
    counts = engine.sweeper.run_once()
    assert counts.claimed == 0 and counts.next_due is None
    assert engine.sweeper.wait_after(counts) == 2.0


def test_without_prompt_start_the_sweep_keeps_its_interval(config, conn):
    eng = Engine(config.with_overrides(prompt_start=False))
    try:
        insert_payment(conn, due_at=datetime.now(UTC) + timedelta(milliseconds=500))
        counts = eng.sweeper.run_once()
        assert counts.next_due is None
        assert eng.sweeper.wait_after(counts) == eng.sweeper.interval_seconds
    finally:
        eng.close()


def test_the_wait_has_a_floor(engine):
    from scheduler.sweeper import SweepCounts

    assert engine.sweeper.wait_after(SweepCounts(next_due=0.0)) == MIN_WAIT_SECONDS


@pytest.fixture
def wake(config):
    stop = threading.Event()
    due_wake = DueWake(config)
    thread = due_wake.start(stop)
    assert due_wake.listening.wait(10)
    due_wake.wait(0)  # the wake-up of the first LISTEN
    yield due_wake
    stop.set()
    thread.join(5)
    assert not thread.is_alive()


def test_a_notification_wakes_the_sleeping_sweep_at_once(wake, config):
    assert wake.wait(0.2) is False  # nothing announced: the whole sleep
    timer = threading.Timer(0.2, lambda: notify(config))
    timer.start()
    started = time.monotonic()
    assert wake.wait(10) is True
    assert time.monotonic() - started < 5
    timer.join()


def notify(config):
    with connect(config) as conn:
        payments.notify_due(conn)


def listening(config):
    conn = connect(config)
    conn.execute("LISTEN paycron_due")
    return conn


def announced(conn, timeout: float = 2.0) -> int:
    return sum(1 for _ in conn.notifies(timeout=timeout))


def test_a_create_due_within_the_interval_is_announced(client, alice, config):
    listener = listening(config)
    try:
        due = datetime.now(UTC) + timedelta(seconds=1)
        response = client.post(
            "/v1/scheduled-payments",
            json={"payee": "acme", "amount": 2500, "dueAt": iso(due)},
            headers={**alice, "Idempotency-Key": "soon"},
        )
        assert response.status_code == 201
        assert announced(listener) == 1
    finally:
        listener.close()


def test_a_create_whose_announcement_fails_still_answers_its_payment(
    client, alice, conn, monkeypatch
):
    """The payment is committed before its NOTIFY: a NOTIFY that fails (here
    cancelled, as at the write's bound) must not answer 503, which tells the
    client nothing was created (a retry under a new key would schedule it
    twice). The next sweep claims it."""

    def cancelled(connection):
        raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")

    monkeypatch.setattr(payments, "notify_due", cancelled)
    due = datetime.now(UTC) + timedelta(seconds=1)
    response = client.post(
        "/v1/scheduled-payments",
        json={"payee": "acme", "amount": 2500, "dueAt": iso(due)},
        headers={**alice, "Idempotency-Key": "soon"},
    )
    assert response.status_code == 201, response.get_data(as_text=True)
    stored = conn.execute("SELECT id FROM payments").fetchall()
    assert [str(row["id"]) for row in stored] == [response.get_json()["id"]]


def test_a_create_due_later_and_a_replay_are_not_announced(client, alice, config):
    listener = listening(config)
    try:
        later = {"payee": "acme", "amount": 2500, "dueAt": iso(datetime.now(UTC) + timedelta(1))}
        soon = {"payee": "acme", "amount": 2500, "dueAt": iso(datetime.now(UTC) + timedelta(0, 1))}
        first = client.post(
            "/v1/scheduled-payments", json=soon, headers={**alice, "Idempotency-Key": "k"}
        )
        assert announced(listener) == 1
        replay = client.post(
            "/v1/scheduled-payments", json=soon, headers={**alice, "Idempotency-Key": "k"}
        )
        assert (
            replay.status_code in (200, 201) and replay.get_json()["id"] == first.get_json()["id"]
        )
        assert (
            client.post(
                "/v1/scheduled-payments", json=later, headers={**alice, "Idempotency-Key": "l"}
            ).status_code
            == 201
        )
        assert announced(listener, timeout=1.0) == 0
    finally:
        listener.close()


def test_idle_workers_look_for_messages_often(config):
    # By its file: importing the ``tasks`` package builds the worker's whole
    # runtime from the environment (it is Dramatiq's entry point).
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "tasks" / "prompt_broker.py"
    spec = importlib.util.spec_from_file_location("prompt_broker_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    PROMPT_IDLE_MS, PromptRedisBroker = module.PROMPT_IDLE_MS, module.PromptRedisBroker

    broker = PromptRedisBroker(url=config.redis_url, namespace="paycron-test-prompt")
    try:
        consumer = broker.consume("payments", prefetch=1, timeout=1000)
        assert consumer.timeout == PROMPT_IDLE_MS
        consumer.close()
        # Delayed messages are never sent: their consumer keeps the worker's pace.
        delayed = broker.consume("payments.DQ", prefetch=1, timeout=1000)
        assert delayed.timeout == 1000
        delayed.close()
    finally:
        broker.close()
