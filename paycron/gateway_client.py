"""The engine's side of the payment gateway: an interface with typed outcomes.

:class:`HttpGateway` speaks the fake gateway's (Stripe-like) HTTP API; a real
processor's adapter is another implementation of :class:`Gateway`. Every
answer maps to one :class:`CallResult` so the worker never interprets HTTP.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Protocol

import urllib3

from paycron.config import Config
from paycron.enums import Outcome
from paycron.errors import GatewayError


@dataclass(frozen=True)
class CallResult:
    """What one charge call ended as.

    ``in_doubt``: the call may have charged without telling us (timeout,
    dropped connection, 5xx). ``breaker_failure``: it counts against the
    gateway's health (429s and declines do not). Whether it uses budget is
    the policy's rule (paycron/policy.py), not the call's.
    """

    outcome: Outcome
    gateway_ref: str | None = None
    error_code: str | None = None
    in_doubt: bool = False
    retry_after: float | None = None

    @property
    def breaker_failure(self) -> bool:
        return self.outcome in (Outcome.RETRYABLE_ERROR, Outcome.AMBIGUOUS)


@dataclass(frozen=True)
class Charge:
    id: str
    reference: str
    amount: int
    currency: str
    status: str


class Gateway(Protocol):
    def charge(self, *, idempotency_key: str, amount: int, currency: str,
               reference: str, timeout: float | None = None) -> CallResult:
        """One charge call; ``timeout`` (seconds, total) shortens the
        configured one, so a call never outlives its lease."""

    def find_charge(self, reference: str) -> Charge | None:
        """The charge made for ``reference``, found without its idempotency key."""

    def refund(self, *, charge_id: str, idempotency_key: str) -> dict: ...

    def settlement_report(self, day: str) -> str: ...

    def close(self) -> None: ...


def _json(response: urllib3.BaseHTTPResponse):
    try:
        return json.loads(response.data)
    except ValueError:
        return None


#: A decline code is a short machine token; anything longer is not one.
MAX_ERROR_CODE_LENGTH = 64


def _error_code(value: object) -> str:
    """The gateway's error code as we store it: its text is untrusted (it
    reaches payers' attempts and operators' terminals), so printable ASCII
    without spaces, every other character as ``_``, at most
    MAX_ERROR_CODE_LENGTH; ``declined`` when there is no such text."""
    if not isinstance(value, str):
        return "declined"
    code = "".join(c if "!" <= c <= "~" else "_" for c in value[:MAX_ERROR_CODE_LENGTH])
    return code if code.strip("_") else "declined"


def _declined(response: urllib3.BaseHTTPResponse) -> str:
    try:
        return _error_code(_json(response)["error"]["code"])
    except (KeyError, TypeError):
        return "declined"


#: A Retry-After is honoured within these bounds (seconds): a gateway that
#: says 0 must not be hammered, one that says a year must not park the schedule.
RETRY_AFTER_BOUNDS = (1.0, 3600.0)


def _retry_after(response: urllib3.BaseHTTPResponse) -> float | None:
    """The 429's ``Retry-After`` in seconds, clamped to RETRY_AFTER_BOUNDS;
    None when absent or absurd (not a number, infinite, NaN, negative)."""
    try:
        seconds = float(response.headers["Retry-After"])
    except (KeyError, ValueError):
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    low, high = RETRY_AFTER_BOUNDS
    return min(max(seconds, low), high)


def _charge_id(response: urllib3.BaseHTTPResponse) -> str | None:
    """The charge id of a 2xx body, or None when the body is not one."""
    body = _json(response)
    charge_id = body.get("id") if isinstance(body, dict) else None
    return charge_id if isinstance(charge_id, str) and charge_id else None


def classify(response: urllib3.BaseHTTPResponse) -> CallResult:
    """One HTTP answer to a charge request, as an outcome."""
    status = response.status
    if status in (200, 201):
        charge_id = _charge_id(response)
        if charge_id is None:
            # It said yes but not what: the charge may exist. This payment is
            # in doubt and asked again under its key; its neighbours are not hurt.
            return CallResult(Outcome.AMBIGUOUS, error_code="malformed_answer", in_doubt=True)
        return CallResult(Outcome.SUCCEEDED, gateway_ref=charge_id)
    if status == 402:
        return CallResult(Outcome.DECLINED, error_code=_declined(response))
    if status == 429:
        return CallResult(Outcome.RATE_LIMITED, error_code="rate_limited",
                          retry_after=_retry_after(response))
    if status == 409:
        # Our key is being processed by another request (a zombie's call, or
        # one the processor still runs after our timeout): its outcome is
        # unknown to us until we ask again. Not a failure (SPEC §3).
        return CallResult(Outcome.KEY_IN_USE, error_code="idempotency_key_in_use",
                          in_doubt=True)
    if status >= 500:
        # A 5xx may come from behind the charge: treat it as in doubt.
        return CallResult(Outcome.RETRYABLE_ERROR, error_code=f"http_{status}",
                          in_doubt=True)
    # Any other 4xx is our bug or a gateway contract change: retry within the
    # budget, then park for a human rather than guess a decline.
    return CallResult(Outcome.RETRYABLE_ERROR, error_code=f"http_{status}")


#: The request never left us: a definitive non-charge.
_NOT_SENT = (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError,
             urllib3.exceptions.EmptyPoolError)


class HttpGateway:
    """The fake gateway's HTTP API over urllib3: thread-safe, keep-alive.

    urllib3 rather than httpx on this path: measured here, httpx spent
    1.46 ms of CPU per charge and its pool lock was the workers' hottest
    spot; urllib3 spends 0.53 ms.
    """

    def __init__(self, base_url: str, *, timeout: float, max_connections: int = 64):
        self._timeout = urllib3.Timeout(connect=min(timeout, 3.0), read=timeout)
        self._call_seconds = timeout
        self._pool = urllib3.PoolManager(num_pools=4, maxsize=max_connections, block=False,
                                         retries=False, timeout=self._timeout)
        self._base_url = base_url.rstrip("/")

    def close(self) -> None:
        self._pool.clear()

    def _request(self, method: str, path: str, *, body: dict | None = None,
                 headers: dict | None = None, fields: dict | None = None,
                 timeout: urllib3.Timeout | None = None):
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        return self._pool.request(
            method, self._base_url + path,
            body=json.dumps(body).encode() if body is not None else None,
            fields=fields, headers=all_headers, timeout=timeout or self._timeout,
        )

    def charge(self, *, idempotency_key: str, amount: int, currency: str,
               reference: str, timeout: float | None = None) -> CallResult:
        # total= bounds connect and every read together (read= alone is per
        # read: a trickling answer could outlast it), so the call ends in time.
        limit = urllib3.Timeout(total=min(timeout, self._call_seconds)) if timeout else None
        try:
            response = self._request(
                "POST", "/v1/charges",
                body={"amount": amount, "currency": currency, "reference": reference},
                headers={"Idempotency-Key": idempotency_key}, timeout=limit,
            )
        except _NOT_SENT as exc:
            return CallResult(Outcome.RETRYABLE_ERROR, error_code=type(exc).__name__)
        except urllib3.exceptions.HTTPError as exc:
            # Sent, then no answer (timeout, dropped connection): never guess.
            return CallResult(Outcome.AMBIGUOUS, error_code=type(exc).__name__,
                              in_doubt=True)
        return classify(response)

    def _get(self, path: str, **params):
        try:
            response = self._request("GET", path, fields=params)
        except urllib3.exceptions.HTTPError as exc:
            raise GatewayError(f"gateway unreachable: {type(exc).__name__}") from exc
        if response.status != 200:
            raise GatewayError(f"gateway answered {response.status} to GET {path}")
        return response

    def find_charge(self, reference: str) -> Charge | None:
        charges = _json(self._get("/v1/charges", reference=reference))["data"]
        if not charges:
            return None
        first = charges[0]
        return Charge(id=first["id"], reference=first["reference"], amount=first["amount"],
                      currency=first["currency"], status=first["status"])

    def refund(self, *, charge_id: str, idempotency_key: str) -> dict:
        try:
            response = self._request("POST", "/v1/refunds", body={"charge": charge_id},
                                     headers={"Idempotency-Key": idempotency_key})
        except urllib3.exceptions.HTTPError as exc:
            raise GatewayError(f"refund failed: {type(exc).__name__}") from exc
        if response.status not in (200, 201):
            raise GatewayError(f"refund refused: {response.status} {response.data[:200]!r}")
        return _json(response)

    def settlement_report(self, day: str) -> str:
        return self._get("/v1/settlement-report", date=day).data.decode()


def build_gateway(config: Config, *, max_connections: int = 64) -> Gateway:
    """The processor adapter this configuration names, for a composition root."""
    return HttpGateway(config.gateway_url, timeout=config.gateway_timeout_seconds,
                       max_connections=max_connections)
