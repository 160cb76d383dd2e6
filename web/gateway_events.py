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

import stripe
from flask import current_app, request
from marshmallow import fields

from paycron.store import processor_events as gateway_events
from web.api import Blueprint
from web.problems import Problem, problem
from web.schemas import Answer

bp = Blueprint(
    "gateway_events",
    __name__,
    description="Inbound events of the payment processor (signed by it).",
)

#: Stripe's own default: a signature older than this is refused (replays).
SIGNATURE_TOLERANCE_SECONDS = 300


class ReceivedSchema(Answer):
    received = fields.Boolean(metadata={"enum": [True]})
    duplicate = fields.Boolean()


def _verified(payload: bytes, signature: str, secrets: tuple[str, ...]) -> stripe.Event:
    for secret in secrets:
        try:
            return stripe.Webhook.construct_event(
                payload, signature, secret, tolerance=SIGNATURE_TOLERANCE_SECONDS
            )
        except stripe.SignatureVerificationError:
            continue
        except ValueError:  # not JSON: nothing a signature could make right
            break
    raise Problem(
        400, "INVALID_SIGNATURE", "the Stripe-Signature header is missing, wrong or too old"
    )


@bp.post("/v1/gateway-events/stripe")
@bp.response(200, ReceivedSchema, description="Verified and stored (or already stored).")
@bp.alt_response(
    400, **problem("No, a wrong or a stale signature (INVALID_SIGNATURE): nothing is stored.")
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
        stored = gateway_events.store(conn, processor="stripe", event=event.to_dict())
    return {"received": True, "duplicate": not stored}
