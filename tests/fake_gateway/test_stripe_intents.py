"""The Stripe surface's payment intents through the official SDK: a charge, each
test payment method, a retry by confirming the same intent, cancel, and the
requests Stripe refuses before executing."""

from __future__ import annotations

import time

import pytest
import stripe

from devtools.fake_gateway import GatewayHandle
from tests.fake_gateway.stripeclient import card_error, charge, intent_params, new_key


def test_a_card_charge_succeeds_and_its_charge_carries_the_intents_metadata(
    sdk_client: stripe.StripeClient,
    gateway_handle: GatewayHandle,
) -> None:
    before = int(time.time())
    intent = charge(
        sdk_client, amount=1234, currency="USD", customer="cus_alice", payment_id="pay-42"
    )

    assert intent.id.startswith("pi_") and intent.object == "payment_intent"
    assert (intent.status, intent.amount, intent.currency) == ("succeeded", 1234, "usd")
    assert (intent.customer, intent.payment_method) == ("cus_alice", "pm_card_visa")
    assert intent.metadata.to_dict() == {"paycron_payment_id": "pay-42"}
    assert before <= intent.created <= time.time() + 1
    charge_ = sdk_client.v1.charges.retrieve(intent.latest_charge)
    assert charge_.id.startswith("ch_")
    assert (
        charge_.payment_intent,
        charge_.status,
        charge_.amount,
        charge_.currency,
        charge_.customer,
    ) == (intent.id, "succeeded", 1234, "usd", "cus_alice")
    assert charge_.metadata.to_dict() == {"paycron_payment_id": "pay-42"}
    assert (charge_.refunded, charge_.amount_refunded, charge_.paid) == (False, 0, True)
    assert sdk_client.v1.payment_intents.retrieve(intent.id).to_dict() == intent.to_dict()
    assert gateway_handle.succeeded_per_payment_id() == {"pay-42": 1}


@pytest.mark.parametrize(
    ("method", "code", "decline_code"),
    [
        ("pm_card_chargeDeclined", "card_declined", "generic_decline"),
        ("pm_card_chargeDeclinedInsufficientFunds", "card_declined", "insufficient_funds"),
        ("pm_card_chargeDeclinedProcessingError", "processing_error", None),
        ("pm_card_authenticationRequired", "authentication_required", "authentication_required"),
    ],
)
def test_each_declining_test_method_answers_402_with_the_intent_and_a_failed_charge(
    sdk_client: stripe.StripeClient,
    method: str,
    code: str,
    decline_code: str | None,
) -> None:
    error = card_error(sdk_client, method)

    assert error.http_status == 402 and error.error is not None
    assert (error.error.type, error.code, error.error.decline_code) == (
        "card_error",
        code,
        decline_code,
    )
    intent = error.error.payment_intent
    assert intent.status == "requires_payment_method"
    assert intent.payment_method is None  # Stripe clears it: a retry names one again
    assert intent.last_payment_error.code == code
    assert intent.last_payment_error.payment_method.id == method
    failed = sdk_client.v1.charges.retrieve(error.error.charge)
    assert (failed.status, failed.payment_intent, failed.failure_code) == (
        "failed",
        intent.id,
        code,
    )
    assert intent.latest_charge == failed.id


def test_authentication_on_session_waits_for_the_customer_without_charging(
    sdk_client: stripe.StripeClient,
    gateway_handle: GatewayHandle,
) -> None:
    intent = charge(sdk_client, "pm_card_authenticationRequired", off_session=False)
    assert intent.status == "requires_action" and intent.next_action.type == "use_stripe_sdk"
    assert intent.latest_charge is None
    assert gateway_handle.stripe_ledger()["charges"] == []


def test_a_retryable_decline_succeeds_when_the_same_intent_is_confirmed_again(
    sdk_client: stripe.StripeClient,
    gateway_handle: GatewayHandle,
) -> None:
    method = "pm_card_chargeDeclinedProcessingError"
    declined = card_error(sdk_client, method, payment_id="pay-retry").error.payment_intent

    # Stripe cleared the payment method: confirming without one is refused (and stored).
    with pytest.raises(stripe.InvalidRequestError) as missing:
        sdk_client.v1.payment_intents.confirm(declined.id, options={"idempotency_key": new_key()})
    assert missing.value.code == "payment_intent_unexpected_state"

    confirmed = sdk_client.v1.payment_intents.confirm(
        declined.id,
        params={"payment_method": method, "off_session": True},
        options={"idempotency_key": new_key()},
    )
    assert (confirmed.id, confirmed.status) == (declined.id, "succeeded")
    assert confirmed.latest_charge != declined.latest_charge
    assert confirmed.last_payment_error is None

    # An intent succeeds at most once.
    with pytest.raises(stripe.InvalidRequestError) as again:
        sdk_client.v1.payment_intents.confirm(
            declined.id,
            params={"payment_method": "pm_card_visa"},
            options={"idempotency_key": new_key()},
        )
    assert again.value.http_status == 400
    assert again.value.code == "payment_intent_unexpected_state"
    assert again.value.error.payment_intent.status == "succeeded"
    charges = gateway_handle.stripe_ledger()["charges"]
    assert sorted(c["status"] for c in charges) == ["failed", "succeeded"]
    assert gateway_handle.succeeded_per_payment_id() == {"pay-retry": 1}


def test_a_new_intent_with_the_retryable_method_declines_once_again(
    sdk_client: stripe.StripeClient,
) -> None:
    first = card_error(sdk_client, "pm_card_chargeDeclinedProcessingError")
    second = card_error(sdk_client, "pm_card_chargeDeclinedProcessingError")
    assert first.error.payment_intent.id != second.error.payment_intent.id


@pytest.mark.parametrize("advice", ["try_again_later", "do_not_try_again"])
def test_a_decline_carries_the_advice_code_set_by_the_control(
    sdk_client: stripe.StripeClient,
    gateway_handle: GatewayHandle,
    advice: str,
) -> None:
    assert card_error(sdk_client, "pm_card_chargeDeclined").error.advice_code is None
    gateway_handle.stripe(decline_advice_code=advice)
    error = card_error(sdk_client, "pm_card_chargeDeclinedInsufficientFunds").error
    assert error.advice_code == advice
    assert error.payment_intent.last_payment_error.advice_code == advice
    # 3-D Secure is not an issuer's advice.
    assert card_error(sdk_client, "pm_card_authenticationRequired").error.advice_code is None


def test_the_decline_rate_declines_a_card_that_would_succeed(
    sdk_client: stripe.StripeClient,
    gateway_handle: GatewayHandle,
) -> None:
    gateway_handle.faults(decline_rate=1.0)
    error = card_error(sdk_client, "pm_card_visa")
    assert (error.code, error.error.decline_code) == ("card_declined", "generic_decline")
    assert gateway_handle.stats()["declined"] == 1


def test_an_unconfirmed_intent_is_confirmed_or_cancelled_later(
    sdk_client: stripe.StripeClient,
) -> None:
    params = intent_params(confirm=False)
    waiting = sdk_client.v1.payment_intents.create(params=params)
    assert waiting.status == "requires_confirmation" and waiting.latest_charge is None
    assert sdk_client.v1.payment_intents.confirm(waiting.id).status == "succeeded"

    other = sdk_client.v1.payment_intents.create(params=params)
    cancelled = sdk_client.v1.payment_intents.cancel(
        other.id, params={"cancellation_reason": "abandoned"}
    )
    assert (cancelled.status, cancelled.cancellation_reason) == ("canceled", "abandoned")
    assert cancelled.canceled_at is not None
    with pytest.raises(stripe.InvalidRequestError) as confirm:
        sdk_client.v1.payment_intents.confirm(other.id)
    assert confirm.value.code == "payment_intent_unexpected_state"


def test_a_declined_intent_can_be_cancelled_but_a_succeeded_one_cannot(
    sdk_client: stripe.StripeClient,
) -> None:
    declined = card_error(sdk_client, "pm_card_authenticationRequired").error.payment_intent
    assert sdk_client.v1.payment_intents.cancel(declined.id).status == "canceled"

    succeeded = charge(sdk_client)
    with pytest.raises(stripe.InvalidRequestError) as refused:
        sdk_client.v1.payment_intents.cancel(succeeded.id)
    assert refused.value.code == "payment_intent_unexpected_state"
    assert sdk_client.v1.payment_intents.retrieve(succeeded.id).status == "succeeded"


@pytest.mark.parametrize(
    ("params", "code", "param"),
    [
        ({"payment_method": "pm_card_unknown"}, "resource_missing", "payment_method"),
        ({"amount": 100_000_000}, "amount_too_large", "amount"),
        ({"amount": 49}, "amount_too_small", "amount"),
        ({"amount": 29, "currency": "gbp"}, "amount_too_small", "amount"),
        ({"currency": None}, "parameter_missing", "currency"),
        ({"customer": "alice"}, "resource_missing", "customer"),
        ({"capture_method": "manual"}, "parameter_unknown", "capture_method"),
    ],
)
def test_invalid_requests_are_refused_before_executing_and_not_stored(
    sdk_client: stripe.StripeClient,
    gateway_handle: GatewayHandle,
    params: dict,
    code: str,
    param: str,
) -> None:
    key = new_key()
    with pytest.raises(stripe.InvalidRequestError) as refused:
        sdk_client.v1.payment_intents.create(
            params={**intent_params(), **params}, options={"idempotency_key": key}
        )
    assert (refused.value.http_status, refused.value.code, refused.value.param) == (
        400,
        code,
        param,
    )
    assert refused.value.error.type == "invalid_request_error"
    assert gateway_handle.stripe_ledger()["payment_intents"] == []
    # Nothing was stored for the key: a corrected request under it executes.
    assert charge(sdk_client, key=key).status == "succeeded"


def test_the_smallest_and_largest_amounts_are_accepted(sdk_client: stripe.StripeClient) -> None:
    assert charge(sdk_client, amount=50).status == "succeeded"
    assert charge(sdk_client, amount=30, currency="gbp").status == "succeeded"
    assert charge(sdk_client, amount=99_999_999).status == "succeeded"


def test_an_unknown_intent_is_404_resource_missing(sdk_client: stripe.StripeClient) -> None:
    with pytest.raises(stripe.InvalidRequestError) as missing:
        sdk_client.v1.payment_intents.retrieve("pi_nope")
    assert (missing.value.http_status, missing.value.code) == (404, "resource_missing")
    with pytest.raises(stripe.InvalidRequestError):
        sdk_client.v1.payment_intents.confirm("pi_nope")


def test_latest_charge_expands(sdk_client: stripe.StripeClient) -> None:
    intent = charge(sdk_client)
    expanded = sdk_client.v1.payment_intents.retrieve(
        intent.id, params={"expand": ["latest_charge"]}
    )
    assert expanded.latest_charge.id == intent.latest_charge
    assert expanded.latest_charge.status == "succeeded"
    with pytest.raises(stripe.InvalidRequestError):
        sdk_client.v1.payment_intents.retrieve(intent.id, params={"expand": ["customer"]})


def test_the_always_unavailable_amount_answers_503_every_time_and_stores_nothing(
    sdk_client: stripe.StripeClient,
    gateway_handle: GatewayHandle,
) -> None:
    """As on the card surface, 50003 is a 503 whatever the faults: never
    executed, never stored, so the same key gets a fresh 503 each time."""
    gateway_handle.faults(decline_rate=1.0)  # the magic amount ignores the faults
    key = new_key()
    for _ in range(2):
        with pytest.raises(stripe.APIError) as raised:
            charge(sdk_client, key=key, amount=50003, payment_id="pay-503")
        assert raised.value.http_status == 503
    assert gateway_handle.stripe_ledger()["payment_intents"] == []
    gateway_handle.faults(decline_rate=0.0)
    assert charge(sdk_client, amount=50004).status == "succeeded"  # only that amount
