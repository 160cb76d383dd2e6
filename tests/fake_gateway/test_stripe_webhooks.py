"""Asynchronous outcomes on the Stripe surface: bank debits that process, then
settle; the signed events they send, verified by the SDK's own
`Webhook.construct_event`; and deliveries retried, duplicated, lost and
reordered."""

from __future__ import annotations

import time

import pytest
import stripe

from devtools.fake_gateway import STRIPE_WEBHOOK_SECRET, GatewayHandle
from tests.fake_gateway.stripeclient import charge
from tests.support import WebhookReceiver

SETTLED = ["payment_intent.succeeded", "payment_intent.payment_failed"]


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_bank_debit_processes_then_settles_with_a_signed_event(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
    receiver: WebhookReceiver,
) -> None:
    gateway_handle.stripe(settle_delay_ms=300, webhook_urls=[receiver.url], enabled_events=SETTLED)
    intent = charge(sdk_client, "pm_bank_processing_succeeds", payment_id="pay-debit")
    assert intent.status == "processing"
    pending = sdk_client.v1.charges.retrieve(intent.latest_charge)
    assert (pending.status, pending.paid) == ("pending", False)
    assert gateway_handle.stripe_state()["processing"] == [intent.id]

    [delivery] = receiver.wait_for(1)
    headers, body = delivery.headers, delivery.body
    event = stripe.Webhook.construct_event(body, headers["Stripe-Signature"], STRIPE_WEBHOOK_SECRET)
    assert event.object == "event" and event.type == "payment_intent.succeeded"
    assert event.id.startswith("evt_")
    assert (event.data.object.id, event.data.object.status) == (intent.id, "succeeded")
    assert event.data.object.metadata["paycron_payment_id"] == "pay-debit"
    assert event.request.id is None  # settled by the bank, not by a request
    assert headers["Content-Type"].startswith("application/json")
    assert sdk_client.v1.payment_intents.retrieve(intent.id).status == "succeeded"
    assert sdk_client.v1.charges.retrieve(intent.latest_charge).status == "succeeded"
    assert gateway_handle.succeeded_per_payment_id() == {"pay-debit": 1}


def test_a_failing_debit_settles_now_on_the_control(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
    receiver: WebhookReceiver,
) -> None:
    gateway_handle.stripe(webhook_urls=[receiver.url], enabled_events=SETTLED)
    intent = charge(sdk_client, "pm_bank_processing_fails")
    assert intent.status == "processing"
    assert gateway_handle.stripe_settle() == [intent.id]
    assert gateway_handle.stripe_settle(intent.id) == []  # settled already

    failed = sdk_client.v1.payment_intents.retrieve(intent.id)
    assert (failed.status, failed.payment_method) == ("requires_payment_method", None)
    assert failed.last_payment_error.code == "payment_method_provider_decline"
    assert sdk_client.v1.charges.retrieve(intent.latest_charge).status == "failed"
    [delivery] = receiver.wait_for(1)
    headers, body = delivery.headers, delivery.body
    event = stripe.Webhook.construct_event(body, headers["Stripe-Signature"], STRIPE_WEBHOOK_SECRET)
    assert (event.type, event.data.object.id) == ("payment_intent.payment_failed", intent.id)


def test_a_tampered_or_foreign_event_is_refused_and_a_rolled_secret_verifies(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
    receiver: WebhookReceiver,
) -> None:
    gateway_handle.stripe(
        webhook_urls=[receiver.url],
        enabled_events=SETTLED,
        webhook_secrets=["whsec_old_secret", "whsec_new_secret"],
    )
    charge(sdk_client, "pm_bank_processing_succeeds")
    gateway_handle.stripe_settle()
    [delivery] = receiver.wait_for(1)
    headers, body = delivery.headers, delivery.body
    signature = headers["Stripe-Signature"]
    assert signature.count("v1=") == 2
    for secret in ("whsec_old_secret", "whsec_new_secret"):
        stripe.Webhook.construct_event(body, signature, secret)

    tampered = body.replace(b'"succeeded"', b'"canceled"', 1)
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(tampered, signature, "whsec_new_secret")
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(body, signature, STRIPE_WEBHOOK_SECRET)
    timestamp = int(signature.split(",")[0].removeprefix("t="))
    assert abs(timestamp - time.time()) < 5  # fresh: the SDK refuses one over 300 s old


def test_a_failed_delivery_is_retried_with_the_same_body(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
    receiver: WebhookReceiver,
) -> None:
    gateway_handle.stripe(
        webhook_urls=[receiver.url],
        enabled_events=SETTLED,
        webhook_retry_ms=30,
        webhook_max_attempts=4,
    )
    receiver.statuses = [500, 503]
    charge(sdk_client, "pm_bank_processing_succeeds")
    gateway_handle.stripe_settle()
    deliveries = receiver.wait_for(3)
    assert len({d.body for d in deliveries}) == 1
    for d in deliveries:
        stripe.Webhook.construct_event(d.body, d.headers["Stripe-Signature"], STRIPE_WEBHOOK_SECRET)

    def deliveries() -> list[tuple]:
        return [
            (d["status"], d["attempts"], d["last_status"])
            for e in gateway_handle.stripe_events()
            for d in e["deliveries"]
        ]

    wait_until(lambda: deliveries() == [("delivered", 3, 200)])
    assert gateway_handle.stats()["delivery_failures"] == 2


def test_an_endpoint_that_never_answers_2xx_is_given_up_on(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
    receiver: WebhookReceiver,
) -> None:
    gateway_handle.stripe(
        webhook_urls=[receiver.url],
        enabled_events=SETTLED,
        webhook_retry_ms=10,
        webhook_max_attempts=2,
    )
    receiver.statuses = [400, 400]
    charge(sdk_client, "pm_bank_processing_succeeds")
    gateway_handle.stripe_settle()
    receiver.wait_for(2)
    wait_until(
        lambda: any(
            d["status"] == "failed" for e in gateway_handle.stripe_events() for d in e["deliveries"]
        )
    )


def test_events_can_be_duplicated_lost_or_shuffled(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
    receiver: WebhookReceiver,
) -> None:
    gateway_handle.stripe(
        webhook_urls=[receiver.url], enabled_events=SETTLED, webhook_duplicate_rate=1.0
    )
    charge(sdk_client, "pm_bank_processing_succeeds")
    gateway_handle.stripe_settle()
    first, second = (d.json() for d in receiver.wait_for(2))
    assert first["id"] == second["id"]  # the same event twice: receivers dedupe on its id

    gateway_handle.stripe(webhook_duplicate_rate=0.0, webhook_loss_rate=1.0)
    lost = charge(sdk_client, "pm_bank_processing_succeeds")
    gateway_handle.stripe_settle()
    statuses = [
        d["status"]
        for e in gateway_handle.stripe_events()
        if e["object_id"] == lost.id
        for d in e["deliveries"]
    ]
    assert statuses == ["lost"]
    assert gateway_handle.stats()["events_lost"] == 1

    gateway_handle.stripe(webhook_loss_rate=0.0, webhook_reorder_ms=400)
    intents = [charge(sdk_client, "pm_bank_processing_succeeds").id for _ in range(10)]
    gateway_handle.stripe_settle()
    receiver.wait_for(12)
    arrived = [event["data"]["object"]["id"] for event in receiver.events()[2:]]
    assert sorted(arrived) == sorted(intents)
    assert arrived != intents  # 1 chance in 10! to arrive in order


def test_every_change_makes_an_event_and_enabled_events_choose_what_is_sent(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
    receiver: WebhookReceiver,
) -> None:
    gateway_handle.stripe(webhook_urls=[receiver.url])  # enabled_events: "*"
    intent = charge(sdk_client)
    types = [e.type for e in sdk_client.v1.events.list().auto_paging_iter()][::-1]
    assert types == ["payment_intent.created", "charge.succeeded", "payment_intent.succeeded"]
    assert len(receiver.wait_for(3)) == 3
    created = sdk_client.v1.events.list(params={"type": "payment_intent.created"}).data[0]
    assert created.request.idempotency_key is not None and created.data.object.id == intent.id

    gateway_handle.stripe(enabled_events=["charge.refunded"])
    sdk_client.v1.refunds.create(params={"payment_intent": intent.id})
    [fourth] = receiver.wait_for(4)[3:]
    assert fourth.json()["type"] == "charge.refunded"


def test_a_reset_cancels_a_pending_settlement(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
    receiver: WebhookReceiver,
) -> None:
    gateway_handle.stripe(settle_delay_ms=200, webhook_urls=[receiver.url])
    charge(sdk_client, "pm_bank_processing_succeeds")
    gateway_handle.reset()
    time.sleep(0.3)
    assert gateway_handle.stripe_events() == []
    assert gateway_handle.stats()["settled"] == 0
