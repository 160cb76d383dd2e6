"""``POST /v1/gateway-events/stripe``: Stripe's signed events, kept for the scheduler.

Authenticated by the processor's signature alone (docs/design.md): the SDK's
``Webhook.construct_event`` against each of ``STRIPE_WEBHOOK_SECRET``'s
secrets (a list, so one can be rotated), with its timestamp tolerance. A
verified event is stored once (idempotent on its id) and answered 200 at
once: no call to Stripe in a web thread — the scheduler's gateway-event
service retrieves the intent before anything changes. Without a secret
configured the endpoint is off (404); Stripe retries a delivery that was not
answered 2xx for days, so an event sent before an operator sets the secret
is not lost.
"""

from __future__ import annotations

import json
import re
import time

import stripe
from flask import current_app, request
from marshmallow import fields

from paycron.store import processor_events as gateway_events
from web.api import Blueprint
from web.problems import Problem, problem
from web.schemas import ResponseSchema

bp = Blueprint(
    "gateway_events",
    __name__,
    description="Inbound events of the payment processor (signed by it).",
)

#: Stripe's own default: a signature older than this is refused (replays).
SIGNATURE_TOLERANCE_SECONDS = 300


class ReceivedSchema(ResponseSchema):
    received = fields.Boolean(metadata={"enum": [True]})
    duplicate = fields.Boolean()


def _signed_at(signature: str) -> int | None:
    for part in signature.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _verified(payload: bytes, signature: str, secrets: tuple[str, ...]) -> dict:
    """The event, once its signature checks out with one of ``secrets``
    and it was signed within the tolerance of now, before or after (the
    SDK checks only the past: a signature dated tomorrow would replay until
    then)."""
    signed_at = _signed_at(signature)
    if signed_at is not None and signed_at > time.time() + SIGNATURE_TOLERANCE_SECONDS:
        raise Problem(400, "INVALID_SIGNATURE", "the Stripe-Signature is dated in the future")
    for secret in secrets:
        try:
            stripe.WebhookSignature.verify_header(
                payload, signature, secret, tolerance=SIGNATURE_TOLERANCE_SECONDS
            )
            break
        except stripe.SignatureVerificationError:
            continue
        except UnicodeDecodeError:  # not text: nothing a signature could make right
            break
    else:
        raise Problem(
            400, "INVALID_SIGNATURE", "the Stripe-Signature header is missing, wrong or too old"
        )
    return _event(payload)


def _event(payload: bytes) -> dict:
    """A signed body that is no event is refused (400, stored nowhere), so
    the processor stops retrying it rather than meeting a 500 for days."""
    try:
        event = json.loads(payload)
    except ValueError:
        event = None
    if not isinstance(event, dict):
        raise Problem(400, "INVALID_EVENT", "the signed body is not a JSON object")
    event_id, kind = event.get("id"), event.get("type")
    if not isinstance(event_id, str) or not _EVENT_ID.fullmatch(event_id):
        raise Problem(400, "INVALID_EVENT", "the event has no id (evt_…)")
    if not isinstance(kind, str) or not 0 < len(kind) <= 100:
        raise Problem(400, "INVALID_EVENT", "the event has no type")
    data = event.get("data", {})
    if not isinstance(data, dict) or not isinstance(data.get("object", {}), dict):
        raise Problem(400, "INVALID_EVENT", "the event's data is not an object")
    metadata = data.get("object", {}).get("metadata", {})
    if metadata is not None and not isinstance(metadata, dict):
        raise Problem(400, "INVALID_EVENT", "the object's metadata is not an object")
    return event


#: Stripe's event ids: a prefix and letters and digits, well under 255.
_EVENT_ID = re.compile(r"[A-Za-z0-9_]{1,255}")


@bp.post("/v1/gateway-events/stripe")
@bp.response(200, ReceivedSchema, description="Verified and stored (or already stored).")
@bp.alt_response(
    400,
    **problem(
        "No, a wrong, a stale or a future-dated signature (INVALID_SIGNATURE), or a signed "
        "body that is no event (INVALID_EVENT): nothing is stored."
    ),
)
@bp.alt_response(
    404,
    **problem(
        "No signing secret is configured (NOT_FOUND): the endpoint is off; Stripe retries later."
    ),
)
def receive_stripe_event():
    """Receive one of Stripe's signed events (configure this URL at Stripe)."""
    secrets = current_app.extensions["paycron.config"].stripe_webhook_secret
    if not secrets:
        raise Problem(
            404, "NOT_FOUND", "inbound Stripe events are off: STRIPE_WEBHOOK_SECRET is not set"
        )
    signature = request.headers.get("Stripe-Signature", "")
    event = _verified(request.get_data(cache=False), signature, secrets)
    with current_app.extensions["paycron.pool"].connection() as conn:
        stored = gateway_events.store(conn, processor="stripe", event=event)
    return {"received": True, "duplicate": not stored}
