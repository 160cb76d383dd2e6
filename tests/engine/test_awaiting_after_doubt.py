"""A bank debit still processing for a payment parked in doubt is followed
to its end (docs/money-safety.md).

Neither a refund nor reconciliation may dismiss or defer it forever: either
finds the processor still processing the payment's intent, moves the
payment to AWAITING_GATEWAY on it, and the poller records the charge when
the debit settles. The Stripe SDK against the fake's Stripe surface; its
ledger is the truth.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from paycron.engine import dead_letters
from paycron.processors.factory import build_processor
from paycron.store.db import make_pool
from reconciliation.report import fetch_window
from reconciliation.run import reconcile_day
from scheduler.gateway_events import GatewayEventService
from tests.factories import park
from tests.rows import attempts_of, letter, payment

CUSTOMER = "cus_slow_bank"


@pytest.fixture
def stripe(stripe_config, gateway):
    gateway.stripe(settle_delay_ms=3_600_000)  # settled when the test says so
    adapter = build_processor(stripe_config)
    yield adapter
    adapter.close()


def parked_with_a_debit_processing(conn, gateway) -> tuple[dict, str]:
    """Parked in doubt; the lost call's bank debit is still processing at Stripe."""
    row = park(
        conn,
        in_doubt=True,
        processor="stripe",
        customer=CUSTOMER,
        payment_method="pm_bank_processing_succeeds",
        calls_land_by=datetime.now(UTC) - timedelta(seconds=1),
        in_doubt_since=datetime.now(UTC) - timedelta(minutes=30),
    )
    intent = gateway.stripe_client().v1.payment_intents.create(
        params={
            "amount": row["amount_minor"],
            "currency": "usd",
            "customer": CUSTOMER,
            "payment_method": "pm_bank_processing_succeeds",
            "confirm": True,
            "off_session": True,
            "metadata": {"paycron_payment_id": str(row["id"])},
        },
        options={"idempotency_key": str(row["id"])},
    )
    assert intent.status == "processing"
    return row, intent.id


def settle_and_poll(conn, gateway, stripe_config, row, intent) -> None:
    gateway.stripe_settle(intent)
    conn.execute("UPDATE payments SET next_poll_at = now() WHERE id = %s", (row["id"],))
    pool = make_pool(stripe_config, max_size=2, name="test-awaiting-after-doubt")
    service = GatewayEventService(
        config=stripe_config, pool=pool, gateway=build_processor(stripe_config)
    )
    try:
        service.run_once()
    finally:
        service.close()
        pool.close()


def test_a_refund_finding_the_debit_processing_makes_it_wait_then_it_completes(
    conn, gateway, stripe, stripe_config
):
    row, intent = parked_with_a_debit_processing(conn, gateway)
    answer = dead_letters.refund(conn, stripe, row["id"], actor="ops")
    assert answer.action == "awaiting_gateway" and intent in answer.detail
    waiting = payment(conn, row["id"])
    assert (waiting["status"], waiting["gateway_intent_id"]) == ("AWAITING_GATEWAY", intent)
    assert letter(conn, row["id"])["resolution"] is not None  # back in the machine's hands
    settle_and_poll(conn, gateway, stripe_config, row, intent)
    done = payment(conn, row["id"])
    assert done["status"] == "COMPLETED"
    assert attempts_of(conn, row["id"])[-1]["outcome"] == "SUCCEEDED"
    assert gateway.succeeded_per_payment_id() == {str(row["id"]): 1}


def test_reconciliation_finding_the_debit_processing_makes_it_wait_then_it_completes(
    conn, gateway, stripe, stripe_config
):
    row, intent = parked_with_a_debit_processing(conn, gateway)
    day = datetime.now(UTC).date()
    result = reconcile_day(conn, day, fetch_window(stripe, day), source="gateway", gateway=stripe)
    assert result.exit_code == 0
    waiting = payment(conn, row["id"])
    assert (waiting["status"], waiting["gateway_intent_id"]) == ("AWAITING_GATEWAY", intent)
    settle_and_poll(conn, gateway, stripe_config, row, intent)
    assert payment(conn, row["id"])["status"] == "COMPLETED"
    assert gateway.succeeded_per_payment_id() == {str(row["id"]): 1}
