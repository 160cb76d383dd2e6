"""The reaper and the zombie worker: the real outcome always wins."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from paycron.domain.enums import Outcome, Status
from paycron.domain.policy import Decision
from paycron.domain.processing import CallResult, ChargeRequest
from paycron.store import transitions
from paycron.store.transitions import Claim, Finished
from tests.factories import insert_payment
from tests.rows import event_types
from tests.rows import payment as row_of


def expire(conn, payment_id):
    conn.execute(
        "UPDATE payments SET lease_until = now() - interval '1 second' "
        "WHERE id = %s AND status = 'PROCESSING'",
        (payment_id,),
    )


def attempt_of(conn, payment_id, n):
    return conn.execute(
        "SELECT * FROM attempts WHERE payment_id = %s AND attempt = %s", (payment_id, n)
    ).fetchone()


def started(engine, conn):
    """A due payment, claimed and its attempt started, as a worker would before calling."""
    insert_payment(conn)
    [(claims, _)] = engine.sweep()
    [row] = transitions.start(engine.pool, claims, lease_seconds=30)
    return claims[0], row


def test_seed_every_state_reap_only_expired_processing(engine, conn):
    past = datetime.now(UTC) - timedelta(seconds=5)
    rows = {
        s: insert_payment(conn, status=s, lease_until=past if s == "PROCESSING" else None)
        for s in ("PENDING", "COMPLETED", "FAILED", "CANCELLED")
    }
    rows["PROCESSING"] = insert_payment(conn, status="PROCESSING", attempt=1, lease_until=past)
    live = insert_payment(
        conn, status="PROCESSING", attempt=1, lease_until=datetime.now(UTC) + timedelta(minutes=1)
    )
    counts = engine.reaper.run_once()
    assert counts.reaped == 1
    after = {s: row_of(conn, r["id"])["status"] for s, r in rows.items()}
    assert after == {
        "PENDING": "PENDING",
        "COMPLETED": "COMPLETED",
        "FAILED": "FAILED",
        "CANCELLED": "CANCELLED",
        "PROCESSING": "PENDING",
    }
    assert row_of(conn, live["id"])["status"] == "PROCESSING"
    reaped = row_of(conn, rows["PROCESSING"]["id"])
    # no attempt row: the call never started, so the expiry neither counts nor doubts
    assert (reaped["attempt"], reaped["lease_expiries"], reaped["lease_until"]) == (1, 0, None)
    assert not reaped["in_doubt"]


def test_a_reaped_in_flight_call_puts_the_payment_in_doubt(engine, conn):
    claim, row = started(engine, conn)
    expire(conn, row["id"])
    engine.reaper.run_once()
    reaped = row_of(conn, row["id"])
    assert reaped["status"] == "PENDING" and reaped["in_doubt"]
    assert attempt_of(conn, row["id"], 1)["outcome"] == "LEASE_EXPIRED"


def test_the_zombies_late_outcome_is_kept_but_changes_no_status(engine, conn, gateway):
    claim, row = started(engine, conn)  # the zombie holds attempt 1
    expire(conn, row["id"])
    engine.reaper.run_once()
    [(claims, _)] = engine.sweep()  # re-claimed as attempt 2
    assert claims[0].attempt == 2
    # The zombie finishes late with a success it really got.
    zombie = Finished(
        row, CallResult(Outcome.SUCCEEDED, gateway_ref="ch_zombie"), Decision(Status.COMPLETED)
    )
    [result] = transitions.finish(engine.pool, [zombie])
    assert result["recorded"] and not result["moved"]
    assert attempt_of(conn, row["id"], 1)["outcome"] == "SUCCEEDED"  # LEASE_EXPIRED overwritten
    assert attempt_of(conn, row["id"], 1)["gateway_ref"] == "ch_zombie"
    assert row_of(conn, row["id"])["status"] == "PROCESSING"  # attempt 2 still holds it
    assert row_of(conn, row["id"])["attempt"] == 2
    assert "attempt.finished" in event_types(conn, row["id"])


def test_a_zombie_failure_cannot_fail_a_reclaimed_payment(engine, conn):
    claim, row = started(engine, conn)
    expire(conn, row["id"])
    engine.reaper.run_once()
    engine.sweep()
    zombie = Finished(
        row,
        CallResult(Outcome.DECLINED, error_code="card_declined"),
        Decision(Status.FAILED, failure_reason=None),
    )
    transitions.finish(engine.pool, [zombie])
    assert row_of(conn, row["id"])["status"] == "PROCESSING"


def test_the_reaper_never_touches_a_row_that_completed(engine, conn, gateway):
    claim, row = started(engine, conn)
    # The lease ran out while the call was in flight, but the worker answers
    # first: the row is COMPLETED when the reaper looks.
    expire(conn, row["id"])
    done = Finished(
        row, CallResult(Outcome.SUCCEEDED, gateway_ref="ch_1"), Decision(Status.COMPLETED)
    )
    transitions.finish(engine.pool, [done])
    assert engine.reaper.run_once().reaped == 0
    final = row_of(conn, row["id"])
    assert final["status"] == "COMPLETED" and final["lease_expiries"] == 0
    assert attempt_of(conn, row["id"], 1)["outcome"] == "SUCCEEDED"


def test_a_reclaimed_payment_is_charged_once(engine, conn, gateway):
    claim, row = started(engine, conn)
    # The zombie's call lands at the gateway but it never records it.
    engine.gateway.charge(
        ChargeRequest(
            reference=str(row["id"]),
            idempotency_key=str(row["id"]),
            amount=row["amount_minor"],
            currency="USD",
        )
    )
    expire(conn, row["id"])
    engine.reaper.run_once()
    engine.drain()
    final = row_of(conn, row["id"])
    assert final["status"] == "COMPLETED" and not final["in_doubt"]
    assert gateway.charges_per_key() == {str(row["id"]): 1}


def test_repeated_lease_expiry_parks_a_poison_payment(engine, conn, config):
    """It kills its worker every time, the lookup's claim included: parked
    in doubt, its event saying the outcome is unknown."""
    row = insert_payment(conn)
    for n in range(config.max_lease_expiries + 1):
        [(claims, _)] = engine.sweep()
        assert claims == [Claim(row["id"], row["due_at"], n + 1)]
        # its worker starts the call and dies every time
        transitions.start(engine.pool, claims, lease_seconds=30)
        expire(conn, row["id"])
        engine.reaper.run_once()
    final = row_of(conn, row["id"])
    assert (final["status"], final["failure_reason"]) == ("FAILED", "LEASE_EXPIRED_REPEATEDLY")
    assert final["in_doubt"]
    last = conn.execute(
        "SELECT data FROM payment_events WHERE payment_id = %s ORDER BY id DESC LIMIT 1",
        (row["id"],),
    ).fetchone()["data"]
    assert last["failureReason"] == "LEASE_EXPIRED_REPEATEDLY" and last["outcomeUnknown"] is True
    [dead] = conn.execute("SELECT * FROM dead_letters").fetchall()
    assert dead["reason"] == "LEASE_EXPIRED_REPEATEDLY"
    assert engine.sweep() == []
