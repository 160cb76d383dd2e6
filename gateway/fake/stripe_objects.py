"""Stripe's objects as the wire carries them: payment intents, charges, refunds,
events, and the error a decline answers.

Plain dicts, built here only, with the fields of Stripe's API reference that
an integration reads (ids, statuses, amounts, the customer, the payment
method, metadata, unix-second timestamps). The ledger changes an object by
replacing its top-level values, never by mutating a nested one, so a
snapshot (an event's, the search index's) is a shallow copy.
"""

from __future__ import annotations

import secrets
from typing import Any

from gateway.fake.stripe_methods import Decline

StripeObject = dict[str, Any]

#: Where Stripe documents each error code (the SDK exposes it as `error.doc_url`).
DOC_URL = "https://stripe.com/docs/error-codes/{}"


def new_id(prefix: str) -> str:
    """A fresh object id with Stripe's prefix (`pi_`, `ch_`, `py_`, `re_`, `evt_`, `req_`)."""
    return prefix + secrets.token_hex(12)


def doc_url(code: str) -> str:
    """The documentation link Stripe puts on an error with `code`."""
    return DOC_URL.format(code.replace("_", "-"))


def payment_intent(
    *,
    amount: int,
    currency: str,
    customer: str | None,
    payment_method: str | None,
    metadata: dict[str, str],
    description: str | None,
    created: int,
    method_type: str,
) -> StripeObject:
    """A new PaymentIntent, not yet confirmed."""
    intent_id = new_id("pi_")
    return {
        "id": intent_id,
        "object": "payment_intent",
        "amount": amount,
        "amount_capturable": 0,
        "amount_received": 0,
        "canceled_at": None,
        "cancellation_reason": None,
        "capture_method": "automatic",
        "client_secret": f"{intent_id}_secret_{secrets.token_hex(12)}",
        "confirmation_method": "automatic",
        "created": created,
        "currency": currency,
        "customer": customer,
        "description": description,
        "last_payment_error": None,
        "latest_charge": None,
        "livemode": False,
        "metadata": metadata,
        "next_action": None,
        "payment_method": payment_method,
        "payment_method_types": [method_type],
        "processing": None,
        "setup_future_usage": None,
        "status": "requires_confirmation" if payment_method else "requires_payment_method",
    }


def charge(intent: StripeObject, payment_method: str, prefix: str, created: int) -> StripeObject:
    """A new charge of `intent`'s amount, still pending; Stripe copies the intent's metadata."""
    return {
        "id": new_id(prefix),
        "object": "charge",
        "amount": intent["amount"],
        "amount_captured": 0,
        "amount_refunded": 0,
        "balance_transaction": None,
        "captured": False,
        "created": created,
        "currency": intent["currency"],
        "customer": intent["customer"],
        "description": intent["description"],
        "failure_code": None,
        "failure_message": None,
        "livemode": False,
        "metadata": dict(intent["metadata"]),
        "outcome": None,
        "paid": False,
        "payment_intent": intent["id"],
        "payment_method": payment_method,
        "refunded": False,
        "status": "pending",
    }


def succeed_charge(charge_: StripeObject) -> None:
    """The charge went through."""
    charge_.update(
        status="succeeded",
        paid=True,
        captured=True,
        amount_captured=charge_["amount"],
        outcome={
            "network_status": "approved_by_network",
            "reason": None,
            "seller_message": "Payment complete.",
            "type": "authorized",
        },
    )


def fail_charge(charge_: StripeObject, decline: Decline) -> None:
    """The charge was declined."""
    charge_.update(
        status="failed",
        failure_code=decline.code,
        failure_message=decline.message,
        outcome={
            "network_status": "declined_by_network",
            "reason": decline.decline_code or decline.code,
            "seller_message": "The bank did not return any further details with this decline.",
            "type": "issuer_declined",
        },
    )


def payment_error(
    decline: Decline,
    charge_id: str,
    payment_method: str,
    method_type: str,
    advice_code: str | None,
) -> StripeObject:
    """A decline as `last_payment_error` (and, with the intent added, as the 402's `error`)."""
    error: StripeObject = {
        "type": "card_error",
        "code": decline.code,
        "message": decline.message,
        "charge": charge_id,
        "doc_url": doc_url(decline.code),
        "payment_method": {"id": payment_method, "object": "payment_method", "type": method_type},
    }
    if decline.decline_code is not None:
        error["decline_code"] = decline.decline_code
    if advice_code is not None and decline.advisable:
        error["advice_code"] = advice_code
    return error


def refund(
    charge_: StripeObject, amount: int, reason: str | None, metadata: dict[str, str], created: int
) -> StripeObject:
    """A succeeded refund of `amount` of `charge_`."""
    return {
        "id": new_id("re_"),
        "object": "refund",
        "amount": amount,
        "charge": charge_["id"],
        "created": created,
        "currency": charge_["currency"],
        "metadata": metadata,
        "payment_intent": charge_["payment_intent"],
        "reason": reason,
        "status": "succeeded",
    }


def event(
    event_type: str,
    obj: StripeObject,
    *,
    created: int,
    api_version: str,
    request_id: str | None,
    idempotency_key: str | None,
) -> StripeObject:
    """An Event carrying a snapshot of `obj` as it is now (see the module docstring)."""
    return {
        "id": new_id("evt_"),
        "object": "event",
        "api_version": api_version,
        "created": created,
        "data": {"object": dict(obj)},
        "livemode": False,
        "pending_webhooks": 0,
        "request": {"id": request_id, "idempotency_key": idempotency_key},
        "type": event_type,
    }
