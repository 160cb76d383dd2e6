"""Execution against the real fake gateway: each test fails without its mechanism."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

import pytest

from paycron.store.transitions import Claim
from tests.aio_support import EXECUTORS
from tests.factories import insert_payment
from tests.rows import attempts_of as attempts
from tests.rows import count, event_types, payment

DECLINE, ALWAYS_503 = 40002, 50003

# Every test here runs against the threaded and the async executor.
pytestmark = pytest.mark.parametrize("executor_kind", EXECUTORS)


def test_a_due_payment_is_charged_once_and_completed(engine, conn, gateway):
    row = insert_payment(conn, amount_minor=1234)
    engine.drain()
    done = payment(conn, row["id"])
    assert done["status"] == "COMPLETED" and done["attempt"] == 1 and not done["in_doubt"]
    [attempt] = attempts(conn, row["id"])
    assert attempt["outcome"] == "SUCCEEDED" and attempt["gateway_key"] == str(row["id"])
    [charge] = gateway.ledger()
    assert charge["idempotency_key"] == str(row["id"]) and charge["amount"] == 1234
    assert attempt["gateway_ref"] == charge["id"]
    assert event_types(conn, row["id"]) == ["payment.processing", "payment.completed"]


def test_a_batchs_attempts_are_one_log_line_a_segment_each(engine, conn, gateway, caplog):
    paid, declined = insert_payment(conn), insert_payment(conn, amount_minor=DECLINE)
    with caplog.at_level(logging.INFO, logger="paycron.execution"):
        engine.drain()
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("attempts ")]
    assert sorted(line.removeprefix("attempts ").split("; ")) == sorted(
        [
            f"payment={paid['id']} attempt=1 outcome=SUCCEEDED error=None status=COMPLETED",
            f"payment={declined['id']} attempt=1 outcome=DECLINED error=card_declined "
            "status=FAILED",
        ]
    )


def test_future_and_cancelled_payments_are_not_claimed(engine, conn, gateway):
    future = insert_payment(conn, due_at=datetime.now(UTC) + timedelta(minutes=5))
    cancelled = insert_payment(conn, status="CANCELLED")
    assert engine.sweep() == []
    assert (payment(conn, future["id"])["status"], payment(conn, future["id"])["attempt"]) == (
        "PENDING",
        0,
    )
    assert payment(conn, cancelled["id"])["status"] == "CANCELLED"
    assert event_types(conn, future["id"]) == event_types(conn, cancelled["id"]) == []


def test_a_duplicated_message_calls_the_gateway_once(engine, conn, gateway):
    row = insert_payment(conn)
    [(claims, _)] = engine.sweep()
    gateway.faults(latency_ms=200)  # both copies are in flight at once
    threads = [threading.Thread(target=engine.executor.execute, args=(claims,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.executor.execute(claims)  # and once more, late
    assert gateway.stats()["charge_requests"] == 1
    assert len(attempts(conn, row["id"])) == 1
    assert payment(conn, row["id"])["status"] == "COMPLETED"


def test_a_stale_message_is_dropped_by_the_fence(engine, conn, gateway):
    row = insert_payment(conn, status="PROCESSING", attempt=3)
    stale = Claim(row["id"], row["due_at"], 2)
    counts = engine.executor.execute([stale])
    assert counts.stale == 1 and counts.calls == 0
    assert gateway.stats()["charge_requests"] == 0
    assert payment(conn, row["id"])["status"] == "PROCESSING"


def test_a_decline_stops_at_one_attempt(engine, conn, gateway):
    row = insert_payment(conn, amount_minor=DECLINE)
    engine.drain()
    done = payment(conn, row["id"])
    assert (done["status"], done["failure_reason"]) == ("FAILED", "DECLINED")
    assert [a["outcome"] for a in attempts(conn, row["id"])] == ["DECLINED"]
    assert attempts(conn, row["id"])[0]["error_code"] == "card_declined"
    assert count(conn, "dead_letters") == 0
    assert event_types(conn, row["id"])[-1] == "payment.failed"


def test_six_retryable_failures_park_with_the_full_history(engine, conn, gateway, caplog):
    row = insert_payment(conn, amount_minor=ALWAYS_503)
    with caplog.at_level(logging.INFO, logger="paycron"):
        rounds = [counts for _ in range(10) for counts in engine.work()]  # one group a round
    # Parked in doubt (a 503 may have charged): a person must look, so ERROR.
    parked = [r for r in caplog.records if "parked RETRIES_EXHAUSTED" in r.getMessage()]
    assert [r.levelno for r in parked] == [logging.ERROR]
    assert f"paycron dlq show {row['id']}" in parked[0].getMessage()
    done = payment(conn, row["id"])
    assert (done["status"], done["failure_reason"]) == ("FAILED", "RETRIES_EXHAUSTED")
    history = attempts(conn, row["id"])
    assert [a["attempt"] for a in history] == [1, 2, 3, 4, 5, 6]
    assert {a["outcome"] for a in history} == {"RETRYABLE_ERROR"}
    assert done["failures"] == 6 and done["in_doubt"]
    [dead] = conn.execute("SELECT * FROM dead_letters").fetchall()
    assert dead["payment_id"] == row["id"] and dead["reason"] == "RETRIES_EXHAUSTED"
    assert dead["resolution"] is None
    assert gateway.stats()["charge_requests"] == 6
    # A 5xx put it in doubt, so the gateway was asked by reference before
    # parking: once, after the sixth call, and it found nothing.
    assert [c.looked_up for c in rounds] == [0, 0, 0, 0, 0, 1]
    # Parked in doubt (docs/design.md): the lookup's "none" is not conclusive while
    # its last call may still land, so inDoubt is kept and its event says the
    # outcome is unknown (a client must not re-create it as if it failed).
    assert done["calls_land_by"] > datetime.now(UTC)
    failed = conn.execute(
        "SELECT data FROM payment_events WHERE payment_id = %s AND type = 'payment.failed'",
        (row["id"],),
    ).fetchone()
    assert failed["data"]["outcomeUnknown"] is True
    assert [c.outcomes for c in rounds] == [{"RETRYABLE_ERROR": 1}] * 6


def test_rate_limits_never_park(engine, conn, gateway, config):
    gateway.faults(rate_limit_per_s=1)
    rows = [insert_payment(conn) for _ in range(5)]
    engine.work()
    after_first = {r["id"]: payment(conn, r["id"]) for r in rows}
    limited = [p for p in after_first.values() if p["status"] == "PENDING"]
    assert limited, "the ceiling of 1/s must have answered 429 to most of the 5"
    for p in limited:
        assert p["failures"] == 0 and not p["in_doubt"]
        assert attempts(conn, p["id"])[-1]["outcome"] == "RATE_LIMITED"
    gateway.faults(rate_limit_per_s=0)
    conn.execute("UPDATE payments SET run_at = due_at WHERE status = 'PENDING'")
    engine.drain()
    assert {payment(conn, r["id"])["status"] for r in rows} == {"COMPLETED"}
    assert count(conn, "dead_letters") == 0


def test_an_ambiguous_call_is_retried_with_the_same_key_and_charges_once(engine, conn, gateway):
    row = insert_payment(conn)
    gateway.faults(charge_then_drop_rate=1.0)
    engine.work()
    first = payment(conn, row["id"])
    assert first["status"] == "PENDING" and first["in_doubt"] and first["failures"] == 1
    assert attempts(conn, row["id"])[0]["outcome"] == "AMBIGUOUS"
    gateway.faults(charge_then_drop_rate=0.0)
    engine.drain()
    done = payment(conn, row["id"])
    assert done["status"] == "COMPLETED" and not done["in_doubt"]
    assert [a["outcome"] for a in attempts(conn, row["id"])] == ["AMBIGUOUS", "SUCCEEDED"]
    assert gateway.charges_per_key() == {str(row["id"]): 1}


def test_an_exhausted_payment_in_doubt_is_looked_up_before_parking(engine, conn, gateway):
    # The first call charges and its answer is lost; every later call fails
    # too, so the budget runs out with a charge at the gateway.
    row = insert_payment(conn, failures=5, in_doubt=True, attempt=5)
    gateway.faults(charge_then_drop_rate=1.0)
    engine.drain()
    done = payment(conn, row["id"])
    assert done["status"] == "COMPLETED"
    [last] = [a for a in attempts(conn, row["id"]) if a["attempt"] == 6]
    assert last["outcome"] == "FOUND_BY_LOOKUP"
    assert last["gateway_ref"] == gateway.ledger()[0]["id"]
    assert count(conn, "dead_letters") == 0
    assert gateway.charges_per_key() == {str(row["id"]): 1}
