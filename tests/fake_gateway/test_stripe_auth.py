"""Authentication and API versions on the Stripe surface: the secret key (a
control and a command-line flag), Stripe's 401 with the key masked, and the
Stripe-Version remembered."""

from __future__ import annotations

import pytest
import stripe

from devtools.fake_gateway import STRIPE_API_KEY, GatewayHandle
from tests.fake_gateway.conftest import CLI_API_KEY
from tests.fake_gateway.stripeclient import charge, new_key, raw_charge, sdk

WRONG_KEY = "sk_test_51TotallyWrongKeyForTheStubXyZ9"


def test_a_wrong_key_is_401_with_the_key_masked(gateway_handle: GatewayHandle) -> None:
    with pytest.raises(stripe.AuthenticationError) as refused:
        charge(sdk(gateway_handle.stripe_url, WRONG_KEY))
    error = refused.value
    assert error.http_status == 401 and error.error.type == "invalid_request_error"
    message = error.user_message
    assert message.startswith("Invalid API Key provided: sk_test_") and message.endswith("XyZ9")
    assert "*" * 20 in message and WRONG_KEY not in message and WRONG_KEY not in error.http_body
    assert gateway_handle.stripe_ledger()["payment_intents"] == []
    assert gateway_handle.stats()["auth_failures"] == 1


def test_no_key_is_401_and_nothing_is_stored_for_the_key(gateway_handle: GatewayHandle) -> None:
    key = new_key()
    anonymous = gateway_handle.http.post(
        "/stripe/v1/payment_intents", headers={"Idempotency-Key": key}, data={"amount": "1"}
    )
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["message"].startswith("You did not provide an API key.")
    assert raw_charge(gateway_handle, key, api_key=WRONG_KEY).status_code == 401
    # The refusals touched no key: the first authenticated request under it executes.
    accepted = raw_charge(gateway_handle, key)
    assert accepted.status_code == 200 and "Idempotent-Replayed" not in accepted.headers


def test_the_key_is_a_control_and_reset_restores_it(gateway_handle: GatewayHandle) -> None:
    other = "sk_test_rotated_key_for_the_stub_0001"
    state = gateway_handle.stripe(api_key=other)
    assert other not in str(state)  # shown masked
    with pytest.raises(stripe.AuthenticationError):
        charge(sdk(gateway_handle.stripe_url, STRIPE_API_KEY))
    assert charge(sdk(gateway_handle.stripe_url, other)).status == "succeeded"
    gateway_handle.reset()
    assert charge(sdk(gateway_handle.stripe_url, STRIPE_API_KEY)).status == "succeeded"


def test_the_key_is_a_command_line_flag(short_memory_gateway_url: str) -> None:
    base = short_memory_gateway_url + "/stripe"
    assert charge(sdk(base, CLI_API_KEY)).status == "succeeded"
    with pytest.raises(stripe.AuthenticationError):
        charge(sdk(base, STRIPE_API_KEY))


def test_any_stripe_version_is_accepted_and_the_last_one_remembered(
    gateway_handle: GatewayHandle,
) -> None:
    assert gateway_handle.stripe_state()["last_stripe_version"] is None
    pinned = sdk(gateway_handle.stripe_url, version="2026-10-28.endive")
    intent = charge(pinned)
    assert intent.last_response.headers["Stripe-Version"] == "2026-10-28.endive"
    charge(sdk(gateway_handle.stripe_url, version="2099-01-01.future"))
    state = gateway_handle.stripe_state()
    assert state["last_stripe_version"] == "2099-01-01.future"
    assert state["stripe_versions"] == {"2026-10-28.endive": 1, "2099-01-01.future": 1}
    event = pinned.v1.events.list(params={"type": "payment_intent.succeeded"}).data[-1]
    assert (event.api_version, event.data.object.id) == ("2026-10-28.endive", intent.id)


def test_bad_settings_are_refused_whole(gateway_handle: GatewayHandle) -> None:
    for bad in (
        {"api_key": "pk_test_publishable"},
        {"search_lag_ms": -1},
        {"webhook_loss_rate": 2},
        {"decline_advice_code": "maybe"},
        {"webhook_urls": ["ftp://x"]},
        {"nonsense": 1},
        {"settle_delay_ms": 10, "webhook_secrets": []},
    ):
        response = gateway_handle.http.post("/_stripe", json=bad)
        assert response.status_code == 400, bad
    assert gateway_handle.stripe_state()["settings"]["settle_delay_ms"] == 5000
