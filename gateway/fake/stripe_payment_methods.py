"""The Stripe surface's PaymentMethods: retrieve, attach to a customer, detach.

As at Stripe, a PaymentMethod belongs to at most one customer (its
``customer`` field; null while unattached). Stripe's test tokens
(``pm_card_visa`` and the rest of `stripe_methods.PAYMENT_METHODS`) retrieve
as unattached methods of their type; attaching one makes a new method
(``pm_…``) of the same kind, attached to the customer, as Stripe does. A
method attached to one customer cannot be attached to another; a detached
one cannot be used again. Charging with a made method behaves as its token;
charging a customer with a method attached to another customer is refused
(400, before anything executes), as at Stripe.

* ``GET /v1/payment_methods/{id}``
* ``POST /v1/payment_methods/{id}/attach`` with ``customer``
* ``POST /v1/payment_methods/{id}/detach``
"""

from __future__ import annotations

from aiohttp import web

from gateway.fake.jsonapi import json_response
from gateway.fake.stripe_methods import PAYMENT_METHODS, MethodSpec
from gateway.fake.stripe_objects import StripeObject, new_id
from gateway.fake.stripe_wire import StripeError, check_known, missing, parse_form, string


class PaymentMethods:
    """The methods made by attaching test tokens, and whose each one is."""

    def __init__(self, now) -> None:
        self._now = now
        self._made: dict[str, StripeObject] = {}
        self._token_of: dict[str, str] = {}  # a made method -> the test token it was made from
        self._detached: set[str] = set()

    def spec(self, method_id: str, *, usable_only: bool = True) -> MethodSpec | None:
        """What charging with `method_id` does (None: no such method, or detached)."""
        if usable_only and method_id in self._detached:
            return None
        return PAYMENT_METHODS.get(self._token_of.get(method_id, method_id))

    def check_customer(self, method_id: str, customer: str | None) -> None:
        """Stripe's refusal of a charge naming a customer with a method
        attached to another customer (a test token, attached to none, goes)."""
        made = self._made.get(method_id)
        if customer is None or made is None or made["customer"] in (None, customer):
            return
        raise StripeError(
            400,
            f"The customer does not have a payment method with the ID {method_id}. The "
            "payment method must be attached to the customer.",
            param="payment_method",
        )

    def get(self, method_id: str) -> StripeObject | None:
        made = self._made.get(method_id)
        if made is not None:
            return dict(made)
        spec = PAYMENT_METHODS.get(method_id)
        if spec is None:
            return None
        return _method(method_id, spec.type, None, 0)

    def attach(self, method_id: str, customer: str) -> StripeObject:
        made = self._made.get(method_id)
        if made is None:
            spec = PAYMENT_METHODS.get(method_id)
            if spec is None:
                raise missing("PaymentMethod", method_id, "payment_method")
            made = _method(new_id("pm_"), spec.type, customer, self._now())
            self._made[made["id"]] = made
            self._token_of[made["id"]] = method_id
            return dict(made)
        if method_id in self._detached:
            raise StripeError(
                400,
                "The provided PaymentMethod was previously used with a PaymentIntent without "
                "Customer attachment, shared with a connected account without Customer "
                "attachment, or was detached from a Customer. It may not be used again.",
                code="payment_method_unexpected_state",
                param="payment_method",
            )
        if made["customer"] not in (None, customer):
            raise StripeError(
                400,
                "The payment method you provided has already been attached to a customer.",
                code="payment_method_unexpected_state",
                param="payment_method",
            )
        made["customer"] = customer
        return dict(made)

    def detach(self, method_id: str) -> StripeObject:
        made = self._made.get(method_id)
        if made is None or made["customer"] is None:
            raise StripeError(
                400,
                "The payment method you provided is not attached to a customer so "
                "detachment is impossible.",
                code="payment_method_unexpected_state",
                param="payment_method",
            )
        made["customer"] = None
        self._detached.add(method_id)
        return dict(made)


def _method(method_id: str, kind: str, customer: str | None, created: int) -> StripeObject:
    return {
        "id": method_id,
        "object": "payment_method",
        "type": kind,
        "customer": customer,
        "created": created,
        "livemode": False,
        "metadata": {},
    }


class PaymentMethodRoutes:
    """The handlers, over the current ledger's methods (a new set after a reset)."""

    def __init__(self, methods) -> None:
        self.methods = methods  # () -> PaymentMethods

    async def retrieve(self, request: web.Request, call) -> web.StreamResponse:
        params = parse_form(request.query_string)
        check_known(params, frozenset({"expand"}))
        found = self.methods().get(request.match_info["id"])
        if found is None:
            raise missing("payment_method", request.match_info["id"], "payment_method")
        return json_response(200, found)

    async def attach(self, request: web.Request, call) -> web.StreamResponse:
        params = parse_form((await request.read()).decode(errors="replace"))
        check_known(params, frozenset({"customer", "expand"}))
        customer = string(params, "customer", required=True) or ""
        if not customer.startswith("cus_"):
            raise missing("customer", customer, "customer", 400)
        return json_response(200, self.methods().attach(request.match_info["id"], customer))

    async def detach(self, request: web.Request, call) -> web.StreamResponse:
        params = parse_form((await request.read()).decode(errors="replace"))
        check_known(params, frozenset({"expand"}))
        return json_response(200, self.methods().detach(request.match_info["id"]))
