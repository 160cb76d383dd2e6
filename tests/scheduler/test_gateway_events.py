"""Outcomes that arrive days later: AWAITING_GATEWAY, Stripe's
signed events received by the web, and the scheduler's gateway-event service
that applies them or polls — against the fake gateway's Stripe surface
through the official SDK, the stub's ledger and events as the truth."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from datetime import UTC, datetime, timedelta

import pytest

from devtools.fake_gateway import STRIPE_API_KEY
from paycron.processors.factory import build_processor
from scheduler.gateway_events import GatewayEventService
from tests.factories import add_dead_letter, insert_payment
from tests.inprocess import Engine
from tests.rows import attempts_of, count, event_types, payment
from web import close_app

SECRET = "whsec_paycron"  # the stub's default signing secret


@pytest.fixture
def engine(stripe_config, gateway):
    eng = Engine(stripe_config)
    yield eng
    eng.close()


@pytest.fixture
def service(stripe_config, engine):
    svc = GatewayEventService(
        config=stripe_config, pool=engine.pool, gateway=build_processor(stripe_config)
    )
    yield svc
    svc.close()


@pytest.fixture
def web(stripe_config):
    from web import create_app

    app = create_app(
        stripe_config.with_overrides(stripe_webhook_secret=("whsec_old_rotated_out", SECRET))
    )
    yield app.test_client()
    close_app(app)


def signed(payload: bytes, secret: str = SECRET, at: int | None = None) -> dict:
    at = int(time.time()) if at is None else at
    mac = hmac.new(secret.encode(), f"{at}.".encode() + payload, hashlib.sha256).hexdigest()
    return {"Stripe-Signature": f"t={at},v1={mac}", "Content-Type": "application/json"}


def waiting(engine, conn, method="pm_bank_processing_succeeds") -> dict:
    """A bank debit through the engine: accepted, processing, AWAITING_GATEWAY."""
    row = insert_payment(conn, payment_method=method, customer="cus_bank")
    engine.drain()
    after = payment(conn, row["id"])
    assert after["status"] == "AWAITING_GATEWAY", after
    return after


def events_of(gateway, intent: str) -> list[dict]:
    return [e for e in gateway.stripe_events() if e["object_id"] == intent]


def deliver(web, event: dict, **headers):
    payload = json.dumps(event).encode()
    return web.post("/v1/gateway-events/stripe", data=payload, headers=headers or signed(payload))


def settled_event(gateway, intent: str, kind: str) -> dict:
    """Settle the debit at the stub; the event it made, as Stripe sends it."""
    gateway.stripe_settle(intent)
    [summary] = [e for e in events_of(gateway, intent) if e["type"] == kind]
    answer = gateway.http.get(
        f"/stripe/v1/events/{summary['id']}", headers={"Authorization": f"Bearer {STRIPE_API_KEY}"}
    )
    answer.raise_for_status()
    return answer.json()


def test_a_bank_debit_waits_then_settles_from_its_signed_event(engine, service, web, conn, gateway):
    row = waiting(engine, conn)
    intent = row["gateway_intent_id"]
    assert [a["outcome"] for a in attempts_of(conn, row["id"])] == ["SUBMITTED"]
    assert "payment.awaiting_gateway" in event_types(conn, row["id"])
    engine.drain()  # not claimed, not reaped while waiting
    assert payment(conn, row["id"])["status"] == "AWAITING_GATEWAY"
    event = settled_event(gateway, intent, "payment_intent.succeeded")
    answer = deliver(web, event)
    assert answer.status_code == 200 and answer.json == {"received": True, "duplicate": False}
    assert payment(conn, row["id"])["status"] == "AWAITING_GATEWAY"  # the web only stores
    counts = service.run_once()
    done = payment(conn, row["id"])
    assert (counts.settled, done["status"]) == (1, "COMPLETED")
    assert gateway.succeeded_per_payment_id() == {str(row["id"]): 1}
    assert [a["outcome"] for a in attempts_of(conn, row["id"])] == ["SUBMITTED", "SUCCEEDED"]


def test_a_failed_debit_fails_the_payment_declined(engine, service, web, conn, gateway):
    row = waiting(engine, conn, method="pm_bank_processing_fails")
    deliver(web, settled_event(gateway, row["gateway_intent_id"], "payment_intent.payment_failed"))
    service.run_once()
    done = payment(conn, row["id"])
    assert (done["status"], done["failure_reason"]) == ("FAILED", "DECLINED")
    assert count(conn, "dead_letters") == 0  # the payer decides, not an operator


def test_the_same_event_twice_is_one_transition(engine, service, web, conn, gateway):
    row = waiting(engine, conn)
    event = settled_event(gateway, row["gateway_intent_id"], "payment_intent.succeeded")
    assert deliver(web, event).json["duplicate"] is False
    assert deliver(web, event).json["duplicate"] is True
    service.run_once()
    assert event_types(conn, row["id"]).count("payment.completed") == 1
    assert count(conn, "gateway_events") == 1


@pytest.mark.parametrize(
    "headers",
    [
        {},  # no signature
        {"Stripe-Signature": "t=1,v1=deadbeef"},  # a wrong one
        "stale",  # a good signature, ten minutes old
        "other-secret",  # signed with a secret we do not hold
    ],
)
def test_a_bad_signature_stores_nothing(web, conn, headers):
    event = {
        "id": "evt_1",
        "type": "payment_intent.succeeded",
        "data": {"object": {"id": "pi_1", "metadata": {}}},
    }
    payload = json.dumps(event).encode()
    if headers == "stale":
        headers = signed(payload, at=int(time.time()) - 600)
    elif headers == "other-secret":
        headers = signed(payload, secret="whsec_someone_else")
    answer = web.post(
        "/v1/gateway-events/stripe",
        data=payload,
        headers={"Content-Type": "application/json", **headers},
    )
    assert answer.status_code == 400 and answer.json["code"] == "INVALID_SIGNATURE"
    assert count(conn, "gateway_events") == 0


def test_without_a_signing_secret_the_endpoint_is_off(config):
    from web import create_app

    app = create_app(config)
    try:
        answer = app.test_client().post("/v1/gateway-events/stripe", data=b"{}")
        assert answer.status_code == 404  # Stripe retries it for days
    finally:
        close_app(app)


def test_a_lost_event_is_made_good_by_the_poller(engine, service, conn, gateway):
    row = waiting(engine, conn)
    gateway.stripe_settle(row["gateway_intent_id"])  # its event is never delivered
    assert service.run_once().polled == 0  # not due before GATEWAY_POLL_SECONDS
    conn.execute(
        "UPDATE payments SET next_poll_at = now() - interval '1 second' WHERE id = %s", (row["id"],)
    )
    counts = service.run_once()
    assert (counts.polled, counts.settled) == (1, 1)
    assert payment(conn, row["id"])["status"] == "COMPLETED"


def test_a_poll_that_finds_it_still_processing_backs_off(engine, service, conn, gateway):
    row = waiting(engine, conn)
    conn.execute(
        "UPDATE payments SET next_poll_at = now() - interval '1 second' WHERE id = %s", (row["id"],)
    )
    service.run_once()
    after = payment(conn, row["id"])
    assert (after["status"], after["polls"]) == ("AWAITING_GATEWAY", 1)
    wait = (after["next_poll_at"] - datetime.now(UTC)).total_seconds()
    assert 1700 < wait <= 1800  # then 30 min, 2 h, every 12 h


def test_an_event_for_another_intent_of_the_payment_changes_nothing(
    engine, service, web, conn, gateway
):
    row = waiting(engine, conn)
    other = gateway.stripe_client().v1.payment_intents.create(
        params={
            "amount": row["amount_minor"],
            "currency": "usd",
            "customer": "cus_bank",
            "payment_method": "pm_bank_processing_fails",
            "confirm": True,
            "off_session": True,
            "metadata": {"paycron_payment_id": str(row["id"])},
        }
    )
    deliver(web, settled_event(gateway, other.id, "payment_intent.payment_failed"))
    service.run_once()
    assert payment(conn, row["id"])["status"] == "AWAITING_GATEWAY"


def test_an_event_whose_contents_disagree_with_the_processor_changes_nothing(
    engine, service, web, conn, gateway
):
    row = waiting(engine, conn)
    victim = waiting(engine, conn)
    event = settled_event(gateway, row["gateway_intent_id"], "payment_intent.succeeded")
    # a validly signed event whose payload names another payment than the intent does
    event["data"]["object"]["metadata"]["paycron_payment_id"] = str(victim["id"])
    event["id"] = "evt_forged_contents"
    deliver(web, event)
    service.run_once()
    assert payment(conn, victim["id"])["status"] == "AWAITING_GATEWAY"
    assert (
        conn.execute(
            "SELECT result FROM gateway_events WHERE id = 'evt_forged_contents'"
        ).fetchone()["result"]
        == "disagrees"
    )


def test_an_event_before_its_payment_recorded_the_call_waits(engine, service, web, conn, gateway):
    row = waiting(engine, conn)
    event = settled_event(gateway, row["gateway_intent_id"], "payment_intent.succeeded")
    # as if the worker had not written its answer yet
    conn.execute(
        "UPDATE payments SET status = 'PENDING', gateway_intent_id = NULL, "
        "awaiting_since = NULL, next_poll_at = NULL WHERE id = %s",
        (row["id"],),
    )
    deliver(web, event)
    assert service.run_once().waiting == 1
    pending = conn.execute("SELECT applied_at, next_attempt_at FROM gateway_events").fetchone()
    assert pending["applied_at"] is None and pending["next_attempt_at"] > datetime.now(UTC)
    # the worker's retry under the same key replays "processing": it waits, then the event applies
    engine.drain()
    conn.execute("UPDATE gateway_events SET next_attempt_at = now()")
    service.run_once()
    assert payment(conn, row["id"])["status"] == "COMPLETED"
    assert gateway.succeeded_per_payment_id() == {str(row["id"]): 1}


def test_a_success_for_a_failed_payments_intent_pages(engine, service, web, conn, gateway, caplog):
    row = waiting(engine, conn)
    event = settled_event(gateway, row["gateway_intent_id"], "payment_intent.succeeded")
    conn.execute(
        "UPDATE payments SET status = 'FAILED', failure_reason = 'DECLINED' WHERE id = %s",
        (row["id"],),
    )
    deliver(web, event)
    with caplog.at_level(logging.ERROR):
        assert service.run_once().paged == 1
    assert payment(conn, row["id"])["status"] == "FAILED"
    assert any("money moved" in r.getMessage() for r in caplog.records)


def test_a_waiting_payment_cannot_be_cancelled(engine, conn, gateway, stripe_config, make_key):
    from web import create_app

    app = create_app(stripe_config)
    try:
        key = make_key("alice")
        row = waiting(engine, conn)
        answer = app.test_client().delete(
            f"/v1/scheduled-payments/{row['id']}", headers={"Authorization": f"Bearer {key}"}
        )
        assert answer.status_code == 409 and answer.json["code"] == "ALREADY_PROCESSING"
    finally:
        close_app(app)


def test_a_redrive_that_finds_the_debit_processing_waits_for_it(
    engine, conn, gateway, stripe_config
):
    from paycron.engine import dead_letters

    row = insert_payment(
        conn,
        status="FAILED",
        failure_reason="RETRIES_EXHAUSTED",
        in_doubt=True,
        customer="cus_bank",
        payment_method="pm_bank_processing_succeeds",
        calls_land_by=datetime.now(UTC) - timedelta(seconds=1),
    )
    add_dead_letter(conn, row)
    intent = gateway.stripe_client().v1.payment_intents.create(
        params={
            "amount": row["amount_minor"],
            "currency": "usd",
            "customer": "cus_bank",
            "payment_method": "pm_bank_processing_succeeds",
            "confirm": True,
            "off_session": True,
            "metadata": {"paycron_payment_id": str(row["id"])},
        }
    )
    result = dead_letters.redrive(conn, engine.gateway, row["id"], actor="ops")
    after = payment(conn, row["id"])
    assert result.action == "awaiting_gateway"
    assert (after["status"], after["gateway_intent_id"], after["in_doubt"]) == (
        "AWAITING_GATEWAY",
        intent.id,
        False,
    )


def test_waiting_payments_are_counted_with_their_age(engine, conn, gateway):
    from paycron.store import stats

    assert stats.health(conn)["awaiting_gateway"] == 0
    waiting(engine, conn)
    figures = stats.health(conn)
    assert figures["awaiting_gateway"] == 1 and figures["oldest_awaiting_age"] >= 0
    assert figures["backlog"] == 0  # never late: not in the backlog


def test_a_signature_dated_in_the_future_stores_nothing(web, conn):
    payload = json.dumps({"id": "evt_future", "type": "payment_intent.succeeded"}).encode()
    answer = web.post(
        "/v1/gateway-events/stripe",
        data=payload,
        headers=signed(payload, at=int(time.time()) + 86400),
    )
    assert answer.status_code == 400 and answer.json["code"] == "INVALID_SIGNATURE"
    assert count(conn, "gateway_events") == 0
    within = web.post(
        "/v1/gateway-events/stripe", data=payload, headers=signed(payload, at=int(time.time()) + 60)
    )
    assert within.status_code == 200  # clocks drift: the tolerance holds both ways


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'[{"id": "evt_1"}]',
        b'{"type": "payment_intent.succeeded"}',
        b'{"id": 7, "type": "x"}',
        b'{"id": "evt_1"}',
        b'{"id": "evt_1", "type": "x", "data": "nope"}',
        b'{"id": "evt_1", "type": "x", "data": {"object": []}}',
        b'{"id": "evt_1", "type": "x", "data": {"object": {"metadata": "m"}}}',
        b'"evt_1"',
        b"not json",
    ],
)
def test_a_signed_body_that_is_no_event_is_a_400_not_a_500(web, conn, body):
    answer = web.post("/v1/gateway-events/stripe", data=body, headers=signed(body))
    assert answer.status_code == 400, answer.data
    assert answer.json["code"] == "INVALID_EVENT"
    assert count(conn, "gateway_events") == 0


def _missing_pages() -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("paycron_processor_payment_missing_total") or 0.0


def test_a_waiting_payment_the_processor_does_not_hold_is_paged_at_each_poll(
    engine, service, conn, gateway, caplog
):
    """Its intent cannot be retrieved (a 404: another account's, or gone): the
    poller pages (ERROR, the metric, the run's counts) instead of asking in
    silence at every interval forever."""
    row = waiting(engine, conn)
    conn.execute(
        "UPDATE payments SET gateway_intent_id = 'pi_of_another_account',"
        " next_poll_at = now() - interval '1 second' WHERE id = %s",
        (row["id"],),
    )
    before = _missing_pages()
    with caplog.at_level(logging.ERROR, logger="paycron.gateway_events"):
        counts = service.run_once()
    assert (counts.polled, counts.paged) == (1, 1)
    assert _missing_pages() == before + 1
    [paged] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert str(row["id"]) in paged.getMessage() and "pi_of_another_account" in paged.getMessage()
    assert payment(conn, row["id"])["status"] == "AWAITING_GATEWAY"  # a human settles it


def test_an_event_about_an_intent_the_processor_does_not_hold_is_paged(
    engine, service, web, conn, gateway, caplog
):
    row = waiting(engine, conn)
    event = {
        "id": "evt_about_another_account",
        "type": "payment_intent.succeeded",
        "data": {
            "object": {
                "id": "pi_of_another_account",
                "object": "payment_intent",
                "metadata": {"paycron_payment_id": str(row["id"])},
            }
        },
    }
    assert deliver(web, event).status_code == 200
    before = _missing_pages()
    with caplog.at_level(logging.ERROR, logger="paycron.gateway_events"):
        counts = service.run_once()
    assert counts.paged == 1 and _missing_pages() == before + 1
    assert service.run_once().applied == 0  # done with: not retried in silence
    assert payment(conn, row["id"])["status"] == "AWAITING_GATEWAY"
