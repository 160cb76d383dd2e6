"""The Stripe-shaped surface: Stripe's API under ``/stripe`` (docs/design.md), over the
processor every surface shares; this module holds its writes.

Point the official SDK at it with ``base_addresses={"api": "<fake>/stripe"}``.

* ``POST /v1/payment_intents`` (``confirm=true`` charges at once),
  ``POST /v1/payment_intents/{id}/confirm``, ``…/cancel``,
  ``GET /v1/payment_intents/{id}``, ``GET /v1/payment_intents`` (customer,
  created, cursors: strongly consistent), ``GET /v1/payment_intents/search``
  (lags by ``search_lag_ms``); ``POST /v1/refunds``, ``GET /v1/refunds[/{id}]``;
  ``GET /v1/charges[/{id}]``; ``GET /v1/events[/{id}]``;
  ``GET /v1/payment_methods/{id}``, ``…/attach``, ``…/detach``
  (`stripe_payment_methods`: whose customer each method is).
* Auth: ``Authorization: Bearer <the configured key>`` or 401. Any
  ``Stripe-Version`` is accepted and remembered (``GET /_stripe``).
* Every POST is idempotent per ``Idempotency-Key`` as at Stripe
  (`stripe_idempotency`); the reads are `stripe_reads`.
* Faults: the rate ceiling applies to every call (429 ``rate_limit``); the
  charge faults (latency, timeouts, 5xx, declines, dropped answers, and
  ``error_after_charge_rate``: execute, then a stored 500) to creating and
  confirming intents. Test payment methods: `stripe_methods`. As on the
  card surface, an intent of 50003 (minor units) always answers 503 whatever
  the faults (never executed, never stored): a stub-only test input.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.fake.errors import RateLimited
from gateway.fake.jsonapi import latency_headers
from gateway.fake.processor import UNAVAILABLE, FakeProcessor, Fate, Outcome
from gateway.fake.stripe_idempotency import Answer, Call, once
from gateway.fake.stripe_ledger import StripeLedger
from gateway.fake.stripe_methods import MAX_AMOUNT, MethodSpec, minimum_amount
from gateway.fake.stripe_objects import StripeObject
from gateway.fake.stripe_payment_methods import PaymentMethodRoutes
from gateway.fake.stripe_reads import StripeReads, check_expansions, expand, find_intent
from gateway.fake.stripe_settings import StripeSettings
from gateway.fake.stripe_webhooks import Webhooks
from gateway.fake.stripe_wire import (
    Params,
    StripeError,
    authenticate,
    boolean,
    check_known,
    integer,
    invalid,
    metadata,
    missing,
    parse_form,
    string,
)

PREFIX = "/stripe"
CREATE_PARAMS = frozenset(
    {
        "amount",
        "currency",
        "customer",
        "payment_method",
        "confirm",
        "off_session",
        "metadata",
        "description",
        "expand",
        "payment_method_types",
        "receipt_email",
        "statement_descriptor",
        "statement_descriptor_suffix",
        "error_on_requires_action",
        "return_url",
    }
)
CONFIRM_PARAMS = frozenset(
    {
        "payment_method",
        "off_session",
        "expand",
        "error_on_requires_action",
        "return_url",
        "receipt_email",
    }
)
CANCEL_REASONS = ("duplicate", "fraudulent", "requested_by_customer", "abandoned")
REFUND_REASONS = ("duplicate", "fraudulent", "requested_by_customer")
#: The states Stripe confirms or cancels an intent from.
CONFIRMABLE = ("requires_payment_method", "requires_confirmation", "requires_action")
CANCELABLE = (
    "requires_payment_method",
    "requires_confirmation",
    "requires_action",
    "requires_capture",
)
SERVER_ERROR_MESSAGE = (
    "An unknown error occurred while processing your request. Please try again later."
)

Handler = Callable[[web.Request, Call], Awaitable[web.StreamResponse]]


class StripeSurface:
    """The Stripe API's handlers, its settings, its timers and its webhooks."""

    def __init__(self, processor: FakeProcessor, settings: StripeSettings | None = None) -> None:
        self.processor = processor
        self.initial_settings = settings or StripeSettings()
        self.settings = self.initial_settings
        self.webhooks = Webhooks(processor, lambda: self.settings)
        self.versions_seen: dict[str, int] = {}
        self.last_version: str | None = None
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.reads = StripeReads(lambda: self.ledger)
        self.methods = PaymentMethodRoutes(lambda: self.ledger.payment_methods)
        processor.reset_hooks.append(self.reset)

    @property
    def ledger(self) -> StripeLedger:
        """The processor's Stripe ledger (a new one after each reset), told the search lag."""
        ledger = self.processor.stripe_ledger
        ledger.search_lag_seconds = self.settings.search_lag_ms / 1000
        return ledger

    def routes(self) -> list[web.RouteDef]:
        reads = self.reads
        table: list[tuple[str, str, Handler]] = [
            ("POST", "/v1/payment_intents", self.create_intent),
            ("GET", "/v1/payment_intents", reads.list_intents),
            ("GET", "/v1/payment_intents/search", reads.search_intents),
            ("GET", "/v1/payment_intents/{id}", reads.get_intent),
            ("POST", "/v1/payment_intents/{id}/confirm", self.confirm_intent),
            ("POST", "/v1/payment_intents/{id}/cancel", self.cancel_intent),
            ("GET", "/v1/charges", reads.list_charges),
            ("GET", "/v1/charges/{id}", reads.get_charge),
            ("POST", "/v1/refunds", self.create_refund),
            ("GET", "/v1/refunds", reads.list_refunds),
            ("GET", "/v1/refunds/{id}", reads.get_refund),
            ("GET", "/v1/events", reads.list_events),
            ("GET", "/v1/events/{id}", reads.get_event),
            ("GET", "/v1/payment_methods/{id}", self.methods.retrieve),
            ("POST", "/v1/payment_methods/{id}/attach", self.methods.attach),
            ("POST", "/v1/payment_methods/{id}/detach", self.methods.detach),
        ]
        return [
            web.route(method, PREFIX + path, self._api(handler)) for method, path, handler in table
        ]

    # ---- every request

    def _api(self, handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """Authenticate, count against the rate ceiling, answer errors in Stripe's shape,
        and stamp `Request-Id` and `Stripe-Version` on every answer."""

        @functools.wraps(handler)
        async def wrapper(request: web.Request) -> web.StreamResponse:
            call = Call(request)
            self._note_version(call.version)
            try:
                authenticate(request, self.settings.api_key)
                self.processor.admit()
                response = await handler(request, call)
            except RateLimited:
                response = StripeError(
                    429,
                    "Request rate limit exceeded. Learn more about rate limits here "
                    "https://stripe.com/docs/rate-limits.",
                    code="rate_limit",
                ).response()
            except StripeError as exc:
                if exc.status == 401:
                    self.processor.stats["auth_failures"] += 1
                response = exc.response()
            response.headers["Request-Id"] = call.request_id
            response.headers["Stripe-Version"] = call.version or self.ledger.api_version
            if call.key is not None and request.method == "POST":
                response.headers["Idempotency-Key"] = call.key
            return response

        return wrapper

    def _note_version(self, version: str | None) -> None:
        if version is not None:
            self.last_version = version
            self.versions_seen[version] = self.versions_seen.get(version, 0) + 1
            self.ledger.api_version = version

    def _method(self, method_id: str) -> MethodSpec:
        """What charging with a test token, or a method made from one, does."""
        method = self.ledger.payment_methods.spec(method_id)
        if method is None:
            raise missing("PaymentMethod", method_id, "payment_method", 400)
        return method

    # ---- payment intents

    async def create_intent(self, request: web.Request, call: Call) -> web.StreamResponse:
        """`POST /v1/payment_intents`."""
        self.processor.stats["charge_requests"] += 1
        params = await _form(request)
        check_known(params, CREATE_PARAMS)
        amount = integer(params, "amount", required=True)
        currency = (string(params, "currency", required=True) or "").lower()
        assert amount is not None
        _check_amount(amount, currency)
        customer = string(params, "customer")
        if customer is not None and not customer.startswith("cus_"):
            raise missing("customer", customer, "customer", 400)
        method_id = string(params, "payment_method")
        method = self._method(method_id) if method_id is not None else None
        if method_id is not None:
            self.ledger.payment_methods.check_customer(method_id, customer)
        confirm, off_session = boolean(params, "confirm"), boolean(params, "off_session")
        if confirm and method is None:
            raise invalid(
                "You must provide a payment_method to confirm this PaymentIntent.",
                code="parameter_missing",
                param="payment_method",
            )
        fields = {
            "amount": amount,
            "currency": currency,
            "customer": customer,
            "payment_method": method_id,
            "metadata": metadata(params),
            "description": string(params, "description"),
            "method_type": method.type if method is not None else "card",
        }
        paths = check_expansions(params, "payment_intent")

        async def run() -> Answer:
            fate = await self.processor.fate(_forced(amount), stored_errors=True)
            _before_execution(fate)
            intent = self.ledger.create_intent(call.origin(), **fields)
            if not confirm:
                return self._finish(fate, Answer(200, expand(self.ledger, intent, paths)))
            assert method is not None and method_id is not None
            return self._attempt(fate, intent, method_id, method, bool(off_session), call, paths)

        return await once(self.processor, request, call, params, run)

    async def confirm_intent(self, request: web.Request, call: Call) -> web.StreamResponse:
        """`POST /v1/payment_intents/{id}/confirm`: confirm it (again, after a decline)."""
        self.processor.stats["charge_requests"] += 1
        intent = find_intent(self.ledger, request.match_info["id"])
        params = await _form(request)
        check_known(params, CONFIRM_PARAMS)
        method_id = string(params, "payment_method")
        method = self._method(method_id) if method_id is not None else None
        if method_id is not None:
            self.ledger.payment_methods.check_customer(method_id, intent["customer"])
        off_session = bool(boolean(params, "off_session"))
        paths = check_expansions(params, "payment_intent")

        async def run() -> Answer:
            fate = await self.processor.fate(_forced(intent["amount"]), stored_errors=True)
            _before_execution(fate)
            _expect_state(intent, CONFIRMABLE, "confirm")
            chosen_id = method_id or intent["payment_method"]
            if chosen_id is None:
                raise _unexpected_state(
                    intent,
                    "You cannot confirm this PaymentIntent because it's missing a "
                    "payment method. Specify a payment_method to confirm it with.",
                )
            chosen = method or self._method(chosen_id)
            return self._attempt(fate, intent, chosen_id, chosen, off_session, call, paths)

        return await once(self.processor, request, call, params, run)

    def _attempt(
        self,
        fate: Fate,
        intent: StripeObject,
        method_id: str,
        method: MethodSpec,
        off_session: bool,
        call: Call,
        paths: list[str],
    ) -> Answer:
        """Confirm `intent` now that the charge reached the network; never awaits, so
        two confirmations of one intent can never both charge."""
        attempt = self.ledger.confirm(
            intent,
            method_id,
            method,
            call.origin(),
            off_session=off_session,
            declined=fate.outcome is Outcome.DECLINE,
            advice_code=self.settings.decline_advice_code,
        )
        if attempt.processing:
            self._schedule_settlement(intent["id"])
        body = attempt.body if attempt.status != 200 else expand(self.ledger, attempt.body, paths)
        return self._finish(fate, Answer(attempt.status, body))

    def _finish(self, fate: Fate, answer: Answer) -> Answer:
        """Publish the events; apply a fault that strikes after execution."""
        self.webhooks.publish(self.ledger.drain_events())
        answer.headers.update(latency_headers(fate.latency_ms) or {})
        if fate.outcome is Outcome.CHARGE_THEN_ERROR:
            raise StripeError(
                500,
                SERVER_ERROR_MESSAGE,
                type="api_error",
                stored=True,
                headers={"Stripe-Should-Retry": "false"},
            )
        answer.drop = fate.outcome is Outcome.CHARGE_THEN_DROP
        return answer

    async def cancel_intent(self, request: web.Request, call: Call) -> web.StreamResponse:
        """`POST /v1/payment_intents/{id}/cancel`."""
        intent = find_intent(self.ledger, request.match_info["id"])
        params = await _form(request)
        check_known(params, frozenset({"cancellation_reason", "expand"}))
        reason = string(params, "cancellation_reason")
        if reason is not None and reason not in CANCEL_REASONS:
            raise invalid(
                f"Invalid cancellation_reason: must be one of {', '.join(CANCEL_REASONS)}",
                param="cancellation_reason",
            )
        paths = check_expansions(params, "payment_intent")

        async def run() -> Answer:
            _expect_state(intent, CANCELABLE, "cancel")
            self.ledger.cancel(intent, reason, call.origin())
            self.webhooks.publish(self.ledger.drain_events())
            return Answer(200, expand(self.ledger, intent, paths))

        return await once(self.processor, request, call, params, run)

    # ---- refunds

    async def create_refund(self, request: web.Request, call: Call) -> web.StreamResponse:
        """`POST /v1/refunds` with `payment_intent` (or `charge`), `amount`?, `reason`?."""
        params = await _form(request)
        check_known(
            params,
            frozenset({"payment_intent", "charge", "amount", "reason", "metadata", "expand"}),
        )
        intent_id, charge_id = string(params, "payment_intent"), string(params, "charge")
        if (intent_id is None) == (charge_id is None):
            raise invalid(
                "Provide exactly one of charge or payment_intent.",
                code="parameter_missing",
                param="payment_intent",
            )
        amount = integer(params, "amount")
        reason = string(params, "reason")
        if reason is not None and reason not in REFUND_REASONS:
            raise invalid(
                f"Invalid reason: must be one of {', '.join(REFUND_REASONS)}", param="reason"
            )
        refund_metadata = metadata(params)
        if intent_id is not None:
            find_intent(self.ledger, intent_id, param="payment_intent", status=400)
        elif self.ledger.charges.get(charge_id or "") is None:
            raise missing("charge", charge_id or "", "charge", 400)
        paths = check_expansions(params, "refund")

        async def run() -> Answer:
            charge = self._refundable(intent_id, charge_id)
            remaining = charge["amount"] - charge["amount_refunded"]
            if amount is not None and not 1 <= amount <= remaining:
                raise StripeError(
                    400,
                    f"Refund amount ({amount}) is greater than unrefunded "
                    f"amount on charge ({remaining})",
                    code="amount_too_large",
                    param="amount",
                    stored=True,
                )
            refund = self.ledger.refund(
                charge, amount or remaining, reason, refund_metadata, call.origin()
            )
            self.webhooks.publish(self.ledger.drain_events())
            return Answer(200, expand(self.ledger, refund, paths))

        return await once(self.processor, request, call, params, run)

    def _refundable(self, intent_id: str | None, charge_id: str | None) -> StripeObject:
        """The succeeded charge a refund is for, or Stripe's (stored) refusal."""
        if intent_id is not None:
            intent = self.ledger.intents.get(intent_id)
            assert intent is not None
            charge = self.ledger.charges.get(intent["latest_charge"] or "")
            if intent["status"] != "succeeded" or charge is None:
                raise StripeError(
                    400,
                    "This PaymentIntent does not have a successful charge to refund.",
                    code="charge_not_refundable",
                    param="payment_intent",
                    stored=True,
                )
        else:
            charge = self.ledger.charges.get(charge_id or "")
            assert charge is not None
            if charge["status"] != "succeeded":
                raise StripeError(
                    400,
                    f"Charge {charge['id']} has not succeeded.",
                    code="charge_not_refundable",
                    param="charge",
                    stored=True,
                )
        if charge["refunded"]:
            raise StripeError(
                400,
                f"Charge {charge['id']} has already been refunded.",
                code="charge_already_refunded",
                stored=True,
            )
        return charge

    # ---- bank debits settle later

    def _schedule_settlement(self, intent_id: str) -> None:
        delay = self.settings.settle_delay_ms / 1000
        loop = asyncio.get_running_loop()
        self._timers[intent_id] = loop.call_later(delay, self.settle, intent_id)

    def settle(self, intent_id: str) -> bool:
        """Settle one processing bank debit now; False if it is not processing."""
        timer = self._timers.pop(intent_id, None)
        if timer is not None:
            timer.cancel()
        intent = self.ledger.intents.get(intent_id)
        method_id = self.ledger.method_of(intent_id)
        if intent is None or intent["status"] != "processing" or method_id is None:
            return False
        spec = self.ledger.payment_methods.spec(method_id, usable_only=False)
        assert spec is not None  # it was confirmed with it
        self.ledger.settle(intent, spec)
        self.webhooks.publish(self.ledger.drain_events())
        return True

    def settle_all(self) -> list[str]:
        """Settle every processing intent now (the `settle now` control)."""
        waiting = [
            intent["id"] for intent in self.ledger.intents if intent["status"] == "processing"
        ]
        return [intent_id for intent_id in waiting if self.settle(intent_id)]

    def processing(self) -> list[str]:
        return [intent["id"] for intent in self.ledger.intents if intent["status"] == "processing"]

    # ---- lifecycle

    def reset(self) -> None:
        """Back to the initial settings; no timers, no deliveries, no versions seen."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self.webhooks.reset()
        self.settings = self.initial_settings
        self.versions_seen.clear()
        self.last_version = None

    async def close(self, app: web.Application | None = None) -> None:
        self.reset()
        await self.webhooks.close()


#: The card surface's always-503 amount, honoured here too (a stub-only test input).
UNAVAILABLE_AMOUNT = 50003


def _forced(amount: int) -> Fate | None:
    """The fate an amount forces whatever the faults: 50003 is always a 503."""
    return UNAVAILABLE if amount == UNAVAILABLE_AMOUNT else None


def _before_execution(fate: Fate) -> None:
    """The faults that strike before anything executes: nothing happened, nothing stored."""
    headers = latency_headers(fate.latency_ms)
    if fate.outcome is Outcome.TIMEOUT:
        raise StripeError(504, "The request timed out.", type="api_error", headers=headers)
    if fate.outcome in (Outcome.SERVER_ERROR, Outcome.UNAVAILABLE):
        raise StripeError(
            fate.error_status, SERVER_ERROR_MESSAGE, type="api_error", headers=headers
        )


def _check_amount(amount: int, currency: str) -> None:
    if len(currency) != 3 or not currency.isalpha():
        raise invalid(
            f"Invalid currency: {currency}.", code="parameter_invalid_string", param="currency"
        )
    if amount < 1:
        raise invalid(
            "This value must be greater than or equal to 1.",
            code="parameter_invalid_integer",
            param="amount",
        )
    if amount > MAX_AMOUNT:
        raise invalid(
            f"Amount must be no more than {MAX_AMOUNT} {currency} minor units.",
            code="amount_too_large",
            param="amount",
        )
    if amount < minimum_amount(currency):
        raise invalid(
            f"Amount must be at least {minimum_amount(currency)} {currency} minor units.",
            code="amount_too_small",
            param="amount",
        )


def _expect_state(intent: StripeObject, allowed: tuple[str, ...], action: str) -> None:
    if intent["status"] not in allowed:
        raise _unexpected_state(
            intent,
            f"You cannot {action} this PaymentIntent because it has a status of "
            f"{intent['status']}. Only a PaymentIntent with one of the following statuses may "
            f"be {action}ed: {', '.join(allowed)}.",
        )


def _unexpected_state(intent: StripeObject, message: str) -> StripeError:
    """Stripe's 400 for an intent in the wrong state (execution began: stored)."""
    return StripeError(
        400,
        message,
        code="payment_intent_unexpected_state",
        stored=True,
        payment_intent=dict(intent),
    )


async def _form(request: web.Request) -> Params:
    try:
        text = (await request.read()).decode()
    except UnicodeDecodeError:
        raise invalid("The request body must be UTF-8 form-encoded.") from None
    return parse_form(text)
