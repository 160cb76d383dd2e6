"""Stripe, through its official SDK: one implementation of the gateway interface.

A charge is a PaymentIntent created and confirmed off-session under the
payment's current key generation, carrying the payment id as
``metadata[paycron_payment_id]`` (docs/design.md). Every answer is classified by
HTTP status, ``error.type`` and ``error.code`` — never by exception class:
the SDK raises ``APIError`` for a 409 and a 5xx alike — in the one table of
:func:`classify_error`, beside :func:`classify_intent` for a 200.

The SDK runs with ``max_network_retries=0`` (Postgres is the only retry
layer), a pinned API version, and :class:`~paycron.processors.stripe.transport.PooledHttpClient`
(a total timeout per call). The secret key stays inside the SDK's client:
it is never logged, and this object's ``repr`` does not show it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, date, datetime, timedelta
from typing import Any

import stripe
from stripe import RequestOptions
from stripe.params import PaymentIntentConfirmParams, PaymentIntentCreateParams

from paycron.config import Config
from paycron.domain.enums import FailureReason, Outcome
from paycron.domain.processing import (
    FAILED,
    PROCESSING,
    REFUNDED,
    SUCCEEDED,
    CallResult,
    Charge,
    ChargeRequest,
    LookupRequest,
    Refund,
)
from paycron.errors import (
    ConfigError,
    GatewayError,
    GatewayRequestRefused,
    ProcessorPaymentMissing,
)
from paycron.processors.base import TakeToken
from paycron.processors.stripe.transport import NotSent, PooledHttpClient
from paycron.processors.wire import answered_id, error_code_of, processor_id, retry_after

log = logging.getLogger("paycron.stripe")

#: Where an intent carries the payment id (copied by Stripe onto its charges).
METADATA_KEY = "paycron_payment_id"
#: Stripe's page size limit: fewer round trips (each takes a token).
PAGE_SIZE = 100
#: Decline codes and advice after which Stripe advises trying again later.
RETRYABLE_DECLINES = frozenset({"processing_error", "try_again_later"})

#: Intent statuses as the engine's processor-side statuses (paycron.processors.base).
INTENT_STATUSES = {
    "succeeded": SUCCEEDED,
    "processing": PROCESSING,
    "requires_payment_method": FAILED,  # declined; may be confirmed again
    "canceled": FAILED,
    "requires_action": FAILED,  # off-session: the customer is not there to act
    "requires_confirmation": FAILED,
    "requires_capture": PROCESSING,  # authorised, not captured: not ours, never money moved yet
}
#: Charge statuses likewise (a refunded charge is REFUNDED: see _charge_status).
CHARGE_STATUSES = {"succeeded": SUCCEEDED, "pending": PROCESSING, "failed": FAILED}


def _intent_id(error: Mapping[str, Any]) -> str | None:
    intent = error.get("payment_intent")
    return processor_id(intent.get("id")) if isinstance(intent, Mapping) else None


def classify_error(
    status: int | None, error: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> CallResult:
    """The answer table for a refused charge (docs/design.md): Stripe's HTTP status and
    ``error`` object as an outcome (each row tested through the SDK)."""
    kind, code = error.get("type"), error.get("code")
    # Stripe sends ``code`` for some errors only: without one, the status
    # (``http_400``) is stored, never a made-up "declined".
    stored = (
        error_code_of(error.get("decline_code") or code)
        if error.get("decline_code") or code
        else f"http_{status}"
    )
    replayed = (headers or {}).get("Idempotent-Replayed") == "true"
    if status == 402:
        intent = _intent_id(error)
        if code == "authentication_required":
            return CallResult(
                Outcome.DECLINED,
                gateway_ref=intent,
                error_code=stored,
                failure_reason=FailureReason.CUSTOMER_ACTION_REQUIRED,
            )
        advice = error.get("advice_code")
        retry = advice != "do_not_try_again" and (
            advice == "try_again_later"
            or code in RETRYABLE_DECLINES
            or error.get("decline_code") in RETRYABLE_DECLINES
        )
        return CallResult(
            Outcome.DECLINED,
            gateway_ref=intent,
            error_code=stored,
            retry_decline=retry and intent is not None,
        )
    if status == 429 or (status == 400 and code == "rate_limit"):
        return CallResult(
            Outcome.RATE_LIMITED, error_code="rate_limited", retry_after=retry_after(headers)
        )
    if status == 409 and code == "idempotency_key_in_use":
        return CallResult(Outcome.KEY_IN_USE, error_code="idempotency_key_in_use", in_doubt=True)
    if status in (400, 404) and kind == "idempotency_error":
        # Our parameters changed under a live key: it may have charged under
        # the first ones (looked up first), never retried under another key.
        return CallResult(
            Outcome.REJECTED,
            error_code="idempotency_error",
            failure_reason=FailureReason.GATEWAY_REJECTED,
        )
    if status in (400, 404):
        # Stripe validates before executing: definitively not charged (Stripe's
        # code, or http_400/http_404 when it gave none).
        return CallResult(
            Outcome.REJECTED, error_code=stored, failure_reason=FailureReason.INVALID_REQUEST
        )
    if status in (401, 403):
        return CallResult(Outcome.AUTH_FAILED, error_code=f"http_{status}")
    if status is not None and status >= 500:
        # Stripe stores a 500 that happened after execution began and replays
        # it for the key: a replay is resolved by lookup, not by resending.
        return CallResult(
            Outcome.RETRYABLE_ERROR,
            error_code=f"http_{status}",
            in_doubt=True,
            replayed=replayed,
            lookup_first=replayed,
        )
    # Any other answer (a 409 lock timeout, an unknown status): unknown, in doubt.
    return CallResult(Outcome.RETRYABLE_ERROR, error_code=f"http_{status}", in_doubt=True)


def classify_intent(intent: Mapping[str, Any]) -> CallResult:
    """A 200's PaymentIntent as an outcome."""
    intent_id, status = answered_id(intent.get("id")), intent.get("status")
    if intent_id is None:
        return CallResult(Outcome.AMBIGUOUS, error_code="malformed_answer", in_doubt=True)
    if status == "succeeded":
        return CallResult(Outcome.SUCCEEDED, gateway_ref=intent_id)
    if status == "processing":
        # Accepted; the outcome comes later (a bank debit): AWAITING_GATEWAY.
        return CallResult(Outcome.SUBMITTED, gateway_ref=intent_id)
    if status == "requires_action":
        return CallResult(
            Outcome.DECLINED,
            gateway_ref=intent_id,
            error_code="authentication_required",
            failure_reason=FailureReason.CUSTOMER_ACTION_REQUIRED,
        )
    # requires_payment_method etc. in a 200 is no answer we asked for: never guessed.
    return CallResult(
        Outcome.AMBIGUOUS, gateway_ref=intent_id, error_code=error_code_of(status), in_doubt=True
    )


def intent_as_charge(intent: Mapping[str, Any]) -> Charge:
    """A PaymentIntent as the engine's processor-side payment (its reference
    is the payment id in its metadata, empty when it carries none)."""
    metadata = intent.get("metadata") or {}
    return Charge(
        id=str(intent.get("id")),
        reference=str(metadata.get(METADATA_KEY) or ""),
        amount=intent["amount"],
        currency=str(intent.get("currency", "")).upper(),
        status=_status(INTENT_STATUSES, intent),
        customer=intent.get("customer"),
        created_at=_created(intent.get("created")),
    )


def _charge_status(charge: Mapping[str, Any]) -> str:
    if charge.get("status") == "succeeded" and (
        charge.get("refunded") or charge.get("amount_refunded")
    ):
        return REFUNDED
    return _status(CHARGE_STATUSES, charge)


def _status(table: Mapping[str, str], obj: Mapping[str, Any]) -> str:
    """The engine's name of ``obj``'s status; one we do not know, as Stripe spells it."""
    status = str(obj.get("status"))
    return table.get(status, status)


def _created(value: Any) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if isinstance(value, int) else None


class StripeProcessor:
    """Stripe over the official SDK. Thread-safe (one per worker process).

    ``take_token`` (the shared per-second window) is called before every
    request that is not a charge — lookups, refunds, report pages — so they
    never push charges past Stripe's rate limit; the executor takes the
    charges' tokens itself.
    """

    name = "stripe"

    def __init__(
        self,
        *,
        api_key: str,
        api_base: str,
        api_version: str,
        timeout: float,
        max_connections: int = 64,
        take_token: TakeToken | None = None,
    ):
        self._http = PooledHttpClient(timeout=timeout, max_connections=max_connections)
        self._client = stripe.StripeClient(
            api_key,
            base_addresses={"api": api_base},
            stripe_version=api_version,
            max_network_retries=0,
            http_client=self._http,
        )
        self._take_token: TakeToken = take_token or _no_window
        self._base = api_base

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        max_connections: int = 64,
        take_token: TakeToken | None = None,
    ) -> StripeProcessor:
        if not config.stripe_api_key:
            raise ConfigError("STRIPE_API_KEY is not set")
        return cls(
            api_key=config.stripe_api_key,
            api_base=config.stripe_api_base,
            api_version=config.stripe_api_version,
            timeout=config.gateway_timeout_seconds,
            max_connections=max_connections,
            take_token=take_token,
        )

    def __repr__(self) -> str:
        return f"StripeProcessor({self._base!r})"

    def close(self) -> None:
        self._http.close()

    # ---- the charge

    def charge(self, request: ChargeRequest, *, timeout: float | None = None) -> CallResult:
        options: RequestOptions = {"idempotency_key": request.idempotency_key}
        try:
            with self._http.timeout(timeout):
                if request.confirm:
                    # A retried decline: the same intent (it succeeds at most once).
                    confirm: PaymentIntentConfirmParams = {}
                    if request.payment_method is not None:
                        confirm["payment_method"] = request.payment_method
                    confirm["off_session"] = True
                    intent = self._client.v1.payment_intents.confirm(
                        request.confirm, params=confirm, options=options
                    )
                else:
                    create: PaymentIntentCreateParams = {
                        "amount": request.amount,
                        "currency": request.currency.lower(),
                    }
                    # The SDK sends no parameter that is None: neither do we.
                    if request.customer is not None:
                        create["customer"] = request.customer
                    if request.payment_method is not None:
                        create["payment_method"] = request.payment_method
                    create["confirm"] = True
                    create["off_session"] = True
                    create["metadata"] = {METADATA_KEY: request.reference}
                    intent = self._client.v1.payment_intents.create(params=create, options=options)
        except NotSent as exc:
            return CallResult(Outcome.RETRYABLE_ERROR, error_code=_cause(exc))
        except stripe.APIConnectionError as exc:
            # Sent, then no answer (timeout, dropped connection): never guess.
            return CallResult(Outcome.AMBIGUOUS, error_code=_cause(exc), in_doubt=True)
        except stripe.StripeError as exc:
            result = classify_error(exc.http_status, _error_of(exc), exc.headers)
            if result.failure_reason is FailureReason.CUSTOMER_ACTION_REQUIRED:
                self._cancel(result.gateway_ref)
            return result
        result = classify_intent(intent.to_dict())
        if result.failure_reason is FailureReason.CUSTOMER_ACTION_REQUIRED:
            self._cancel(result.gateway_ref)
        return result

    def _cancel(self, intent_id: str | None) -> None:
        """Cancel an intent that needs the customer, so a later on-session
        confirmation cannot charge a payment we hold as FAILED. Best effort:
        a FAILED payment's intent that succeeds anyway pages in reconciliation."""
        if intent_id is None:
            return
        try:
            self._take_token()
            self._client.v1.payment_intents.cancel(
                intent_id, options={"idempotency_key": f"cancel:{intent_id}"}
            )
        except stripe.StripeError as exc:
            log.error(
                "could not cancel intent %s that needs its customer: %s",
                intent_id,
                type(exc).__name__,
            )

    # ---- lookups, refunds, the settlement report

    def _pages(self, list_call, params: dict) -> Iterator[dict]:
        """Every object of a Stripe list (as plain data), following has_more /
        starting_after."""
        params = {**params, "limit": PAGE_SIZE}
        while True:
            self._take_token()
            try:
                page = list_call(params=params)
            except stripe.StripeError as exc:
                raise _read_error("list", exc) from exc
            data = [item.to_dict() for item in page.data]
            yield from data
            if not page.has_more or not data:
                return
            params = {**params, "starting_after": data[-1]["id"]}

    def find_charges(self, request: LookupRequest) -> list[Charge]:
        """The customer's intents since the payment's first call (less an
        hour of skew) carrying its id, through every page: a strongly
        consistent read (never the Search API, which lags)."""
        params: dict[str, Any] = {}
        if request.customer:
            params["customer"] = request.customer
        if request.since is not None:
            params["created"] = {"gte": int(request.since.timestamp())}
        intents = self._pages(self._client.v1.payment_intents.list, params)
        return [
            charge
            for charge in map(intent_as_charge, intents)
            if charge.reference == request.reference
        ]

    def retrieve(self, charge_id: str) -> Charge:
        """The intent as Stripe holds it now (an event is a hint, never the truth)."""
        self._take_token()
        try:
            intent = self._client.v1.payment_intents.retrieve(charge_id)
        except stripe.StripeError as exc:
            raise _read_error("retrieve", exc, missing=f"no PaymentIntent {charge_id}") from exc
        return intent_as_charge(intent.to_dict())

    def payment_method_customer(self, payment_method: str, *, timeout: float) -> str | None:
        """The customer a PaymentMethod is attached to (``GET
        /v1/payment_methods/{id}``), None while unattached; within ``timeout``
        (the wait for a call token included)."""
        until = time.monotonic() + timeout
        self._take_token(timeout)
        left = until - time.monotonic()
        if left <= 0:
            raise GatewayError("no time left to ask Stripe whose the payment method is")
        try:
            with self._http.timeout(left):
                method = self._client.v1.payment_methods.retrieve(payment_method)
        except stripe.StripeError as exc:  # connection errors too: unavailability
            raise _read_error("retrieve", exc, missing="no such PaymentMethod") from exc
        customer = method.to_dict().get("customer")
        if isinstance(customer, Mapping):  # expanded
            customer = customer.get("id")
        if customer is not None and not isinstance(customer, str):
            raise GatewayError("Stripe answered a PaymentMethod with an unusable customer")
        return customer

    def refund(self, charge: Charge) -> Refund:
        key = f"refund:{charge.id}"
        self._take_token()
        try:
            refund = self._client.v1.refunds.create(
                params={"payment_intent": charge.id}, options={"idempotency_key": key}
            )
        except stripe.StripeError as exc:
            raise _read_error("refund", exc) from exc
        answer = refund.to_dict()
        refund_id = processor_id(answer.get("id"))
        if refund_id is None:
            raise GatewayError("Stripe answered a refund without a refund id")
        return Refund(id=refund_id, amount=answer.get("amount", charge.amount), idempotency_key=key)

    def settlement_report(self, day: date) -> list[Charge]:
        """The day's charges, every page, every status (succeeded ones are
        money moved; the reconciliation decides the rest)."""
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        params = {
            "created": {
                "gte": int(start.timestamp()),
                "lt": int((start + timedelta(days=1)).timestamp()),
            }
        }
        charges = []
        for charge in self._pages(self._client.v1.charges.list, params):
            reference = (charge.get("metadata") or {}).get(METADATA_KEY) or ""
            if processor_id(charge.get("id")) is None or not isinstance(reference, str):
                raise GatewayError("Stripe listed a charge without a usable id")
            charges.append(
                Charge(
                    id=charge["id"],
                    reference=reference,
                    amount=charge["amount"],
                    currency=str(charge.get("currency", "")).upper(),
                    status=_charge_status(charge),
                    customer=charge.get("customer"),
                    # matched by payment id across key generations, not by key
                    idempotency_key=reference or charge["id"],
                    created_at=_created(charge.get("created")),
                )
            )
        return charges


def _no_window(within: float | None = None) -> None:
    """No shared call window: every call is sent at once."""


def _read_error(what: str, exc: stripe.StripeError, *, missing: str = "") -> GatewayError:
    """A read Stripe did not answer, as the error an operator can act on: a
    400/404 (not a rate limit) is our request refused — a bug or an API
    change, which waiting will not fix; a 404 of one object (``missing``) is
    an object this account does not hold; anything else is unavailability."""
    status, code = exc.http_status, _error_of(exc).get("code")
    described = f"Stripe {what} failed: {type(exc).__name__} {status}" + (
        f" {error_code_of(code)}" if code else ""
    )
    if status == 404 and missing:
        return ProcessorPaymentMissing(f"{described}: {missing} in this account")
    if status in (400, 404) and code != "rate_limit":
        return GatewayRequestRefused(f"{described}: Stripe refused the request")
    return GatewayError(described)


def _error_of(exc: stripe.StripeError) -> Mapping[str, Any]:
    body = exc.json_body if isinstance(exc.json_body, Mapping) else {}
    error = body.get("error")
    return error if isinstance(error, Mapping) else {}


def _cause(exc: BaseException) -> str:
    return type(exc.__cause__ or exc).__name__
