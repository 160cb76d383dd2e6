"""Driving the fake's Stripe surface through the official SDK: the helpers its tests share."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import stripe

from devtools.fake_gateway import STRIPE_API_KEY, GatewayHandle

#: The version the engine pins (paycron.config.STRIPE_API_VERSION); the stub takes any.
API_VERSION = "2026-10-28.endive"


def sdk(
    url: str,
    api_key: str = STRIPE_API_KEY,
    *,
    timeout: float | None = None,
    version: str = API_VERSION,
) -> stripe.StripeClient:
    """A StripeClient on the fake at `url` (its Stripe base, `…/stripe`), as the engine
    builds it."""
    options: dict[str, Any] = {}
    if timeout is not None:
        options["http_client"] = stripe.RequestsClient(timeout=timeout)
    return stripe.StripeClient(
        api_key,
        base_addresses={"api": url},
        max_network_retries=0,
        stripe_version=version,
        **options,
    )


def new_key() -> str:
    return f"pay-{uuid.uuid4()}"


def intent_params(
    method: str = "pm_card_visa",
    *,
    amount: int = 1000,
    currency: str = "usd",
    customer: str = "cus_test",
    payment_id: str = "pay-1",
    **extra: Any,
) -> dict[str, Any]:
    """The engine's charge: confirm now, off session, the payment id in the metadata."""
    return {
        "amount": amount,
        "currency": currency,
        "customer": customer,
        "payment_method": method,
        "confirm": True,
        "off_session": True,
        "metadata": {"paycron_payment_id": payment_id},
        **extra,
    }


def charge(
    client: stripe.StripeClient,
    method: str = "pm_card_visa",
    *,
    key: str | None = None,
    **params: Any,
) -> stripe.PaymentIntent:
    """`POST /v1/payment_intents` as the engine sends it."""
    return client.v1.payment_intents.create(
        params=intent_params(method, **params), options={"idempotency_key": key or new_key()}
    )


def card_error(client: stripe.StripeClient, method: str, **params: Any) -> stripe.CardError:
    """The 402 a charge with `method` answers."""
    try:
        charge(client, method, **params)
    except stripe.CardError as exc:
        return exc
    raise AssertionError(f"{method} did not decline")


def raw_charge(
    gateway: GatewayHandle,
    key: str,
    *,
    api_key: str = STRIPE_API_KEY,
    amount: int = 1000,
    payment_id: str = "pay-raw",
) -> httpx.Response:
    """The same request without the SDK, to see the bytes and headers of the answer."""
    return gateway.http.post(
        "/stripe/v1/payment_intents",
        headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": key},
        data={
            "amount": str(amount),
            "currency": "usd",
            "customer": "cus_raw",
            "payment_method": "pm_card_visa",
            "confirm": "true",
            "off_session": "true",
            "metadata[paycron_payment_id]": payment_id,
        },
    )
