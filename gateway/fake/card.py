"""The card surface: ``/v1/charges``, ``/v1/refunds``, ``/v1/settlement-report``.

JSON in and out; amounts are positive integers in minor units (not floats,
not strings, not booleans).

Charges
    ``POST /v1/charges`` with header ``Idempotency-Key`` (required) and body
    ``{"amount": int, "currency": "USD", "reference": "<payment id>"}``.

    * 201 ``{"id": "ch_…", "status": "succeeded", "amount", "currency",
      "reference", "idempotency_key", "created_at", "refunded_at": null,
      "amount_refunded": 0}``, and the charge enters the ledger.
    * 402 ``card_declined`` (type ``card_error``): terminal, not a charge.
    * The first *definitive* answer (201 or 402) is stored for the key: the
      same key and body again gets it back byte for byte with header
      ``Idempotent-Replayed: true``, and never charges twice.
    * Same key, different body: 422 ``idempotency_key_mismatch``.
    * Same key while its first request is still being processed: 409
      ``idempotency_key_in_use`` (requests are serialized per key).
    * Transient answers (429, 5xx, 504 timeouts) are not stored: a retry with
      the same key is processed anew.
    * Keys are forgotten ``--key-retention-seconds`` after their answer;
      charges keep their reference forever.
    * Magic amounts, whatever the fault settings (they skip latency, the
      rate ceiling and every random fault): 40002 always declines,
      50003 always answers 503 (never charges, never stored).
    * A fresh answer that waited an injected latency says how long in
      ``Fake-Latency-Ms`` (milliseconds, three decimals), so tests can check
      the latency distribution without timing anything; replays do not wait.

    ``GET /v1/charges?reference=R`` → ``{"data": [charges]}``;
    ``GET /v1/charges/{id}`` → the charge, or 404 ``resource_missing``.

Refunds
    ``POST /v1/refunds`` with ``Idempotency-Key`` and ``{"charge": id,
    "amount"?: int}`` (default: the full amount) → 201 ``{"id": "re_…",
    "charge", "amount", "status": "succeeded", "created_at"}``; the charge
    becomes ``status: "refunded"`` with ``refunded_at``. Idempotent per key
    like charges. Unknown charge → 404; a charge already refunded, asked
    under a new key → 409 ``charge_already_refunded``.

Settlement
    ``GET /v1/settlement-report?date=YYYY-MM-DD`` → ``text/csv`` with header
    ``charge_id,idempotency_key,reference,amount,currency,status,created_at``
    and one row per charge created that UTC day (refunded ones included).
"""

from __future__ import annotations

import csv
import io
import re
from datetime import date
from typing import Any

from aiohttp import web

from gateway.fake import errors
from gateway.fake.jsonapi import (
    REPLAYED_HEADERS,
    ApiError,
    ErrorShape,
    RefusalAnswers,
    dumps,
    idempotency_key,
    invalid,
    json_object,
    json_response,
    latency_headers,
    raw_json_response,
    route_table,
)
from gateway.fake.keys import KeyEntry
from gateway.fake.ledger import Charge
from gateway.fake.processor import DECLINE, UNAVAILABLE, FakeProcessor, Fate, Outcome

#: Stripe-test-card style amounts whose answer never depends on the faults.
DECLINE_AMOUNT = 40002
UNAVAILABLE_AMOUNT = 50003
MAGIC_FATES = {DECLINE_AMOUNT: DECLINE, UNAVAILABLE_AMOUNT: UNAVAILABLE}

CURRENCY_RE = re.compile(r"[A-Z]{3}")
DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
SETTLEMENT_COLUMNS = (
    "charge_id",
    "idempotency_key",
    "reference",
    "amount",
    "currency",
    "status",
    "created_at",
)
DECLINED_BODY = {
    "error": {
        "code": "card_declined",
        "type": "card_error",
        "message": "the card was declined",
    }
}

#: Every refusal of the core a card request can meet, as this surface answers it.
REFUSAL_ANSWERS: RefusalAnswers = {
    errors.KeyInUse: ErrorShape(409, "idempotency_key_in_use", "idempotency_error"),
    errors.KeyMismatch: ErrorShape(422, "idempotency_key_mismatch", "idempotency_error"),
    errors.RateLimited: ErrorShape(429, "rate_limited", "rate_limit_error", {"Retry-After": "1"}),
    errors.ChargeMissing: ErrorShape(404, "resource_missing"),
    errors.AlreadyRefunded: ErrorShape(409, "charge_already_refunded"),
    errors.RefundExceedsCharge: ErrorShape(400, "invalid_request"),
}


def routes(processor: FakeProcessor) -> list[web.RouteDef]:
    """The card surface's routes, over `processor`."""
    surface = CardSurface(processor)
    return route_table(
        [
            ("POST", "/v1/charges", surface.create_charge),
            ("GET", "/v1/charges", surface.list_charges),
            ("GET", "/v1/charges/{charge_id}", surface.get_charge),
            ("POST", "/v1/refunds", surface.create_refund),
            ("GET", "/v1/settlement-report", surface.settlement_report),
        ],
        REFUSAL_ANSWERS,
    )


class CardSurface:
    """The card API's handlers."""

    def __init__(self, processor: FakeProcessor) -> None:
        self.processor = processor

    async def create_charge(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/charges`: charge once per idempotency key, faults permitting."""
        processor = self.processor
        stats = processor.stats
        stats["charge_requests"] += 1
        stats["charges_in_progress"] += 1
        stats["charges_in_progress_max"] = max(
            stats["charges_in_progress_max"], stats["charges_in_progress"]
        )
        try:
            return await self._create_charge(request)
        finally:
            stats["charges_in_progress"] -= 1

    async def _create_charge(self, request: web.Request) -> web.StreamResponse:
        processor = self.processor
        key = idempotency_key(request)
        amount, currency, reference = _charge_params(await json_object(request))
        forced = MAGIC_FATES.get(amount)
        if forced is None:
            processor.admit()
        entry = processor.claim(key, ("charge", amount, currency, reference))
        if entry.answered:
            return _replay(entry)
        try:
            fate = await processor.fate(forced)
            return self._answer(request, entry, fate, amount, currency, reference)
        finally:
            processor.keys.release(entry)

    def _answer(
        self,
        request: web.Request,
        entry: KeyEntry,
        fate: Fate,
        amount: int,
        currency: str,
        reference: str,
    ) -> web.StreamResponse:
        """The answer to a charge request whose fate is decided; stored if definitive."""
        outcome = fate.outcome
        headers = latency_headers(fate.latency_ms)
        if outcome is Outcome.TIMEOUT:
            raise ApiError(
                504,
                "gateway_timeout",
                "the processor did not answer",
                kind="api_error",
                headers=headers,
            )
        if outcome is Outcome.SERVER_ERROR:
            raise ApiError(
                fate.error_status,
                "processing_error",
                "transient processor error",
                kind="api_error",
                headers=headers,
            )
        if outcome is Outcome.UNAVAILABLE:
            raise ApiError(503, "service_unavailable", "try again later", kind="api_error")
        if outcome is Outcome.DECLINE:
            return self._store(entry, 402, DECLINED_BODY, headers)
        charge = self.processor.record_charge(entry, amount, currency, reference)
        response = self._store(entry, 201, charge, headers)
        if outcome is Outcome.CHARGE_THEN_DROP:
            return _drop_connection(request)
        return response

    def _store(
        self, entry: KeyEntry, status: int, payload: Any, headers: dict[str, str] | None = None
    ) -> web.Response:
        """Keep a definitive answer for the entry's key (not `headers`), and return it."""
        body = dumps(payload)
        self.processor.keys.store(entry, status, body)
        return raw_json_response(status, body, headers=headers)

    async def list_charges(self, request: web.Request) -> web.StreamResponse:
        """`GET /v1/charges?reference=`: the charges with that reference, kept forever."""
        reference = request.query.get("reference")
        if not reference:
            raise invalid("the reference query parameter is required")
        return json_response(200, {"data": self.processor.ledger.with_reference(reference)})

    async def get_charge(self, request: web.Request) -> web.StreamResponse:
        """`GET /v1/charges/{id}`."""
        charge = self.processor.ledger.get(request.match_info["charge_id"])
        if charge is None:
            raise errors.ChargeMissing("no such charge")
        return json_response(200, charge)

    async def create_refund(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/refunds`: refund a charge once, idempotent per key."""
        key = idempotency_key(request)
        charge_id, amount = _refund_params(await json_object(request))
        entry = self.processor.claim(key, ("refund", charge_id, amount))
        if entry.answered:
            return _replay(entry)
        try:
            return self._store(entry, 201, self.processor.refund(charge_id, amount))
        finally:
            self.processor.keys.release(entry)

    async def settlement_report(self, request: web.Request) -> web.StreamResponse:
        """`GET /v1/settlement-report?date=`: the day's charges as CSV."""
        day = _report_date(request.query.get("date"))
        report = _settlement_csv(self.processor.ledger.created_on(day))
        return web.Response(text=report, content_type="text/csv")


# ---- request parsing


def _positive_int(value: Any, name: str) -> int:
    """A strictly positive JSON integer; 25.0, "25" and true are refused (money is exact)."""
    if type(value) is not int or value <= 0:
        raise invalid(f"{name} must be a positive integer (minor units)")
    return value


def _charge_params(body: dict[str, Any]) -> tuple[int, str, str]:
    """(amount, currency, reference) of a charge request, validated."""
    amount = _positive_int(body.get("amount"), "amount")
    currency = body.get("currency")
    if not isinstance(currency, str) or not CURRENCY_RE.fullmatch(currency):
        raise invalid("currency must be a three-letter upper-case ISO 4217 code")
    reference = body.get("reference")
    if not isinstance(reference, str) or not reference:
        raise invalid("reference must be a non-empty string")
    return amount, currency, reference


def _refund_params(body: dict[str, Any]) -> tuple[str, int | None]:
    """(charge id, amount or None for the full amount) of a refund request."""
    charge_id = body.get("charge")
    if not isinstance(charge_id, str) or not charge_id:
        raise invalid("charge must be a charge id")
    amount = body.get("amount")
    if amount is not None:
        amount = _positive_int(amount, "amount")
    return charge_id, amount


def _report_date(raw: str | None) -> str:
    """A `YYYY-MM-DD` calendar date from the query string, or a 400."""
    if raw is None or not DATE_RE.fullmatch(raw):
        raise invalid("date must be YYYY-MM-DD")
    try:
        date.fromisoformat(raw)
    except ValueError:
        raise invalid("date must be a real calendar date") from None
    return raw


# ---- answers


def _replay(entry: KeyEntry) -> web.Response:
    """The stored answer of an entry, marked as a replay."""
    assert entry.status is not None, "only an answered entry is replayed"
    return raw_json_response(entry.status, entry.body, headers=REPLAYED_HEADERS)


def _settlement_csv(charges: list[Charge]) -> str:
    """The settlement report body for these charges."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(SETTLEMENT_COLUMNS)
    for charge in charges:
        writer.writerow(
            [
                charge["id"],
                charge["idempotency_key"],
                charge["reference"],
                charge["amount"],
                charge["currency"],
                charge["status"],
                charge["created_at"],
            ]
        )
    return out.getvalue()


def _drop_connection(request: web.Request) -> web.Response:
    """Close the client's connection without answering.

    The response returned is never sent: aiohttp fails to write it to the
    closed transport and quietly ends the connection, so the client sees a
    disconnect (httpx: RemoteProtocolError), not an HTTP answer.
    """
    transport = request.transport
    if transport is not None:
        transport.close()
    return web.Response(status=204)
