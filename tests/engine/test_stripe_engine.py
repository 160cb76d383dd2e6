"""The engine charging through Stripe: the official SDK against the fake
gateway's Stripe-shaped surface, the stub's ledger as the oracle (each of
the fake's faults)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from paycron.limits.breaker import BreakerState
from tests.factories import insert_payment, park
from tests.inprocess import Engine
from tests.rows import attempts_of, payment

CUSTOMER = "cus_engine_1"


@pytest.fixture
def engine(stripe_config, gateway):
    eng = Engine(stripe_config)
    yield eng
    eng.close()


def a_payment(conn, method="pm_card_visa", **columns):
    columns.setdefault("customer", CUSTOMER)
    return insert_payment(conn, payment_method=method, **columns)


def intents_for(gateway, row) -> list[dict]:
    return [
        i
        for i in gateway.stripe_ledger()["payment_intents"]
        if i.get("paycron_payment_id") == str(row["id"])
    ]


def succeeded(gateway, row) -> int:
    return gateway.succeeded_per_payment_id().get(str(row["id"]), 0)


def test_a_card_is_charged_once_as_one_intent(engine, conn, gateway):
    row = a_payment(conn)
    engine.drain()
    done = payment(conn, row["id"])
    [attempt] = attempts_of(conn, row["id"])
    assert (done["status"], done["processor"], attempt["outcome"]) == (
        "COMPLETED",
        "stripe",
        "SUCCEEDED",
    )
    assert attempt["gateway_ref"].startswith("pi_") and attempt["gateway_key"] == str(row["id"])
    assert succeeded(gateway, row) == 1
    assert gateway.stripe_state()["last_stripe_version"] == engine.config.stripe_api_version


def test_an_unknown_payment_method_fails_after_one_call(engine, conn, gateway):
    row = a_payment(conn, method="pm_nobody_knows")
    engine.drain()
    done = payment(conn, row["id"])
    assert (done["status"], done["failure_reason"], done["last_error"]) == (
        "FAILED",
        "INVALID_REQUEST",
        "resource_missing",
    )
    assert [a["outcome"] for a in attempts_of(conn, row["id"])] == ["REJECTED"]


def test_another_customers_method_is_never_charged(engine, conn, gateway):
    """Whatever was let through at create (PAYMENT_METHOD_CHECK=false, or a
    method attached after), Stripe refuses the charge: FAILED, not charged."""
    theirs = gateway.stripe_client().v1.payment_methods.attach(
        "pm_card_visa", params={"customer": "cus_someone_else"}
    )
    row = a_payment(conn, method=theirs.id)
    engine.drain()
    done = payment(conn, row["id"])
    assert (done["status"], done["failure_reason"]) == ("FAILED", "INVALID_REQUEST")
    assert succeeded(gateway, row) == 0


@pytest.mark.parametrize(
    "method,reason,code",
    [
        ("pm_card_chargeDeclined", "DECLINED", "generic_decline"),
        ("pm_card_chargeDeclinedInsufficientFunds", "DECLINED", "insufficient_funds"),
        ("pm_card_authenticationRequired", "CUSTOMER_ACTION_REQUIRED", "authentication_required"),
    ],
)
def test_a_decline_fails_the_payment(engine, conn, gateway, method, reason, code):
    row = a_payment(conn, method=method)
    engine.drain()
    done = payment(conn, row["id"])
    assert (done["status"], done["failure_reason"], done["last_error"]) == ("FAILED", reason, code)
    assert succeeded(gateway, row) == 0
    if reason == "CUSTOMER_ACTION_REQUIRED":
        # cancelled, so an on-session confirmation can never charge a FAILED payment
        assert [i["status"] for i in intents_for(gateway, row)] == ["canceled"]


def test_a_decline_stripe_advises_retrying_confirms_the_same_intent_under_the_next_key(
    engine, conn, gateway
):
    row = a_payment(conn, method="pm_card_chargeDeclinedProcessingError")
    engine.drain()
    done = payment(conn, row["id"])
    history = attempts_of(conn, row["id"])
    assert (done["status"], done["key_generation"]) == ("COMPLETED", 2)
    assert [(a["outcome"], a["gateway_key"]) for a in history] == [
        ("DECLINED", str(row["id"])),
        ("SUCCEEDED", f"{row['id']}:2"),
    ]
    assert history[0]["gateway_ref"] == history[1]["gateway_ref"]  # one intent
    assert len(intents_for(gateway, row)) == 1 and succeeded(gateway, row) == 1


def test_a_rejected_api_key_parks_nothing_and_pages(engine, conn, gateway, caplog):
    gateway.stripe(api_key="sk_test_rotated_elsewhere")
    row = a_payment(conn)
    with caplog.at_level(logging.ERROR, logger="paycron.execution"):
        engine.work()
    after = payment(conn, row["id"])
    assert (after["status"], after["failures"], after["in_doubt"]) == ("PENDING", 0, False)
    assert [a["outcome"] for a in attempts_of(conn, row["id"])] == ["AUTH_FAILED"]
    assert any("credentials" in r.getMessage() for r in caplog.records)
    assert engine.config.stripe_api_key not in caplog.text
    # the key works again: the payment completes, once
    gateway.stripe(api_key=engine.config.stripe_api_key)
    conn.execute("UPDATE payments SET run_at = due_at WHERE id = %s", (row["id"],))
    engine.drain()
    assert payment(conn, row["id"])["status"] == "COMPLETED" and succeeded(gateway, row) == 1


def test_a_429_is_paced_and_costs_no_budget(engine, conn, gateway):
    gateway.faults(rate_limit_per_s=1)
    rows = [a_payment(conn) for _ in range(3)]
    engine.work()
    states = [payment(conn, r["id"]) for r in rows]
    limited = [s for s in states if s["status"] == "PENDING"]
    assert limited and all(s["failures"] == 0 and not s["in_doubt"] for s in limited)
    gateway.faults(rate_limit_per_s=0)
    conn.execute("UPDATE payments SET run_at = due_at")
    engine.drain()
    assert all(payment(conn, r["id"])["status"] == "COMPLETED" for r in rows)


def test_a_stored_500_is_resolved_by_lookup_with_one_charge(engine, conn, gateway):
    gateway.faults(error_after_charge_rate=1.0)
    row = a_payment(conn)
    engine.work()  # charged, then a 500 stored for the key
    first = payment(conn, row["id"])
    assert (first["status"], first["in_doubt"]) == ("PENDING", True)
    conn.execute("UPDATE payments SET run_at = due_at WHERE id = %s", (row["id"],))
    engine.work()  # the replayed 500: looked up, not resent
    done = payment(conn, row["id"])
    assert (done["status"], done["in_doubt"], done["key_generation"]) == ("COMPLETED", False, 1)
    assert [a["outcome"] for a in attempts_of(conn, row["id"])] == [
        "RETRYABLE_ERROR",
        "FOUND_BY_LOOKUP",
    ]
    assert succeeded(gateway, row) == 1


def test_a_lost_answer_is_asked_again_under_the_same_key(engine, conn, gateway):
    gateway.faults(charge_then_drop_rate=1.0)
    row = a_payment(conn)
    engine.work()
    gateway.faults(charge_then_drop_rate=0.0)
    conn.execute("UPDATE payments SET run_at = due_at WHERE id = %s", (row["id"],))
    engine.drain()
    history = attempts_of(conn, row["id"])
    assert [a["outcome"] for a in history] == ["AMBIGUOUS", "SUCCEEDED"]
    assert {a["gateway_key"] for a in history} == {str(row["id"])}
    assert payment(conn, row["id"])["status"] == "COMPLETED" and succeeded(gateway, row) == 1


def cli_env(config) -> dict:
    return {
        "DATABASE_URL": config.database_url,
        "REDIS_URL": config.redis_url,
        "REDIS_NAMESPACE": config.redis_namespace,
        "GATEWAY": "stripe",
        "STRIPE_API_KEY": config.stripe_api_key,
        "STRIPE_API_BASE": config.stripe_api_base,
    }


def test_a_lookup_finds_its_intent_on_the_third_page(stripe_config, conn, gateway):
    from click.testing import CliRunner

    from paycron.cli import main

    row = park(
        conn,
        in_doubt=True,
        customer=CUSTOMER,
        payment_method="pm_card_visa",
        calls_land_by=datetime.now(UTC) - timedelta(seconds=1),
    )
    client = gateway.stripe_client()
    client.v1.payment_intents.create(
        params={
            "amount": row["amount_minor"],
            "currency": "usd",
            "customer": CUSTOMER,
            "payment_method": "pm_card_visa",
            "confirm": True,
            "off_session": True,
            "metadata": {"paycron_payment_id": str(row["id"])},
        }
    )
    for n in range(205):  # newer intents of the same customer: ours is on page 3
        client.v1.payment_intents.create(
            params={
                "amount": 100,
                "currency": "usd",
                "customer": CUSTOMER,
                "payment_method": "pm_card_visa",
                "confirm": True,
                "off_session": True,
                "metadata": {"paycron_payment_id": f"other-{n}"},
            }
        )
    result = CliRunner().invoke(
        main,
        ["dlq", "redrive", str(row["id"]), "--by", "ops"],
        env=cli_env(stripe_config),
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "completed" in result.output
    assert payment(conn, row["id"])["status"] == "COMPLETED"
    assert succeeded(gateway, row) == 1


def test_a_lookup_finding_another_amount_parks_lookup_mismatch_without_a_new_key(
    engine, conn, gateway, caplog
):
    row = a_payment(conn, failures=5, in_doubt=True, attempt=5)
    gateway.stripe_client().v1.payment_intents.create(
        params={
            "amount": row["amount_minor"] + 1,
            "currency": "usd",
            "customer": CUSTOMER,
            "payment_method": "pm_card_visa",
            "confirm": True,
            "off_session": True,
            "metadata": {"paycron_payment_id": str(row["id"])},
        }
    )
    gateway.faults(error_rate=1.0)  # the sixth call fails too: exhausted, looked up
    with caplog.at_level(logging.ERROR):
        engine.work()
    done = payment(conn, row["id"])
    assert (done["status"], done["failure_reason"], done["key_generation"]) == (
        "FAILED",
        "LOOKUP_MISMATCH",
        1,
    )
    assert (
        conn.execute(
            "SELECT reason FROM dead_letters WHERE payment_id = %s", (row["id"],)
        ).fetchone()["reason"]
        == "LOOKUP_MISMATCH"
    )
    assert any("another amount" in r.getMessage() for r in caplog.records)


def test_a_payment_in_doubt_at_the_fake_is_never_called_at_stripe(engine, conn, gateway):
    row = a_payment(conn, processor="fake", in_doubt=True)
    engine.drain()
    assert payment(conn, row["id"])["status"] == "PENDING"
    assert intents_for(gateway, row) == [] and attempts_of(conn, row["id"]) == []


def test_the_breaker_counts_rejected_keys_and_opens(stripe_config, conn, gateway):
    engine = Engine(stripe_config.with_overrides(circuit_min_calls=2))
    try:
        gateway.stripe(api_key="sk_test_rotated_elsewhere")
        for _ in range(3):
            a_payment(conn)
        engine.work()
        assert engine.breaker.state() is BreakerState.OPEN
    finally:
        engine.close()


def test_changed_parameters_under_a_live_key_are_looked_up_then_parked_and_paged(
    engine, conn, gateway, caplog
):
    row = a_payment(conn)
    # Another request already used the payment's key with other parameters
    # (as a changed API version or a bug would): Stripe answers idempotency_error.
    gateway.stripe_client().v1.payment_intents.create(
        params={
            "amount": row["amount_minor"] + 7,
            "currency": "usd",
            "customer": CUSTOMER,
            "payment_method": "pm_card_visa",
            "confirm": True,
            "off_session": True,
            "metadata": {"paycron_payment_id": "someone-else"},
        },
        options={"idempotency_key": str(row["id"])},
    )
    with caplog.at_level(logging.ERROR):
        engine.work()
    done = payment(conn, row["id"])
    assert (done["status"], done["failure_reason"], done["key_generation"]) == (
        "FAILED",
        "GATEWAY_REJECTED",
        1,
    )
    assert [a["outcome"] for a in attempts_of(conn, row["id"])] == ["REJECTED"]
    assert (
        conn.execute(
            "SELECT reason FROM dead_letters WHERE payment_id = %s", (row["id"],)
        ).fetchone()["reason"]
        == "GATEWAY_REJECTED"
    )
    assert any("GATEWAY_REJECTED" in r.getMessage() for r in caplog.records)
