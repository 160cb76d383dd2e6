"""A release never undoes a claim a worker already started (issue 20, row 2).

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

from paycron.domain.enums import CancelOutcome
from paycron.store import transitions
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
