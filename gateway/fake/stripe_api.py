"""The Stripe-shaped surface: Stripe's API under ``/stripe`` (SPEC §12), over the
processor every surface shares.

Point the official SDK at it with ``base_addresses={"api": "<fake>/stripe"}``.

* ``POST /v1/payment_intents`` (``confirm=true`` charges at once),
  ``POST /v1/payment_intents/{id}/confirm``, ``…/cancel``,
  ``GET /v1/payment_intents/{id}``, ``GET /v1/payment_intents`` (customer,
  created, cursors: strongly consistent), ``GET /v1/payment_intents/search``
  (lags by ``search_lag_ms``); ``POST /v1/refunds``, ``GET /v1/refunds[/{id}]``;
  ``GET /v1/charges[/{id}]``; ``GET /v1/events[/{id}]``.
* Auth: ``Authorization: Bearer <the configured key>`` or 401. Any
  ``Stripe-Version`` is accepted and remembered (``GET /_stripe``).
* Idempotency as at Stripe, per ``Idempotency-Key`` (the processor's key
  store and retention, in a namespace of its own): the same key and
  parameters get the stored status and body back byte for byte
  (``Idempotent-Replayed: true``) — successes, declines, state errors and
  500s that happened after execution began; validation errors, 401, 429 and
  5xx before execution are not stored; another request under a key still
  being processed → 409 ``idempotency_key_in_use``; other parameters or
  another endpoint under the key → 400 ``idempotency_error``.
* Faults: the rate ceiling applies to every call (429 ``rate_limit``); the
  charge faults (latency, timeouts, 5xx, declines, dropped answers, and
  ``error_after_charge_rate``: execute, then a stored 500) to creating and
  confirming intents. Test payment methods: `stripe_methods`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.fake.errors import KeyInUse, KeyMismatch, RateLimited
from gateway.fake.jsonapi import (
    MAX_KEY_LENGTH,
    REPLAYED_HEADERS,
    dumps,
    json_response,
    latency_headers,
    raw_json_response,
)
from gateway.fake.processor import FakeProcessor, Outcome
from gateway.fake.stripe_ledger import Origin, StripeLedger
from gateway.fake.stripe_methods import MAX_AMOUNT, PAYMENT_METHODS, MethodSpec, minimum_amount
from gateway.fake.stripe_objects import StripeObject, new_id
from gateway.fake.stripe_search import parse_query
from gateway.fake.stripe_settings import StripeSettings
from gateway.fake.stripe_webhooks import Webhooks
from gateway.fake.stripe_wire import (
    Params,
    StripeError,
    authenticate,
    boolean,
    check_known,
    created_range,
    expansions,
    fingerprint,
    integer,
    invalid,
    limit,
    list_object,
    metadata,
    missing,
    parse_form,
    search_result,
    string,
)

PREFIX = "/stripe"
#: Stripe keys live apart from the card surface's in the shared key store.
KEY_NAMESPACE = "stripe\x00"
PAGING = frozenset({"limit", "starting_after", "ending_before", "expand"})
CREATE_PARAMS = frozenset({
    "amount", "currency", "customer", "payment_method", "confirm", "off_session", "metadata",
    "description", "expand", "payment_method_types", "receipt_email", "statement_descriptor",
    "statement_descriptor_suffix", "error_on_requires_action", "return_url",
})
CONFIRM_PARAMS = frozenset({"payment_method", "off_session", "expand",
                            "error_on_requires_action", "return_url", "receipt_email"})
CANCEL_REASONS = ("duplicate", "fraudulent", "requested_by_customer", "abandoned")
REFUND_REASONS = ("duplicate", "fraudulent", "requested_by_customer")
#: The states Stripe confirms or cancels an intent from.
CONFIRMABLE = ("requires_payment_method", "requires_confirmation", "requires_action")
CANCELABLE = ("requires_payment_method", "requires_confirmation", "requires_action",
              "requires_capture")
#: What each object type can expand, and into which collection.
EXPANDABLE = {
    "payment_intent": {"latest_charge": "charges"},
    "charge": {"payment_intent": "intents"},
    "refund": {"charge": "charges", "payment_intent": "intents"},
}
SERVER_ERROR_MESSAGE = ("An unknown error occurred while processing your request. "
                        "Please try again later.")

Handler = Callable[[web.Request, "Call"], Awaitable[web.StreamResponse]]


class Call:
    """One API request: its id and the Stripe-Version it named."""

    __slots__ = ("request_id", "version", "key")

    def __init__(self, request: web.Request) -> None:
        self.request_id = new_id("req_")
        self.version = request.headers.get("Stripe-Version")
        self.key = request.headers.get("Idempotency-Key")

    def origin(self) -> Origin:
        return Origin(self.request_id, self.key, self.version)


class StripeSurface:
    """The Stripe API's handlers, its settings, its timers and its webhooks."""

    def __init__(self, processor: FakeProcessor, settings: StripeSettings | None = None
                 ) -> None:
        self.processor = processor
        self.initial_settings = settings or StripeSettings()
        self.settings = self.initial_settings
        self.webhooks = Webhooks(processor, lambda: self.settings)
        self.versions_seen: dict[str, int] = {}
        self.last_version: str | None = None
        self._timers: dict[str, asyncio.TimerHandle] = {}
        processor.reset_hooks.append(self.reset)

    @property
    def ledger(self) -> StripeLedger:
        """The processor's Stripe ledger (a new one after each reset), told the search lag."""
        ledger = self.processor.stripe_ledger
        ledger.search_lag_seconds = self.settings.search_lag_ms / 1000
        return ledger

    def routes(self) -> list[web.RouteDef]:
        table: list[tuple[str, str, Handler]] = [
            ("POST", "/v1/payment_intents", self.create_intent),
            ("GET", "/v1/payment_intents", self.list_intents),
            ("GET", "/v1/payment_intents/search", self.search_intents),
            ("GET", "/v1/payment_intents/{id}", self.get_intent),
            ("POST", "/v1/payment_intents/{id}/confirm", self.confirm_intent),
            ("POST", "/v1/payment_intents/{id}/cancel", self.cancel_intent),
            ("GET", "/v1/charges", self.list_charges),
            ("GET", "/v1/charges/{id}", self.get_charge),
            ("POST", "/v1/refunds", self.create_refund),
            ("GET", "/v1/refunds", self.list_refunds),
            ("GET", "/v1/refunds/{id}", self.get_refund),
            ("GET", "/v1/events", self.list_events),
            ("GET", "/v1/events/{id}", self.get_event),
        ]
        return [web.route(method, PREFIX + path, self._api(handler))
                for method, path, handler in table]

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
                    429, "Request rate limit exceeded. Learn more about rate limits here "
                    "https://stripe.com/docs/rate-limits.", code="rate_limit",
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

    async def _once(self, request: web.Request, call: Call, params: Params,
                    run: Callable[[], Awaitable[Answer]]) -> web.StreamResponse:
        """Execute a POST at most once per idempotency key, as Stripe does."""
        if call.key is None:  # no key (curl): no idempotency
            return self._send(request, await _stored_or_raise(run))
        if len(call.key) > MAX_KEY_LENGTH:
            raise invalid(f"Idempotency-Key must be at most {MAX_KEY_LENGTH} characters")
        try:
            entry = self.processor.claim(KEY_NAMESPACE + call.key,
                                         fingerprint(request.method, request.path, params))
        except KeyInUse:
            raise StripeError(
                409, "There is currently another in-progress request using this Idempotent "
                "Key (that probably means you submitted twice, and the other request is still "
                f"going through): {call.key}. Please try again later.",
                code="idempotency_key_in_use", headers={"Stripe-Should-Retry": "true"},
            ) from None
        except KeyMismatch:
            raise StripeError(
                400, "Keys for idempotent requests can only be used with the same parameters "
                f"they were first used with. Try using a key other than '{call.key}' if you "
                "meant to execute a different request.", type="idempotency_error",
            ) from None
        if entry.answered:
            assert entry.status is not None
            return raw_json_response(entry.status, entry.body, headers=dict(REPLAYED_HEADERS))
        try:
            answer = await _stored_or_raise(run)
            self.processor.keys.store(entry, answer.status, answer.encoded)
            return self._send(request, answer)
        finally:
            self.processor.keys.release(entry)

    def _send(self, request: web.Request, answer: Answer) -> web.StreamResponse:
        response = raw_json_response(answer.status, answer.encoded, headers=answer.headers)
        if answer.drop and request.transport is not None:
            request.transport.close()  # charged and stored, but the client hears nothing
        return response

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
        method = _method(method_id) if method_id is not None else None
        confirm, off_session = boolean(params, "confirm"), boolean(params, "off_session")
        if confirm and method is None:
            raise invalid("You must provide a payment_method to confirm this PaymentIntent.",
                          code="parameter_missing", param="payment_method")
        fields = {
            "amount": amount, "currency": currency, "customer": customer,
            "payment_method": method_id, "metadata": metadata(params),
            "description": string(params, "description"),
            "method_type": method.type if method is not None else "card",
        }
        expand = self._expansions(params, "payment_intent")

        async def run() -> Answer:
            fate = await self.processor.fate(stored_errors=True)
            _before_execution(fate)
            intent = self.ledger.create_intent(call.origin(), **fields)
            if not confirm:
                return self._finish(fate, Answer(200, self._expand(intent, expand)))
            assert method is not None and method_id is not None
            return self._attempt(fate, intent, method_id, method, bool(off_session), call,
                                 expand)

        return await self._once(request, call, params, run)

    async def confirm_intent(self, request: web.Request, call: Call) -> web.StreamResponse:
        """`POST /v1/payment_intents/{id}/confirm`: confirm it (again, after a decline)."""
        self.processor.stats["charge_requests"] += 1
        intent = self._intent(request.match_info["id"])
        params = await _form(request)
        check_known(params, CONFIRM_PARAMS)
        method_id = string(params, "payment_method")
        method = _method(method_id) if method_id is not None else None
        off_session = bool(boolean(params, "off_session"))
        expand = self._expansions(params, "payment_intent")

        async def run() -> Answer:
            fate = await self.processor.fate(stored_errors=True)
            _before_execution(fate)
            _expect_state(intent, CONFIRMABLE, "confirm")
            chosen_id = method_id or intent["payment_method"]
            if chosen_id is None:
                raise _unexpected_state(
                    intent, "You cannot confirm this PaymentIntent because it's missing a "
                    "payment method. Specify a payment_method to confirm it with.")
            chosen = method or PAYMENT_METHODS[chosen_id]
            return self._attempt(fate, intent, chosen_id, chosen, off_session, call, expand)

        return await self._once(request, call, params, run)

    def _attempt(self, fate: Any, intent: StripeObject, method_id: str, method: MethodSpec,
                 off_session: bool, call: Call, expand: list[str]) -> Answer:
        """Confirm `intent` now that the charge reached the network; never awaits, so
        two confirmations of one intent can never both charge."""
        attempt = self.ledger.confirm(
            intent, method_id, method, call.origin(), off_session=off_session,
            declined=fate.outcome is Outcome.DECLINE,
            advice_code=self.settings.decline_advice_code,
        )
        if attempt.processing:
            self._schedule_settlement(intent["id"])
        body = self._expand(attempt.body, expand) if attempt.status == 200 else attempt.body
        return self._finish(fate, Answer(attempt.status, body))

    def _finish(self, fate: Any, answer: Answer) -> Answer:
        """Publish the events; apply a fault that strikes after execution."""
        self.webhooks.publish(self.ledger.drain_events())
        answer.headers.update(latency_headers(fate.latency_ms) or {})
        if fate.outcome is Outcome.CHARGE_THEN_ERROR:
            raise StripeError(500, SERVER_ERROR_MESSAGE, type="api_error", stored=True,
                              headers={"Stripe-Should-Retry": "false"})
        answer.drop = fate.outcome is Outcome.CHARGE_THEN_DROP
        return answer

    async def cancel_intent(self, request: web.Request, call: Call) -> web.StreamResponse:
        """`POST /v1/payment_intents/{id}/cancel`."""
        intent = self._intent(request.match_info["id"])
        params = await _form(request)
        check_known(params, frozenset({"cancellation_reason", "expand"}))
        reason = string(params, "cancellation_reason")
        if reason is not None and reason not in CANCEL_REASONS:
            raise invalid(f"Invalid cancellation_reason: must be one of "
                          f"{', '.join(CANCEL_REASONS)}", param="cancellation_reason")
        expand = self._expansions(params, "payment_intent")

        async def run() -> Answer:
            _expect_state(intent, CANCELABLE, "cancel")
            self.ledger.cancel(intent, reason, call.origin())
            self.webhooks.publish(self.ledger.drain_events())
            return Answer(200, self._expand(intent, expand))

        return await self._once(request, call, params, run)

    async def get_intent(self, request: web.Request, call: Call) -> web.StreamResponse:
        """`GET /v1/payment_intents/{id}`."""
        params = _query(request)
        check_known(params, frozenset({"expand", "client_secret"}))
        intent = self._intent(request.match_info["id"])
        return json_response(200, self._expand(intent, self._expansions(params, "payment_intent")))

    async def list_intents(self, request: web.Request, call: Call) -> web.StreamResponse:
        """`GET /v1/payment_intents?customer=&created[gte]=&limit=&starting_after=`."""
        return self._list(request, self.ledger.intents, "/v1/payment_intents",
                          "payment_intent", ("customer",))

    async def search_intents(self, request: web.Request, call: Call) -> web.StreamResponse:
        """`GET /v1/payment_intents/search?query=`: sees intents as they were
        `search_lag_ms` ago (Stripe's search index lags; never read-after-write)."""
        params = _query(request)
        check_known(params, frozenset({"query", "limit", "page", "expand"}))
        query = parse_query(string(params, "query", required=True) or "")
        size, page = limit(params), string(params, "page")
        expand = [path.removeprefix("data.") for path in expansions(params)]
        total = "total_count" in expand
        expand = [path for path in expand if path != "total_count"]
        found = [intent for intent in self.ledger.searchable()
                 if query.matches(intent)]
        start = 0
        if page is not None:
            ids = [intent["id"] for intent in found]
            cursor = page.removeprefix("page_")
            if cursor not in ids:
                raise invalid(f"Invalid page: {page}", param="page")
            start = ids.index(cursor) + 1
        data = found[start:start + size]
        has_more = start + size < len(found)
        next_page = f"page_{data[-1]['id']}" if has_more else None
        result = search_result("/v1/payment_intents/search",
                               self._expand_all(data, expand, "payment_intent"), has_more,
                               next_page)
        if total:
            result["total_count"] = len(found)
        return json_response(200, result)

    # ---- charges, refunds, events

    async def list_charges(self, request: web.Request, call: Call) -> web.StreamResponse:
        """`GET /v1/charges?created[gte]=&created[lt]=&…`: every charge, with its status."""
        return self._list(request, self.ledger.charges, "/v1/charges", "charge",
                          ("customer", "payment_intent"))

    async def get_charge(self, request: web.Request, call: Call) -> web.StreamResponse:
        params = _query(request)
        check_known(params, frozenset({"expand"}))
        charge = self.ledger.charges.get(request.match_info["id"])
        if charge is None:
            raise missing("charge", request.match_info["id"], "id")
        return json_response(200, self._expand(charge, self._expansions(params, "charge")))

    async def create_refund(self, request: web.Request, call: Call) -> web.StreamResponse:
        """`POST /v1/refunds` with `payment_intent` (or `charge`), `amount`?, `reason`?."""
        params = await _form(request)
        check_known(params, frozenset({"payment_intent", "charge", "amount", "reason",
                                       "metadata", "expand"}))
        intent_id, charge_id = string(params, "payment_intent"), string(params, "charge")
        if (intent_id is None) == (charge_id is None):
            raise invalid("Provide exactly one of charge or payment_intent.",
                          code="parameter_missing", param="payment_intent")
        amount = integer(params, "amount")
        reason = string(params, "reason")
        if reason is not None and reason not in REFUND_REASONS:
            raise invalid(f"Invalid reason: must be one of {', '.join(REFUND_REASONS)}",
                          param="reason")
        refund_metadata = metadata(params)
        if intent_id is not None:
            self._intent(intent_id, param="payment_intent", status=400)
        elif self.ledger.charges.get(charge_id or "") is None:
            raise missing("charge", charge_id or "", "charge", 400)
        expand = self._expansions(params, "refund")

        async def run() -> Answer:
            charge = self._refundable(intent_id, charge_id)
            remaining = charge["amount"] - charge["amount_refunded"]
            if amount is not None and not 1 <= amount <= remaining:
                raise StripeError(400, f"Refund amount ({amount}) is greater than unrefunded "
                                  f"amount on charge ({remaining})", code="amount_too_large",
                                  param="amount", stored=True)
            refund = self.ledger.refund(charge, amount or remaining, reason, refund_metadata,
                                        call.origin())
            self.webhooks.publish(self.ledger.drain_events())
            return Answer(200, self._expand(refund, expand))

        return await self._once(request, call, params, run)

    def _refundable(self, intent_id: str | None, charge_id: str | None) -> StripeObject:
        """The succeeded charge a refund is for, or Stripe's (stored) refusal."""
        if intent_id is not None:
            intent = self.ledger.intents.get(intent_id)
            assert intent is not None
            charge = self.ledger.charges.get(intent["latest_charge"] or "")
            if intent["status"] != "succeeded" or charge is None:
                raise StripeError(400, "This PaymentIntent does not have a successful charge "
                                  "to refund.", code="charge_not_refundable",
                                  param="payment_intent", stored=True)
        else:
            charge = self.ledger.charges.get(charge_id or "")
            assert charge is not None
            if charge["status"] != "succeeded":
                raise StripeError(400, f"Charge {charge['id']} has not succeeded.",
                                  code="charge_not_refundable", param="charge", stored=True)
        if charge["refunded"]:
            raise StripeError(400, f"Charge {charge['id']} has already been refunded.",
                              code="charge_already_refunded", stored=True)
        return charge

    async def list_refunds(self, request: web.Request, call: Call) -> web.StreamResponse:
        return self._list(request, self.ledger.refunds, "/v1/refunds", "refund",
                          ("charge", "payment_intent"))

    async def get_refund(self, request: web.Request, call: Call) -> web.StreamResponse:
        params = _query(request)
        check_known(params, frozenset({"expand"}))
        refund = self.ledger.refunds.get(request.match_info["id"])
        if refund is None:
            raise missing("refund", request.match_info["id"], "id")
        return json_response(200, self._expand(refund, self._expansions(params, "refund")))

    async def list_events(self, request: web.Request, call: Call) -> web.StreamResponse:
        return self._list(request, self.ledger.events, "/v1/events", "event", ("type",))

    async def get_event(self, request: web.Request, call: Call) -> web.StreamResponse:
        event = self.ledger.events.get(request.match_info["id"])
        if event is None:
            raise missing("event", request.match_info["id"], "id")
        return json_response(200, event)

    # ---- listing and expanding

    def _list(self, request: web.Request, collection: Any, url: str, kind: str,
              filters: tuple[str, ...]) -> web.StreamResponse:
        """A list endpoint: newest first, `created` ranges, equality `filters`, cursors."""
        params = _query(request)
        check_known(params, PAGING | {"created", *filters})
        where = {name: value for name in filters
                 if (value := string(params, name)) is not None}
        cursors = {}
        for name in ("starting_after", "ending_before"):
            cursor = string(params, name)
            if cursor is not None and collection.get(cursor) is None:
                raise missing(kind, cursor, name, 400)
            cursors[name] = cursor
        data, has_more = collection.page(limit=limit(params), where=where,
                                         created=created_range(params), **cursors)
        expand = expansions(params)
        nested = [path.removeprefix("data.") for path in expand if path.startswith("data.")]
        if len(nested) != len(expand):
            raise invalid("Only data.* can be expanded on a list.", param="expand")
        return json_response(200, list_object(url, self._expand_all(data, nested, kind),
                                              has_more))

    def _expansions(self, params: Params, kind: str) -> list[str]:
        paths = expansions(params)
        for path in paths:
            if path not in EXPANDABLE.get(kind, {}):
                raise invalid(f"This property cannot be expanded ({path}).", param="expand")
        return paths

    def _expand(self, obj: StripeObject, paths: list[str]) -> StripeObject:
        """`obj` with the ids at `paths` replaced by their objects (a copy, if any)."""
        if not paths:
            return obj
        expanded = dict(obj)  # only top-level ids are replaced
        for path in paths:
            target = EXPANDABLE[obj["object"]][path]
            if expanded.get(path) is not None:
                expanded[path] = getattr(self.ledger, target).get(expanded[path])
        return expanded

    def _expand_all(self, data: list[StripeObject], paths: list[str], kind: str
                    ) -> list[StripeObject]:
        for path in paths:
            if path not in EXPANDABLE.get(kind, {}):
                raise invalid(f"This property cannot be expanded (data.{path}).",
                              param="expand")
        return [self._expand(obj, paths) for obj in data]

    def _intent(self, intent_id: str, *, param: str = "intent", status: int = 404
                ) -> StripeObject:
        intent = self.ledger.intents.get(intent_id)
        if intent is None:
            raise missing("payment_intent", intent_id, param, status)
        return intent

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
        self.ledger.settle(intent, PAYMENT_METHODS[method_id])
        self.webhooks.publish(self.ledger.drain_events())
        return True

    def settle_all(self) -> list[str]:
        """Settle every processing intent now (the `settle now` control)."""
        waiting = [intent["id"] for intent in self.ledger.intents
                   if intent["status"] == "processing"]
        return [intent_id for intent_id in waiting if self.settle(intent_id)]

    def processing(self) -> list[str]:
        return [intent["id"] for intent in self.ledger.intents
                if intent["status"] == "processing"]

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


class Answer:
    """A definitive answer to store for the key: status, encoded body, headers."""

    __slots__ = ("status", "encoded", "headers", "drop")

    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.encoded = dumps(body)
        self.headers = headers or {}
        self.drop = False


async def _stored_or_raise(run: Callable[[], Awaitable[Answer]]) -> Answer:
    """Run a POST's execution: an error after execution began becomes the stored answer."""
    try:
        return await run()
    except StripeError as exc:
        if not exc.stored:
            raise
        return Answer(exc.status, exc.body, exc.headers)


def _before_execution(fate: Any) -> None:
    """The faults that strike before anything executes: nothing happened, nothing stored."""
    headers = latency_headers(fate.latency_ms)
    if fate.outcome is Outcome.TIMEOUT:
        raise StripeError(504, "The request timed out.", type="api_error", headers=headers)
    if fate.outcome in (Outcome.SERVER_ERROR, Outcome.UNAVAILABLE):
        raise StripeError(fate.error_status, SERVER_ERROR_MESSAGE, type="api_error",
                          headers=headers)


def _check_amount(amount: int, currency: str) -> None:
    if len(currency) != 3 or not currency.isalpha():
        raise invalid(f"Invalid currency: {currency}.", code="parameter_invalid_string",
                      param="currency")
    if amount < 1:
        raise invalid("This value must be greater than or equal to 1.",
                      code="parameter_invalid_integer", param="amount")
    if amount > MAX_AMOUNT:
        raise invalid(f"Amount must be no more than {MAX_AMOUNT} {currency} minor units.",
                      code="amount_too_large", param="amount")
    if amount < minimum_amount(currency):
        raise invalid(f"Amount must be at least {minimum_amount(currency)} {currency} minor "
                      "units.", code="amount_too_small", param="amount")


def _method(method_id: str) -> MethodSpec:
    method = PAYMENT_METHODS.get(method_id)
    if method is None:
        raise missing("PaymentMethod", method_id, "payment_method", 400)
    return method


def _expect_state(intent: StripeObject, allowed: tuple[str, ...], action: str) -> None:
    if intent["status"] not in allowed:
        raise _unexpected_state(
            intent, f"You cannot {action} this PaymentIntent because it has a status of "
            f"{intent['status']}. Only a PaymentIntent with one of the following statuses may "
            f"be {action}ed: {', '.join(allowed)}.")


def _unexpected_state(intent: StripeObject, message: str) -> StripeError:
    """Stripe's 400 for an intent in the wrong state (execution began: stored)."""
    return StripeError(400, message, code="payment_intent_unexpected_state", stored=True,
                       payment_intent=dict(intent))


async def _form(request: web.Request) -> Params:
    try:
        text = (await request.read()).decode()
    except UnicodeDecodeError:
        raise invalid("The request body must be UTF-8 form-encoded.") from None
    return parse_form(text)


def _query(request: web.Request) -> Params:
    return parse_form(request.query_string)
