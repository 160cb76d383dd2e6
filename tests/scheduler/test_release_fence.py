"""A release never undoes a claim a worker already started (docs/money-safety.md).

The sweeper hands claims back when the broker raises although the message
may have been delivered (a lost reply), and a duplicated message that meets
an open breaker hands back a claim another worker holds. Either release
must leave a started claim alone (its call may charge): otherwise the row is
PENDING, not in doubt, and a cancel wins over the charge. Real Postgres, the
fake gateway over HTTP, Redis for the breaker.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from paycron.config import Config
from paycron.domain.enums import CancelOutcome
from paycron.sql import q
from paycron.store import transitions
from paycron.store.db import connect
from tests.factories import insert_payment
from tests.inprocess import Engine
from tests.rows import attempts_of, payment


def release_events(conn, payment_id) -> list[dict]:
    return [
        r["data"]
        for r in conn.execute(
            "SELECT data FROM payment_events WHERE payment_id = %s AND type = 'payment.released'",
            (payment_id,),
        )
    ]


def test_a_duplicated_message_meeting_an_open_breaker_leaves_a_started_claim(
    engine, config, conn, gateway
):
    row = insert_payment(conn)
    [(claims, _)] = engine.sweep()
    gateway.faults(latency_ms=1500)  # the first worker's call is in flight a while
    first = threading.Thread(target=engine.executor.execute, args=(claims,))
    first.start()
    deadline = time.monotonic() + 10
    while not attempts_of(conn, row["id"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [a["outcome"] for a in attempts_of(conn, row["id"])] == ["IN_FLIGHT"]
    # The duplicate, on another worker that sees the breaker open: it releases.
    other = Engine(config)
    try:
        other.breaker.open()
        counts = other.executor.execute(claims)
        outcome = transitions.cancel(conn, row["id"], actor="alice")
        other.breaker.close()
    finally:
        other.close()
    first.join()
    assert counts.released == 0
    assert outcome is CancelOutcome.ALREADY_PROCESSING
    done = payment(conn, row["id"])
    assert (done["status"], [a["outcome"] for a in attempts_of(conn, row["id"])]) == (
        "COMPLETED",
        ["SUCCEEDED"],
    )
    assert gateway.charges_per_key() == {str(row["id"]): 1}
    assert release_events(conn, row["id"]) == []


def test_an_enqueue_that_raises_after_delivery_leaves_the_started_claim(engine, conn, gateway):
    row = insert_payment(conn)

    def delivered_then_lost(claims, probe):
        # The broker got the message and a worker started it; the reply was lost.
        transitions.start(engine.pool, claims, lease_seconds=engine.config.lease_seconds)
        raise redis.ConnectionError("reply lost")

    engine.sweeper.enqueue = delivered_then_lost
    with pytest.raises(redis.ConnectionError):
        engine.sweeper.run_once()
    held = payment(conn, row["id"])
    assert (held["status"], held["attempt"]) == ("PROCESSING", 1)
    assert transitions.cancel(conn, row["id"], actor="alice") is CancelOutcome.ALREADY_PROCESSING
    assert release_events(conn, row["id"]) == []


def test_a_claim_the_broker_refused_is_released_saying_so(engine, conn):
    row = insert_payment(conn)

    def refused(claims, probe):
        raise redis.ConnectionError("broker down")

    engine.sweeper.enqueue = refused
    with pytest.raises(redis.ConnectionError):
        engine.sweeper.run_once()
    assert payment(conn, row["id"])["status"] == "PENDING"
    assert release_events(conn, row["id"]) == [{"reason": "enqueue_failed"}]


def test_a_start_that_commits_while_the_release_waits_for_its_lock_is_kept(
    engine, conn, database_url
):
    """The ordering the fence's two statements exist for: a worker's start
    holds the row (not yet committed), the release blocks on it, then the
    start commits. A release judging the attempt row on its snapshot from
    before the wait would hand back a claim whose call is about to be made."""
    row = insert_payment(conn)
    [(claims, _)] = engine.sweep()
    released: list[int] = []
    with connect(Config(database_url=database_url)) as starter:
        with starter.transaction():
            held = starter.execute(
                q("start_attempts"),
                {
                    "ids": [c.payment_id for c in claims],
                    "due_ats": [c.due_at for c in claims],
                    "attempts": [c.attempt for c in claims],
                    "lease_seconds": engine.config.lease_seconds,
                    "processor": "fake",
                    "worker": "w1",
                },
            ).fetchall()
            assert len(held) == 1
            releaser = threading.Thread(
                target=lambda: released.append(
                    transitions.release(engine.pool, claims, reason=transitions.ENQUEUE_FAILED)
                )
            )
            releaser.start()
            for _ in range(200):  # until the release waits for the start's row lock
                waiting = conn.execute(
                    "SELECT count(*) AS n FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                ).fetchone()["n"]
                if waiting:
                    break
                time.sleep(0.05)
            assert waiting, "the release never waited for the start's lock"
        # the start commits here, while the release waits
        releaser.join(timeout=30)
    assert released == [0]
    held_row = payment(conn, row["id"])
    assert (held_row["status"], held_row["attempt"]) == ("PROCESSING", 1)
    assert [a["outcome"] for a in attempts_of(conn, row["id"])] == ["IN_FLIGHT"]
    assert release_events(conn, row["id"]) == []
    assert transitions.cancel(conn, row["id"], actor="alice") is CancelOutcome.ALREADY_PROCESSING
