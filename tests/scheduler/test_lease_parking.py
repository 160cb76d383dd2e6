"""Parking after repeated lease expiries (docs/money-safety.md).

Only an expiry whose call was in flight counts toward ``MAX_LEASE_EXPIRIES``
(a claim that never got its attempt row made no call: a lost message or a
crash-looping deploy must not park every due payment). The expiry that
reaches the limit parks nothing by itself: the payment is claimed once more
and looked up instead of called; only then it parks, in doubt unless the
lookup was conclusive, with the documented ``failureReason`` and
``outcomeUnknown`` in its event. A late success of the hung call completes
a payment parked in doubt. Real Postgres, the fake gateway over HTTP.
"""

from __future__ import annotations

from paycron.domain import policy
from paycron.domain.enums import Outcome
from paycron.domain.processing import CallResult
from paycron.engine import dead_letters
from paycron.store import transitions
from tests.factories import insert_payment
from tests.rows import attempts_of, letter, payment


def expire(conn, payment_id):
    conn.execute(
        "UPDATE payments SET lease_until = now() - interval '1 second' WHERE id = %s",
        (payment_id,),
    )


def events(conn, payment_id) -> list[tuple[str, dict]]:
    return [
        (r["type"], r["data"])
        for r in conn.execute(
            "SELECT type, data FROM payment_events WHERE payment_id = %s ORDER BY id",
            (payment_id,),
        )
    ]


def started_call(engine, conn, **columns) -> tuple[dict, dict]:
    """A payment claimed and started (its attempt row IN_FLIGHT): the worker hangs."""
    row = insert_payment(conn, **columns)
    [(claims, _)] = engine.sweep()
    [held] = transitions.start(engine.pool, claims, lease_seconds=engine.config.lease_seconds)
    return row, held


def test_claims_that_never_got_an_attempt_row_never_park(engine, conn, gateway, config):
    row = insert_payment(conn)
    for _ in range(config.max_lease_expiries + 2):
        assert engine.sweep()  # claimed; the message is lost before any worker starts it
        expire(conn, row["id"])
        engine.reaper.run_once()
    after = payment(conn, row["id"])
    assert (after["status"], after["lease_expiries"], after["in_doubt"]) == ("PENDING", 0, False)
    assert attempts_of(conn, row["id"]) == [] and gateway.ledger() == []
    engine.drain()  # the workers are back: charged once
    assert payment(conn, row["id"])["status"] == "COMPLETED"
    assert gateway.charges_per_key() == {str(row["id"]): 1}


def test_the_last_expiry_of_a_call_in_flight_is_looked_up_and_finds_the_charge(
    engine, conn, gateway, config
):
    row, _ = started_call(engine, conn, lease_expiries=config.max_lease_expiries - 1)
    gateway.charge(row)  # the hung call landed at the processor
    expire(conn, row["id"])
    engine.reaper.run_once()
    assert payment(conn, row["id"])["status"] != "FAILED"  # not parked without asking
    engine.drain()
    done = payment(conn, row["id"])
    assert (done["status"], done["in_doubt"]) == ("COMPLETED", False)
    assert [a["outcome"] for a in attempts_of(conn, row["id"])] == [
        "LEASE_EXPIRED",
        "FOUND_BY_LOOKUP",
    ]
    assert gateway.charges_per_key() == {str(row["id"]): 1}
    assert letter(conn, row["id"]) is None


def parked_in_doubt(engine, conn, config) -> tuple[dict, dict]:
    row, held = started_call(engine, conn, lease_expiries=config.max_lease_expiries - 1)
    expire(conn, row["id"])
    engine.reaper.run_once()
    engine.drain()  # the lookup finds nothing, and the hung call's bound is ahead
    return row, held


def test_parking_in_doubt_follows_a_lookup_and_says_the_outcome_is_unknown(
    engine, conn, gateway, config
):
    row, _ = parked_in_doubt(engine, conn, config)
    after = payment(conn, row["id"])
    assert (after["status"], after["failure_reason"], after["in_doubt"]) == (
        "FAILED",
        "LEASE_EXPIRED_REPEATEDLY",
        True,
    )
    assert gateway.ledger() == []  # looked up, never called again
    assert len(attempts_of(conn, row["id"])) == 2
    assert letter(conn, row["id"])["reason"] == "LEASE_EXPIRED_REPEATEDLY"
    kind, data = events(conn, row["id"])[-1]
    assert kind == "payment.failed"
    assert data["failureReason"] == "LEASE_EXPIRED_REPEATEDLY" and data["outcomeUnknown"] is True


def test_a_late_success_completes_a_payment_parked_in_doubt(engine, conn, gateway, config):
    row, held = parked_in_doubt(engine, conn, config)
    assert payment(conn, row["id"])["status"] == "FAILED"
    # The hung worker's call finally answers: charged.
    charge = gateway.charge(row)
    result = CallResult(Outcome.SUCCEEDED, gateway_ref=charge["id"])
    decision = policy.decide(result, failures=0, in_doubt=False, config=config)
    transitions.finish(engine.pool, [transitions.Finished(held, result, decision)])
    done = payment(conn, row["id"])
    assert (done["status"], done["in_doubt"], done["failure_reason"]) == ("COMPLETED", False, None)
    assert attempts_of(conn, row["id"])[0]["outcome"] == "SUCCEEDED"
    kind, data = events(conn, row["id"])[-1]
    assert (kind, data["gatewayRef"]) == ("payment.completed", charge["id"])
    assert letter(conn, row["id"])["resolution"] == "COMPLETED"
    assert gateway.charges_per_key() == {str(row["id"]): 1}


def late_success(engine, held, config, gateway_ref: str) -> None:
    """The hung worker's call finally answers: charged (its finish, as the executor writes it)."""
    result = CallResult(Outcome.SUCCEEDED, gateway_ref=gateway_ref)
    decision = policy.decide(result, failures=0, in_doubt=False, config=config)
    transitions.finish(engine.pool, [transitions.Finished(held, result, decision)])


def test_a_late_success_never_completes_a_payment_a_human_refunded(engine, conn, gateway, config):
    row, held = parked_in_doubt(engine, conn, config)
    charge = gateway.charge(row)  # the hung call landed at the processor
    done = dead_letters.refund(conn, engine.gateway, row["id"], actor="ops")
    assert done.action == "refunded"
    late_success(engine, held, config, charge["id"])
    after = payment(conn, row["id"])
    # The money went back: the payment is not reported COMPLETED to its client.
    assert after["status"] == "FAILED" and after["refunded_at"] is not None
    assert "payment.completed" not in [kind for kind, _ in events(conn, row["id"])]
    assert attempts_of(conn, row["id"])[0]["outcome"] == "SUCCEEDED"  # the audit keeps it
    assert letter(conn, row["id"])["resolution"] == "REFUNDED"


def test_a_late_success_of_an_older_key_generation_never_clears_a_newer_doubt(
    engine, conn, gateway, config
):
    # Parked in doubt at generation 1 (its call hung), then re-driven: the
    # next generation's call hangs too and it is parked in doubt again.
    row, held = parked_in_doubt(engine, conn, config)
    assert transitions.redrive(conn, row["id"], actor="ops")
    conn.execute(
        "UPDATE payments SET lease_expiries = %s WHERE id = %s",
        (config.max_lease_expiries - 1, row["id"]),
    )
    [(claims, _)] = engine.sweep()
    [held2] = transitions.start(engine.pool, claims, lease_seconds=config.lease_seconds)
    assert held2["key_generation"] == 2
    expire(conn, row["id"])
    engine.reaper.run_once()
    engine.drain()
    parked = payment(conn, row["id"])
    assert (parked["status"], parked["in_doubt"], parked["key_generation"]) == ("FAILED", True, 2)
    # Generation 1's hung call answers late: charged. Generation 2's call
    # may have charged too; its doubt must stay for a human.
    late_success(engine, held, config, "pi_gen1")
    after = payment(conn, row["id"])
    assert (after["status"], after["in_doubt"]) == ("FAILED", True)
    assert letter(conn, row["id"])["resolution"] is None


def test_a_late_success_never_closes_a_mismatch_left_for_a_human(engine, conn, gateway, config):
    row, held = started_call(engine, conn, lease_expiries=config.max_lease_expiries - 1)
    # The processor holds a payment for this reference with another amount.
    gateway.charge(row, amount=row["amount_minor"] + 1, key=f"{row['id']}:other")
    expire(conn, row["id"])
    engine.reaper.run_once()
    engine.drain()  # the lookup finds the mismatch: parked for a human
    parked = payment(conn, row["id"])
    assert (parked["status"], parked["failure_reason"]) == ("FAILED", "LOOKUP_MISMATCH")
    charge = gateway.charge(row)  # the hung call lands too: two charges for one payment
    late_success(engine, held, config, charge["id"])
    # The second processor payment is still to be looked at: the letter stays open.
    assert letter(conn, row["id"])["resolution"] is None
    assert payment(conn, row["id"])["failure_reason"] == "LOOKUP_MISMATCH"
