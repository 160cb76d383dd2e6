"""Stripe's idempotency and the injected faults on the Stripe surface, through the
official SDK: replays byte for byte (a decline and a 500 included), 409 while a
key is in use, 400 on other parameters, retention, and what each fault leaves
behind."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import stripe

from devtools.fake_gateway import GatewayHandle
from tests.fake_gateway.conftest import CLI_API_KEY
from tests.fake_gateway.fakeclient import charge as card_charge
from tests.fake_gateway.stripeclient import (
    card_error,
    charge,
    intent_params,
    new_key,
    raw_charge,
    sdk,
)


def test_the_same_key_and_parameters_replay_the_stored_answer_byte_for_byte(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
) -> None:
    key = new_key()
    first = raw_charge(gateway_handle, key)
    second = raw_charge(gateway_handle, key)
    assert (first.status_code, second.status_code) == (200, 200)
    assert second.content == first.content
    assert second.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert second.headers["Request-Id"] != first.headers["Request-Id"]

    # The SDK sends the same request: form-encoded, nested metadata, parameters in any order.
    through_sdk = sdk_client.v1.payment_intents.create(
        params={
            "metadata": {"paycron_payment_id": "pay-raw"},
            "off_session": True,
            "confirm": True,
            "payment_method": "pm_card_visa",
            "customer": "cus_raw",
            "currency": "usd",
            "amount": 1000,
        },
        options={"idempotency_key": key},
    )
    assert through_sdk.id == first.json()["id"]
    assert through_sdk.last_response.headers["Idempotent-Replayed"] == "true"
    assert len(gateway_handle.stripe_ledger()["payment_intents"]) == 1
    assert gateway_handle.stats()["replays"] == 2


def test_a_stored_decline_is_replayed_and_charges_nothing_more(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
) -> None:
    key = new_key()
    first = card_error(sdk_client, "pm_card_chargeDeclined", key=key)
    replay = card_error(sdk_client, "pm_card_chargeDeclined", key=key)
    assert replay.http_body == first.http_body
    assert replay.headers["idempotent-replayed"] == "true"
    assert len(gateway_handle.stripe_ledger()["charges"]) == 1


def test_a_500_after_the_charge_is_stored_and_replayed_while_the_charge_stands(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
) -> None:
    gateway_handle.faults(error_after_charge_rate=1.0)
    key = new_key()
    with pytest.raises(stripe.APIError) as failed:
        charge(sdk_client, key=key, customer="cus_500", payment_id="pay-500")
    assert failed.value.http_status == 500 and failed.value.error.type == "api_error"
    assert failed.value.headers["stripe-should-retry"] == "false"

    gateway_handle.faults(reset=True)
    with pytest.raises(stripe.APIError) as replayed:
        charge(sdk_client, key=key, customer="cus_500", payment_id="pay-500")
    assert replayed.value.http_status == 500
    assert replayed.value.headers["idempotent-replayed"] == "true"
    assert replayed.value.http_body == failed.value.http_body

    # The charge happened: only a lookup tells.
    [found] = sdk_client.v1.payment_intents.list(params={"customer": "cus_500"}).data
    assert (found.status, found.metadata["paycron_payment_id"]) == ("succeeded", "pay-500")
    assert gateway_handle.succeeded_per_payment_id() == {"pay-500": 1}
    assert gateway_handle.stats()["stored_errors"] == 1


def test_server_errors_and_timeouts_before_execution_are_not_stored(
    gateway_handle: GatewayHandle,
    fake_gateway_url: str,
) -> None:
    client = sdk(gateway_handle.stripe_url, timeout=0.3)
    key = new_key()
    gateway_handle.faults(error_rate=1.0)
    with pytest.raises(stripe.APIError) as failed:
        charge(client, key=key)
    assert failed.value.http_status in (500, 502, 503)
    gateway_handle.faults(reset=True, timeout_rate=1.0, timeout_sleep_ms=600)
    with pytest.raises(stripe.APIConnectionError):
        charge(client, key=key)
    assert gateway_handle.stripe_ledger()["payment_intents"] == []

    gateway_handle.faults(reset=True)
    while True:  # the timed-out request holds the key until its sleep ends
        try:
            retried = charge(client, key=key)
            break
        except stripe.APIError as exc:
            assert exc.http_status == 409
    assert retried.status == "succeeded"
    assert "Idempotent-Replayed" not in retried.last_response.headers


def test_a_dropped_answer_still_charged_and_the_retry_replays_it(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
) -> None:
    gateway_handle.faults(charge_then_drop_rate=1.0)
    key = new_key()
    with pytest.raises(stripe.APIConnectionError):
        charge(sdk_client, key=key, payment_id="pay-drop")
    [intent] = gateway_handle.stripe_ledger()["payment_intents"]
    assert intent["status"] == "succeeded"
    retried = charge(sdk_client, key=key, payment_id="pay-drop")
    assert retried.id == intent["id"]
    assert retried.last_response.headers["Idempotent-Replayed"] == "true"


def test_a_key_still_in_use_answers_409(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
) -> None:
    gateway_handle.faults(latency_ms=700)
    key = new_key()

    def attempt() -> object:
        try:
            return charge(sdk_client, key=key)
        except stripe.StripeError as exc:
            return exc

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(attempt)
        gateway_handle.stripe_state()  # the first request is in by now (its latency runs)
        second = pool.submit(attempt)
        answers = [first.result(), second.result()]
    [conflict] = [answer for answer in answers if isinstance(answer, stripe.APIError)]
    [intent] = [answer for answer in answers if isinstance(answer, stripe.PaymentIntent)]
    # APIError carries no `code`: an adapter reads `error.code` (docs/design.md: by status and code)
    assert conflict.http_status == 409 and conflict.error.code == "idempotency_key_in_use"
    assert conflict.error.type == "invalid_request_error"
    assert conflict.headers["stripe-should-retry"] == "true"
    assert intent.status == "succeeded"
    assert len(gateway_handle.stripe_ledger()["payment_intents"]) == 1
    assert gateway_handle.stats()["in_use"] == 1


def test_the_same_key_with_other_parameters_or_endpoint_is_an_idempotency_error(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
) -> None:
    key = new_key()
    intent = charge(sdk_client, key=key, amount=1000)
    with pytest.raises(stripe.IdempotencyError) as other_amount:
        charge(sdk_client, key=key, amount=1001)
    assert other_amount.value.http_status == 400
    assert other_amount.value.error.type == "idempotency_error"
    assert key in other_amount.value.user_message
    with pytest.raises(stripe.IdempotencyError):
        sdk_client.v1.refunds.create(
            params={"payment_intent": intent.id}, options={"idempotency_key": key}
        )
    assert len(gateway_handle.stripe_ledger()["payment_intents"]) == 1
    assert gateway_handle.stats()["key_mismatches"] == 2


def test_stripe_keys_live_apart_from_the_card_surfaces(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
) -> None:
    key = new_key()
    assert card_charge(gateway_handle.http, key).status_code == 201
    assert charge(sdk_client, key=key).status == "succeeded"


def test_keys_are_forgotten_after_the_retention_but_intents_stay_listed(
    short_memory_gateway_url: str,
) -> None:
    import time

    client = sdk(short_memory_gateway_url + "/stripe", CLI_API_KEY)
    key = new_key()
    first = charge(client, key=key, customer="cus_forgot", payment_id="pay-forgot")
    assert charge(client, key=key, customer="cus_forgot", payment_id="pay-forgot").id == first.id

    time.sleep(1.2)
    second = charge(client, key=key, customer="cus_forgot", payment_id="pay-forgot")
    assert second.id != first.id
    assert "Idempotent-Replayed" not in second.last_response.headers
    listed = client.v1.payment_intents.list(params={"customer": "cus_forgot"})
    assert [i.id for i in listed.data] == [second.id, first.id]


def test_the_rate_ceiling_answers_429_to_every_call(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
) -> None:
    gateway_handle.faults(rate_limit_per_s=1)
    errors = []
    for call in (
        lambda: charge(sdk_client),
        lambda: charge(sdk_client),
        lambda: sdk_client.v1.payment_intents.list(),
    ):
        try:
            call()
        except stripe.RateLimitError as exc:
            errors.append(exc)
    assert errors  # three calls well within two one-second windows
    for error in errors:
        assert (error.http_status, error.error.code, error.error.type) == (
            429,
            "rate_limit",
            "invalid_request_error",
        )
    assert gateway_handle.stats()["rate_limited"] == len(errors)


def test_an_intents_answer_waits_the_injected_latency(
    gateway_handle: GatewayHandle,
    sdk_client: stripe.StripeClient,
) -> None:
    gateway_handle.faults(latency_ms=30)
    intent = charge(sdk_client)
    assert intent.last_response.headers["Fake-Latency-Ms"] == "30.000"
    listed = sdk_client.v1.payment_intents.list()
    assert "Fake-Latency-Ms" not in listed.last_response.headers


def test_the_params_the_engine_sends_are_one_fingerprint(sdk_client: stripe.StripeClient) -> None:
    key = new_key()
    first = sdk_client.v1.payment_intents.create(
        params=intent_params(), options={"idempotency_key": key}
    )
    again = sdk_client.v1.payment_intents.create(
        params=dict(reversed(intent_params().items())), options={"idempotency_key": key}
    )
    assert again.id == first.id
