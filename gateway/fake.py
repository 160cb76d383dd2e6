"""Fake card processor: one asyncio process, its ledger in memory.

It behaves like a real processor closely enough for paycron's tests and demo
to meet every failure the engine must survive, and it shares no code with the
engine (it is someone else's service, reached over HTTP only).

Run: ``python -m gateway.fake [--host 127.0.0.1] [--port 9090]
[--key-retention-seconds 86400] [--seed N]``.

JSON everywhere; amounts are positive integers in minor units (not floats,
not strings, not booleans). Errors are ``{"error": {"code", "type",
"message"}}``; a malformed request is 400 ``invalid_request``.

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

Test controls (underscore paths: not part of a real processor)
    ``POST /_faults`` with any subset of ``latency_ms``, ``decline_rate``,
    ``error_rate`` (500/502/503, no charge), ``timeout_rate`` (sleep
    ``timeout_sleep_ms`` then 504, no charge), ``charge_then_drop_rate``
    (charge, store the answer, then close the connection unanswered),
    ``rate_limit_per_s`` (more charge requests than this in the current
    one-second window → 429 with ``Retry-After``; 0 or null = unlimited),
    ``seed`` (reseed the fault dice) and ``reset: true`` (defaults first).
    Rates are probabilities in [0, 1]. ``GET /_faults`` shows the settings,
    ``GET /_stats`` the counters, ``GET /_ledger`` every charge (succeeded
    or refunded), ``POST /_reset`` forgets everything; ``GET /healthz``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import dataclasses
import functools
import io
import json
import random
import re
import secrets
import sys
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime
from typing import Any

from aiohttp import web

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9090
#: Keys are remembered a day, as at Stripe; the engine must not rely on more.
DEFAULT_KEY_RETENTION_SECONDS = 86400.0
#: A "timeout" sleeps far longer than any sane client waits, so the client
#: gives up first and sees a timeout, not our 504.
DEFAULT_TIMEOUT_SLEEP_MS = 30_000
#: In-flight handlers get this long to finish at shutdown; a sleeping
#: "timeout" handler must not hold the process for 30 s.
SHUTDOWN_TIMEOUT_SECONDS = 1.0
#: Pending connections the listening socket queues: a burst of engine workers
#: connecting at once must not see refusals (aiohttp's default is 128).
LISTEN_BACKLOG = 1024

#: Stripe-test-card style amounts whose answer never depends on the faults.
DECLINE_AMOUNT = 40002
UNAVAILABLE_AMOUNT = 50003
MAGIC_AMOUNTS = frozenset({DECLINE_AMOUNT, UNAVAILABLE_AMOUNT})

#: The statuses an injected server error picks from.
SERVER_ERROR_STATUSES = (500, 502, 503)
#: Idempotency keys are 1..255 printable characters (255 is Stripe's limit too).
MAX_KEY_LENGTH = 255
CURRENCY_RE = re.compile(r"[A-Z]{3}")
DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")

LEDGER_FIELDS = (
    "id", "idempotency_key", "reference", "amount", "currency", "status", "created_at",
)
SETTLEMENT_COLUMNS = (
    "charge_id", "idempotency_key", "reference", "amount", "currency", "status", "created_at",
)
STAT_NAMES = (
    "charge_requests", "rate_limited", "declined", "errors", "timeouts", "dropped",
    "charges", "replays", "in_use", "key_mismatches", "refunds",
)

JSON_TYPE = "application/json"
REPLAYED_HEADERS = {"Idempotent-Replayed": "true"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# --------------------------------------------------------------------------
# Errors and JSON helpers


class ApiError(Exception):
    """An error answer, raised anywhere in a handler and rendered by `_api`."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.kind = kind
        self.headers = headers

    def response(self) -> web.Response:
        """The HTTP answer for this error."""
        payload = {"error": {"code": self.code, "type": self.kind, "message": self.message}}
        return _json_response(self.status, payload, headers=self.headers)


def _invalid(message: str) -> ApiError:
    """A 400 for a malformed request."""
    return ApiError(400, "invalid_request", message)


#: One encoder for every answer: `json.dumps` with options would build one per call.
_ENCODE_JSON = json.JSONEncoder(separators=(",", ":")).encode


def _dumps(payload: Any) -> bytes:
    """Compact JSON bytes: the stored, replayable form of an answer."""
    return _ENCODE_JSON(payload).encode()


def _json_response(
    status: int, payload: Any, *, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON answer."""
    return web.Response(
        body=_dumps(payload), status=status, content_type=JSON_TYPE, headers=headers
    )


def _api(handler: Handler) -> Handler:
    """Render the `ApiError`s a handler raises as their HTTP answers."""

    @functools.wraps(handler)
    async def wrapper(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return exc.response()

    return wrapper


# --------------------------------------------------------------------------
# Request parsing and validation


async def _json_object(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or a 400."""
    try:
        payload = json.loads((await request.read()).decode())
    except ValueError:
        raise _invalid("the body must be a JSON object") from None
    if not isinstance(payload, dict):
        raise _invalid("the body must be a JSON object")
    return payload


def _idempotency_key(request: web.Request) -> str:
    """The request's `Idempotency-Key` header, required on every POST that moves money."""
    key = request.headers.get("Idempotency-Key")
    if not key:
        raise _invalid("the Idempotency-Key header is required")
    if len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise _invalid(f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} printable characters")
    return key


def _positive_int(value: Any, name: str) -> int:
    """A strictly positive JSON integer; 25.0, "25" and true are refused (money is exact)."""
    if type(value) is not int or value <= 0:
        raise _invalid(f"{name} must be a positive integer (minor units)")
    return value


def _charge_params(body: dict[str, Any]) -> tuple[int, str, str]:
    """(amount, currency, reference) of a charge request, validated."""
    amount = _positive_int(body.get("amount"), "amount")
    currency = body.get("currency")
    if not isinstance(currency, str) or not CURRENCY_RE.fullmatch(currency):
        raise _invalid("currency must be a three-letter upper-case ISO 4217 code")
    reference = body.get("reference")
    if not isinstance(reference, str) or not reference:
        raise _invalid("reference must be a non-empty string")
    return amount, currency, reference


def _refund_params(body: dict[str, Any]) -> tuple[str, int | None]:
    """(charge id, amount or None for the full amount) of a refund request."""
    charge_id = body.get("charge")
    if not isinstance(charge_id, str) or not charge_id:
        raise _invalid("charge must be a charge id")
    amount = body.get("amount")
    if amount is not None:
        amount = _positive_int(amount, "amount")
    return charge_id, amount


def _report_date(raw: str | None) -> str:
    """A `YYYY-MM-DD` calendar date from the query string, or a 400."""
    if raw is None or not DATE_RE.fullmatch(raw):
        raise _invalid("date must be YYYY-MM-DD")
    try:
        date.fromisoformat(raw)
    except ValueError:
        raise _invalid("date must be a real calendar date") from None
    return raw


# --------------------------------------------------------------------------
# Fault settings


@dataclasses.dataclass(frozen=True, slots=True)
class Faults:
    """What goes wrong, and how often; the defaults inject nothing."""

    latency_ms: int = 0
    decline_rate: float = 0.0
    error_rate: float = 0.0
    timeout_rate: float = 0.0
    timeout_sleep_ms: int = DEFAULT_TIMEOUT_SLEEP_MS
    charge_then_drop_rate: float = 0.0
    rate_limit_per_s: int | None = None


RATE_FIELDS = ("decline_rate", "error_rate", "timeout_rate", "charge_then_drop_rate")
MILLISECOND_FIELDS = ("latency_ms", "timeout_sleep_ms")
FAULT_FIELDS = frozenset(field.name for field in dataclasses.fields(Faults))


def _is_number(value: Any) -> bool:
    """A JSON number that is not a boolean."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def updated_faults(current: Faults, payload: dict[str, Any]) -> Faults:
    """The settings after applying a `POST /_faults` body, all validated first.

    Nothing changes unless the whole body is valid, so a typo in one field
    never leaves a half-applied configuration behind.
    """
    unknown = set(payload) - FAULT_FIELDS - {"reset", "seed"}
    if unknown:
        raise _invalid(f"unknown fault settings: {', '.join(sorted(unknown))}")
    reset = payload.get("reset", False)
    if not isinstance(reset, bool):
        raise _invalid("reset must be a boolean")
    changes: dict[str, Any] = {}
    for name in RATE_FIELDS:
        if name in payload:
            value = payload[name]
            if not _is_number(value) or not 0 <= value <= 1:
                raise _invalid(f"{name} must be a probability between 0 and 1")
            changes[name] = float(value)
    for name in MILLISECOND_FIELDS:
        if name in payload:
            value = payload[name]
            if type(value) is not int or value < 0:
                raise _invalid(f"{name} must be a non-negative integer")
            changes[name] = value
    if "rate_limit_per_s" in payload:
        value = payload["rate_limit_per_s"]
        if value is not None and (type(value) is not int or value < 0):
            raise _invalid("rate_limit_per_s must be a non-negative integer or null")
        changes["rate_limit_per_s"] = value or None
    return dataclasses.replace(Faults() if reset else current, **changes)


def _seed_setting(payload: dict[str, Any], current: int | None) -> int | None:
    """The `seed` a `POST /_faults` body asks for (validated), else the current one."""
    if "seed" not in payload:
        return current
    seed = payload["seed"]
    if seed is not None and type(seed) is not int:
        raise _invalid("seed must be an integer or null")
    return seed


# --------------------------------------------------------------------------
# Idempotency keys


class KeyEntry:
    """One idempotency key: its request fingerprint and, once known, its stored answer.

    `status` is None while the first request is still being processed.
    """

    __slots__ = ("key", "fingerprint", "status", "body", "expires_at")

    def __init__(self, key: str, fingerprint: tuple[Any, ...]) -> None:
        self.key = key
        self.fingerprint = fingerprint
        self.status: int | None = None
        self.body = b""
        self.expires_at = 0.0


class KeyStore:
    """Idempotency keys: serialize requests per key and replay definitive answers.

    Keys are forgotten `retention_seconds` after their answer was stored. The
    retention is the same for every key, so the expiry queue is in expiry
    order and each claim prunes it in amortized O(1).
    """

    def __init__(self, *, retention_seconds: float) -> None:
        self.retention_seconds = retention_seconds
        self._entries: dict[str, KeyEntry] = {}
        self._expiry: deque[KeyEntry] = deque()

    def claim(
        self, key: str, fingerprint: tuple[Any, ...]
    ) -> tuple[KeyEntry | None, web.Response | None]:
        """Take `key` for a new request, or answer from what the key already holds.

        Returns (entry, None) when the caller now processes the request and
        must `store` or `release` the entry, or (None, replay) with the
        stored answer. Raises 422 for another body under the key, 409 while
        the key's first request is still in progress.
        """
        self._prune(time.monotonic())
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = KeyEntry(key, fingerprint)
            return entry, None
        if entry.fingerprint != fingerprint:
            raise ApiError(
                422, "idempotency_key_mismatch",
                "this Idempotency-Key was used with a different request body",
                kind="idempotency_error",
            )
        if entry.status is None:
            raise ApiError(
                409, "idempotency_key_in_use",
                "a request with this Idempotency-Key is still being processed",
                kind="idempotency_error",
            )
        replay = web.Response(
            body=entry.body, status=entry.status, content_type=JSON_TYPE, headers=REPLAYED_HEADERS
        )
        return None, replay

    def store(self, entry: KeyEntry, status: int, payload: Any) -> web.Response:
        """Keep a definitive answer for the entry's key, and return it."""
        entry.status = status
        entry.body = _dumps(payload)
        entry.expires_at = time.monotonic() + self.retention_seconds
        self._expiry.append(entry)
        return web.Response(body=entry.body, status=status, content_type=JSON_TYPE)

    def release(self, entry: KeyEntry) -> None:
        """Free a key whose request ended without a definitive answer (nothing is kept)."""
        if entry.status is None and self._entries.get(entry.key) is entry:
            del self._entries[entry.key]

    def clear(self) -> None:
        """Forget every key."""
        self._entries.clear()
        self._expiry.clear()

    def _prune(self, now: float) -> None:
        """Forget keys whose retention has passed."""
        expiry = self._expiry
        while expiry and expiry[0].expires_at <= now:
            entry = expiry.popleft()
            if self._entries.get(entry.key) is entry:
                del self._entries[entry.key]


# --------------------------------------------------------------------------
# Rate ceiling


class RateWindow:
    """Counts requests in the current one-second window (a fixed-window ceiling).

    Windows are wall-clock seconds, like most processors' published limits
    (and Dramatiq's window rate limiter), so a client pacing itself per
    wall-clock second is never refused."""

    def __init__(self) -> None:
        self._window = -1
        self._count = 0

    def allow(self, limit: int) -> bool:
        """Count one request; False if it is above `limit` for this second."""
        window = int(time.time())
        if window != self._window:
            self._window = window
            self._count = 0
        self._count += 1
        return self._count <= limit


# --------------------------------------------------------------------------
# Ledger


class Ledger:
    """Every charge ever made, indexed by id, by reference and by UTC day."""

    def __init__(self) -> None:
        self._charges: dict[str, dict[str, Any]] = {}
        self._by_reference: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
        self._by_day: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)

    def record_charge(
        self, *, key: str, amount: int, currency: str, reference: str
    ) -> dict[str, Any]:
        """Make a succeeded charge and return it."""
        created_at = datetime.now(UTC).isoformat()
        charge = {
            "id": "ch_" + secrets.token_hex(12),
            "status": "succeeded",
            "amount": amount,
            "currency": currency,
            "reference": reference,
            "idempotency_key": key,
            "created_at": created_at,
            "refunded_at": None,
            "amount_refunded": 0,
        }
        self._charges[charge["id"]] = charge
        self._by_reference[reference].append(charge)
        self._by_day[created_at[:10]].append(charge)  # the UTC day, YYYY-MM-DD
        return charge

    def refund(self, charge: dict[str, Any], amount: int) -> dict[str, Any]:
        """Mark `charge` refunded by `amount` and return the refund."""
        now = datetime.now(UTC).isoformat()
        charge["status"] = "refunded"
        charge["refunded_at"] = now
        charge["amount_refunded"] = amount
        return {
            "id": "re_" + secrets.token_hex(12),
            "charge": charge["id"],
            "amount": amount,
            "currency": charge["currency"],
            "status": "succeeded",
            "created_at": now,
        }

    def get(self, charge_id: str) -> dict[str, Any] | None:
        """The charge with this id, if any."""
        return self._charges.get(charge_id)

    def with_reference(self, reference: str) -> list[dict[str, Any]]:
        """Charges carrying this reference, oldest first."""
        return self._by_reference.get(reference, [])

    def created_on(self, day: str) -> list[dict[str, Any]]:
        """Charges created on this UTC day (`YYYY-MM-DD`), oldest first."""
        return self._by_day.get(day, [])

    def entries(self) -> list[dict[str, Any]]:
        """Every charge in the `/_ledger` shape, oldest first."""
        return [{name: charge[name] for name in LEDGER_FIELDS} for charge in self._charges.values()]


def _settlement_csv(charges: list[dict[str, Any]]) -> str:
    """The settlement report body for these charges."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(SETTLEMENT_COLUMNS)
    for charge in charges:
        writer.writerow([
            charge["id"], charge["idempotency_key"], charge["reference"], charge["amount"],
            charge["currency"], charge["status"], charge["created_at"],
        ])
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


# --------------------------------------------------------------------------
# The service


class FakeGateway:
    """The gateway's state (ledger, keys, faults, counters) and its HTTP handlers."""

    def __init__(self, *, retention_seconds: float, seed: int | None = None) -> None:
        self.keys = KeyStore(retention_seconds=retention_seconds)
        self.ledger = Ledger()
        self.rate_window = RateWindow()
        self.faults = Faults()
        self.initial_seed = seed
        self.seed = seed
        self.rng = random.Random(seed)
        self.stats = dict.fromkeys(STAT_NAMES, 0)

    def reset(self) -> None:
        """Forget the ledger, the keys, the faults and the counters."""
        self.keys.clear()
        self.ledger = Ledger()
        self.rate_window = RateWindow()
        self.faults = Faults()
        self.seed = self.initial_seed
        self.rng = random.Random(self.seed)
        self.stats = dict.fromkeys(STAT_NAMES, 0)

    # ---- charges

    async def create_charge(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/charges`: charge once per idempotency key, faults permitting."""
        self.stats["charge_requests"] += 1
        key = _idempotency_key(request)
        amount, currency, reference = _charge_params(await _json_object(request))
        magic = amount in MAGIC_AMOUNTS
        if not magic:
            self._enforce_rate_limit()
        entry, replay = self._claim(key, ("charge", amount, currency, reference))
        if entry is None:
            return replay
        try:
            if magic:
                return self._magic_answer(entry, amount)
            return await self._charge_with_faults(request, entry, amount, currency, reference)
        finally:
            self.keys.release(entry)

    def _claim(
        self, key: str, fingerprint: tuple[Any, ...]
    ) -> tuple[KeyEntry | None, web.Response | None]:
        """`KeyStore.claim`, counting replays, conflicts and mismatches."""
        try:
            entry, replay = self.keys.claim(key, fingerprint)
        except ApiError as exc:
            self.stats["in_use" if exc.status == 409 else "key_mismatches"] += 1
            raise
        if replay is not None:
            self.stats["replays"] += 1
        return entry, replay

    def _enforce_rate_limit(self) -> None:
        """A 429 (not stored, no charge) above the per-second ceiling."""
        limit = self.faults.rate_limit_per_s
        if limit and not self.rate_window.allow(limit):
            self.stats["rate_limited"] += 1
            raise ApiError(
                429, "rate_limited", f"more than {limit} charge requests this second",
                kind="rate_limit_error", headers={"Retry-After": "1"},
            )

    def _magic_answer(self, entry: KeyEntry, amount: int) -> web.Response:
        """The fixed answer of a magic amount: a stored decline, or a 503."""
        if amount == DECLINE_AMOUNT:
            return self._decline(entry)
        self.stats["errors"] += 1
        raise ApiError(503, "service_unavailable", "try again later", kind="api_error")

    async def _charge_with_faults(
        self, request: web.Request, entry: KeyEntry, amount: int, currency: str, reference: str
    ) -> web.StreamResponse:
        """Process a charge through the configured faults, in a fixed order."""
        faults = self.faults
        if faults.latency_ms:
            await asyncio.sleep(faults.latency_ms / 1000)
        if self._roll(faults.timeout_rate):
            self.stats["timeouts"] += 1
            # The key stays in use for the sleep, then is released (nothing stored).
            await asyncio.sleep(faults.timeout_sleep_ms / 1000)
            raise ApiError(504, "gateway_timeout", "the processor did not answer", kind="api_error")
        if self._roll(faults.error_rate):
            self.stats["errors"] += 1
            status = self.rng.choice(SERVER_ERROR_STATUSES)
            raise ApiError(
                status, "processing_error", "transient processor error", kind="api_error"
            )
        if self._roll(faults.decline_rate):
            return self._decline(entry)
        response = self._charge(entry, amount, currency, reference)
        if self._roll(faults.charge_then_drop_rate):
            self.stats["dropped"] += 1
            return _drop_connection(request)
        return response

    def _roll(self, rate: float) -> bool:
        """True with probability `rate`; the dice are only thrown when a fault is on."""
        return rate > 0 and self.rng.random() < rate

    def _decline(self, entry: KeyEntry) -> web.Response:
        """Store and return a terminal decline (not a charge)."""
        self.stats["declined"] += 1
        payload = {"error": {
            "code": "card_declined", "type": "card_error", "message": "the card was declined",
        }}
        return self.keys.store(entry, 402, payload)

    def _charge(self, entry: KeyEntry, amount: int, currency: str, reference: str) -> web.Response:
        """Record a charge, store its answer for the key, and return it."""
        charge = self.ledger.record_charge(
            key=entry.key, amount=amount, currency=currency, reference=reference
        )
        self.stats["charges"] += 1
        return self.keys.store(entry, 201, charge)

    async def list_charges(self, request: web.Request) -> web.StreamResponse:
        """`GET /v1/charges?reference=`: the charges with that reference, kept forever."""
        reference = request.query.get("reference")
        if not reference:
            raise _invalid("the reference query parameter is required")
        return _json_response(200, {"data": self.ledger.with_reference(reference)})

    async def get_charge(self, request: web.Request) -> web.StreamResponse:
        """`GET /v1/charges/{id}`."""
        charge = self.ledger.get(request.match_info["charge_id"])
        if charge is None:
            raise ApiError(404, "resource_missing", "no such charge")
        return _json_response(200, charge)

    # ---- refunds

    async def create_refund(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/refunds`: refund a charge once, idempotent per key."""
        key = _idempotency_key(request)
        charge_id, amount = _refund_params(await _json_object(request))
        entry, replay = self._claim(key, ("refund", charge_id, amount))
        if entry is None:
            return replay
        try:
            charge = self.ledger.get(charge_id)
            if charge is None:
                raise ApiError(404, "resource_missing", "no such charge")
            if charge["status"] == "refunded":
                raise ApiError(409, "charge_already_refunded", "the charge is already refunded")
            if amount is not None and amount > charge["amount"]:
                raise _invalid("amount exceeds the charge")
            refund = self.ledger.refund(charge, charge["amount"] if amount is None else amount)
            self.stats["refunds"] += 1
            return self.keys.store(entry, 201, refund)
        finally:
            self.keys.release(entry)

    # ---- settlement

    async def settlement_report(self, request: web.Request) -> web.StreamResponse:
        """`GET /v1/settlement-report?date=`: the day's charges as CSV."""
        day = _report_date(request.query.get("date"))
        report = _settlement_csv(self.ledger.created_on(day))
        return web.Response(text=report, content_type="text/csv")

    # ---- test controls

    async def get_faults(self, request: web.Request) -> web.StreamResponse:
        """`GET /_faults`: the current fault settings."""
        return _json_response(200, self._fault_settings())

    async def set_faults(self, request: web.Request) -> web.StreamResponse:
        """`POST /_faults`: change any subset of the settings (400 and no change if invalid)."""
        payload = await _json_object(request)
        faults = updated_faults(self.faults, payload)
        reset = payload.get("reset", False)
        seed = _seed_setting(payload, self.initial_seed if reset else self.seed)
        if reset or "seed" in payload:
            self.rng = random.Random(seed)
        self.faults, self.seed = faults, seed
        return _json_response(200, self._fault_settings())

    def _fault_settings(self) -> dict[str, Any]:
        """The fault settings and the seed, as JSON."""
        return {**dataclasses.asdict(self.faults), "seed": self.seed}

    async def get_stats(self, request: web.Request) -> web.StreamResponse:
        """`GET /_stats`: request and outcome counters since the last reset."""
        return _json_response(200, self.stats)

    async def get_ledger(self, request: web.Request) -> web.StreamResponse:
        """`GET /_ledger`: every charge (succeeded or refunded): the truth tests check against."""
        return _json_response(200, {"charges": self.ledger.entries()})

    async def post_reset(self, request: web.Request) -> web.StreamResponse:
        """`POST /_reset`: back to an empty gateway with no faults."""
        self.reset()
        return _json_response(200, {"reset": True})

    async def healthz(self, request: web.Request) -> web.StreamResponse:
        """`GET /healthz`: the process is up."""
        return _json_response(200, {"status": "ok"})


GATEWAY = web.AppKey("gateway", FakeGateway)


def make_app(
    retention_seconds: float = DEFAULT_KEY_RETENTION_SECONDS, *, seed: int | None = None
) -> web.Application:
    """The fake gateway as an aiohttp application (its state in `app[GATEWAY]`)."""
    gateway = FakeGateway(retention_seconds=retention_seconds, seed=seed)
    app = web.Application()
    app[GATEWAY] = gateway
    app.add_routes([
        web.post("/v1/charges", _api(gateway.create_charge)),
        web.get("/v1/charges", _api(gateway.list_charges)),
        web.get("/v1/charges/{charge_id}", _api(gateway.get_charge)),
        web.post("/v1/refunds", _api(gateway.create_refund)),
        web.get("/v1/settlement-report", _api(gateway.settlement_report)),
        web.get("/_faults", _api(gateway.get_faults)),
        web.post("/_faults", _api(gateway.set_faults)),
        web.get("/_stats", _api(gateway.get_stats)),
        web.get("/_ledger", _api(gateway.get_ledger)),
        web.post("/_reset", _api(gateway.post_reset)),
        web.get("/healthz", _api(gateway.healthz)),
    ])
    return app


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line of `python -m gateway.fake`."""
    parser = argparse.ArgumentParser(
        prog="python -m gateway.fake", description="Serve the fake card processor."
    )
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--key-retention-seconds", type=float, default=DEFAULT_KEY_RETENTION_SECONDS,
        help="how long an idempotency key's answer is remembered (default: one day)",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the fault dice")
    args = parser.parse_args(argv)
    if args.key_retention_seconds <= 0:
        parser.error("--key-retention-seconds must be positive")
    return args


def _announce(message: str) -> None:
    """Where aiohttp's start-up banner goes: stderr, so stdout stays quiet."""
    print(message, file=sys.stderr, flush=True)


def _event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when it is installed (about a quarter less CPU per request)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def main(argv: list[str] | None = None) -> None:
    """Serve the fake gateway until SIGINT/SIGTERM (no access log: it is on the hot path)."""
    args = _parse_args(argv)
    web.run_app(
        make_app(args.key_retention_seconds, seed=args.seed),
        host=args.host,
        port=args.port,
        access_log=None,
        print=_announce,
        shutdown_timeout=SHUTDOWN_TIMEOUT_SECONDS,
        backlog=LISTEN_BACKLOG,
        loop=_event_loop(),
    )


if __name__ == "__main__":
    main()
