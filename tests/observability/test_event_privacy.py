"""Operators act on payers' payments (redrive, refund, complete): the payer's
events say that an operator acted, never who (docs/design.md). The audit keeps the
name (dead_letters.resolved_by, refunds.requested_by)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from paycron.store.events import to_wire
from tests.factories import park
from web import close_app


@pytest.fixture
def app(config, gateway):  # a redrive looks the charge up at the gateway
    from web import create_app

    application = create_app(config)
    yield application
    close_app(application)


def test_a_redrive_shows_the_payer_an_operator_not_the_name(client, alice, make_key, conn):
    admin = {"Authorization": f"Bearer {make_key('ops-ann-smith', admin=True)}"}
    row = park(conn, last_error=None)
    response = client.post(f"/v1/admin/dead-letters/{row['id']}/redrive", headers=admin)
    assert response.status_code == 200, response.get_json()

    deadline = time.monotonic() + 15  # the feed holds an event back while an older
    while True:  # transaction anywhere on the server is open
        feed = client.get("/v1/events", headers=alice)
        assert feed.status_code == 200
        found = [e for e in feed.get_json()["data"] if e["paymentId"] == str(row["id"])]
        if found or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    [event] = found
    assert event["type"] == "payment.pending"
    assert event["data"] == {"reason": "redriven", "by": "operator"}
    assert "ops-ann-smith" not in feed.get_data(as_text=True)
    audit = conn.execute("SELECT resolved_by FROM dead_letters").fetchone()
    assert audit["resolved_by"] == "ops-ann-smith"


def test_the_wire_form_hides_whoever_is_stored(conn):
    """Also events stored before this rule, and in webhook bodies (same function)."""
    event = {
        "id": 1,
        "type": "payment.refunded",
        "payment_id": "p",
        "status": "COMPLETED",
        "attempt": 1,
        "data": {"refundId": "re_1", "by": "ops-bo"},
        "created_at": datetime.now(UTC),
    }
    assert to_wire(event)["data"] == {"refundId": "re_1", "by": "operator"}
    assert event["data"]["by"] == "ops-bo"  # the row read is not changed
