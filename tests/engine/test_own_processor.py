"""A payment is only ever asked about at its own processor (docs/money-safety.md).

A process configured for one processor (``GATEWAY=fake``, the default) must
not take the other processor's silence for an answer about a payment first
called at Stripe: its lookup, re-drive, refund, poll and event application
all refuse. Real Postgres, the fake gateway, and the Stripe SDK against the
fake's Stripe surface, whose ledger is the truth.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from paycron.engine import dead_letters, lookups
from paycron.errors import DeadLetterActionRefused, OtherProcessor
from paycron.processors.factory import build_processor
from paycron.store import transitions
from paycron.store.clock import database_now
from paycron.store.db import make_pool
from scheduler.gateway_events import GatewayEventService
from tests.factories import insert_payment, park
from tests.inprocess import Engine
from tests.rows import letter, payment

CUSTOMER = "cus_own_processor"


def charged_at_stripe(gateway, row) -> str:
    """The payment's first call charged at Stripe, its answer lost."""
    intent = gateway.stripe_client().v1.payment_intents.create(
        params={
            "amount": row["amount_minor"],
            "currency": "usd",
            "customer": CUSTOMER,
            "payment_method": "pm_card_visa",
            "confirm": True,
            "off_session": True,
            "metadata": {"paycron_payment_id": str(row["id"])},
        },
        options={"idempotency_key": str(row["id"])},
    )
    return intent.id


def parked_at_stripe(conn) -> dict:
    return park(
        conn,
        in_doubt=True,
        processor="stripe",
        customer=CUSTOMER,
        payment_method="pm_card_visa",
        calls_land_by=datetime.now(UTC) - timedelta(seconds=1),
        in_doubt_since=datetime.now(UTC) - timedelta(minutes=30),
    )


@pytest.fixture
def fake(config, gateway):
    """The processor adapter of a process left at ``GATEWAY=fake``."""
    adapter = build_processor(config)
    yield adapter
    adapter.close()


@pytest.fixture
def stripe(stripe_config):
    adapter = build_processor(stripe_config)
    yield adapter
    adapter.close()


def test_a_redrive_from_a_process_of_another_processor_is_refused(
    conn, gateway, fake, stripe, stripe_config
):
    row = parked_at_stripe(conn)
    charged_at_stripe(gateway, row)
    with pytest.raises(DeadLetterActionRefused, match="stripe"):
        dead_letters.redrive(conn, fake, row["id"], actor="ops-fake")
    after = payment(conn, row["id"])
    assert (after["status"], after["key_generation"], after["in_doubt"]) == ("FAILED", 1, True)
    assert letter(conn, row["id"])["resolution"] is None
    # Nothing was sent to Stripe under a new key, even once a Stripe engine runs.
    engine = Engine(stripe_config)
    try:
        engine.drain()
    finally:
        engine.close()
    assert gateway.succeeded_per_payment_id() == {str(row["id"]): 1}
    # From a process configured for Stripe, the re-drive finds the charge.
    done = dead_letters.redrive(conn, stripe, row["id"], actor="ops-stripe")
    assert done.action == "completed"
    assert payment(conn, row["id"])["status"] == "COMPLETED"
    assert gateway.succeeded_per_payment_id() == {str(row["id"]): 1}


def test_a_lookup_at_another_processor_raises_instead_of_answering_none(conn, fake):
    row = parked_at_stripe(conn)
    with pytest.raises(OtherProcessor):
        lookups.ask_processor(fake, row, now=database_now(conn))
    # and the re-drive's write itself is fenced on the payment's processor
    assert not transitions.redrive(conn, row["id"], actor="ops-fake", processor="fake")
    assert payment(conn, row["id"])["key_generation"] == 1


def test_a_refund_from_a_process_of_another_processor_is_refused(conn, gateway, fake, stripe):
    row = parked_at_stripe(conn)
    charged_at_stripe(gateway, row)
    with pytest.raises(DeadLetterActionRefused, match="called at stripe"):
        dead_letters.refund(conn, fake, row["id"], actor="ops-fake")
    assert letter(conn, row["id"])["resolution"] is None
    assert gateway.stripe_ledger()["refunds"] == []


def test_the_poller_and_event_applier_leave_another_processors_payments(
    conn, gateway, config, stripe_config
):
    waiting = insert_payment(
        conn,
        status="AWAITING_GATEWAY",
        processor="stripe",
        customer=CUSTOMER,
        payment_method="pm_bank_processing_succeeds",
        gateway_intent_id="pi_waits_at_stripe",
        awaiting_since=datetime.now(UTC) - timedelta(hours=1),
        next_poll_at=datetime.now(UTC) - timedelta(seconds=1),
    )
    conn.execute(
        "INSERT INTO gateway_events (processor, id, type, intent_id, payment_id, payload) "
        "VALUES ('stripe', 'evt_1', 'payment_intent.succeeded', 'pi_waits_at_stripe', %s, '{}')",
        (waiting["id"],),
    )
    pool = make_pool(config, max_size=2, name="test-own-processor")
    service = GatewayEventService(config=config, pool=pool, gateway=build_processor(config))
    try:
        counts = service.run_once()
    finally:
        service.close()
        pool.close()
    assert (counts.polled, counts.applied, counts.failed) == (0, 0, 0)
    after = payment(conn, waiting["id"])
    assert (after["polls"], after["next_poll_at"]) == (0, waiting["next_poll_at"])
    event = conn.execute("SELECT * FROM gateway_events WHERE id = 'evt_1'").fetchone()
    assert (event["attempts"], event["applied_at"]) == (0, None)
