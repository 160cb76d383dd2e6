"""Reconciliation against Stripe (docs/design.md): the day's charges listed through
the SDK (every page) from the fake's Stripe surface, its ledger the oracle,
through the real ``paycron reconcile`` command."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from paycron.cli import main
from tests.factories import insert_payment
from tests.inprocess import Engine
from tests.rows import payment

CUSTOMER = "cus_recon"


@pytest.fixture
def engine(stripe_config, gateway):
    eng = Engine(stripe_config)
    yield eng
    eng.close()


def reconcile(config, day, code=0):
    env = {
        "DATABASE_URL": config.database_url,
        "REDIS_URL": config.redis_url,
        "REDIS_NAMESPACE": config.redis_namespace,
        "GATEWAY": "stripe",
        "STRIPE_API_KEY": config.stripe_api_key,
        "STRIPE_API_BASE": config.stripe_api_base,
        "SENTRY_DSN": None,
    }
    result = CliRunner().invoke(
        main, ["reconcile", "--date", str(day)], env=env, catch_exceptions=False
    )
    assert result.exit_code == code, result.output
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\w+) +(\d+)$", result.stdout, re.MULTILINE)
    }


def test_a_day_through_stripe_matches_every_charge_and_ignores_declines(
    engine, stripe_config, conn, gateway
):
    methods = ["pm_card_visa"] * 110 + ["pm_card_chargeDeclined"] * 5
    rows = [insert_payment(conn, customer=CUSTOMER, payment_method=m) for m in methods]
    engine.drain(rounds=40)
    assert sum(payment(conn, r["id"])["status"] == "COMPLETED" for r in rows) == 110
    figures = reconcile(stripe_config, datetime.now(UTC).date())
    # 115 charges (the declines are failed charges) on two pages of 100
    assert (figures["charges"], figures["matched"], figures["mismatches"]) == (115, 110, 0)
    assert figures["completed_without_charge"] == 0


def test_a_charge_our_side_missed_is_repaired_and_a_double_charge_pages(
    engine, stripe_config, conn, gateway
):
    missed = insert_payment(
        conn,
        customer=CUSTOMER,
        payment_method="pm_card_visa",
        status="FAILED",
        failure_reason="RETRIES_EXHAUSTED",
        in_doubt=True,
        attempt=6,
        failures=6,
    )
    twice = insert_payment(conn, customer=CUSTOMER, payment_method="pm_card_visa")
    engine.drain()
    client = gateway.stripe_client()
    for row in (missed, twice):  # the missed one's only charge; the other's second
        client.v1.payment_intents.create(
            params={
                "amount": row["amount_minor"],
                "currency": "usd",
                "customer": CUSTOMER,
                "payment_method": "pm_card_visa",
                "confirm": True,
                "off_session": True,
                "metadata": {"paycron_payment_id": str(row["id"])},
            },
            options={"idempotency_key": f"{row['id']}:9"},
        )  # another key generation
    figures = reconcile(stripe_config, datetime.now(UTC).date(), code=1)
    assert (figures["repaired"], figures["duplicate_charge"]) == (1, 1)
    assert payment(conn, missed["id"])["status"] == "COMPLETED"
