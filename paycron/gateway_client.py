"""The engine's side of the payment gateway: an interface with typed outcomes.

:class:`HttpGateway` speaks the fake gateway's (Stripe-like) HTTP API; a real
processor's adapter is another implementation of :class:`Gateway`. Every
answer maps to one :class:`CallResult` so the worker never interprets HTTP.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

import httpx

from paycron.enums import Outcome
from paycron.errors import GatewayError


@dataclass(frozen=True)
class CallResult:
    """What one charge call ended as.

    ``in_doubt``: the call may have charged without telling us (timeout,
    dropped connection, 5xx). ``uses_budget``: it counts as a retryable
    failure in the payment's budget (a 429 does not: pacing is the answer).
    ``breaker_failure``: it counts against the gateway's health (429s and
    declines do not).
    """

    outcome: Outcome
    gateway_ref: str | None = None
    error_code: str | None = None
    in_doubt: bool = False
    uses_budget: bool = False
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
               reference: str) -> CallResult: ...

    def find_charge(self, reference: str) -> Charge | None:
        """The charge made for ``reference``, found without its idempotency key."""

    def refund(self, *, charge_id: str, idempotency_key: str) -> dict: ...

    def settlement_report(self, day: str) -> str: ...


def _declined(response: httpx.Response) -> str:
    try:
        return response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return "declined"


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["Retry-After"])
    except (KeyError, ValueError):
        return None


def classify(response: httpx.Response) -> CallResult:
    """One HTTP answer to a charge request, as an outcome."""
    status = response.status_code
    if status in (200, 201):
        return CallResult(Outcome.SUCCEEDED, gateway_ref=response.json()["id"])
    if status == 402:
        return CallResult(Outcome.DECLINED, error_code=_declined(response))
    if status == 429:
        return CallResult(Outcome.RATE_LIMITED, error_code="rate_limited",
                          retry_after=_retry_after(response))
    if status == 409:
        # Our key is being processed by another request (a zombie's call):
        # its outcome is unknown to us until we ask again.
        return CallResult(Outcome.AMBIGUOUS, error_code="idempotency_key_in_use",
                          in_doubt=True, uses_budget=True)
    if status >= 500:
        # A 5xx may come from behind the charge: treat it as in doubt.
        return CallResult(Outcome.RETRYABLE_ERROR, error_code=f"http_{status}",
                          in_doubt=True, uses_budget=True)
    # Any other 4xx is our bug or a gateway contract change: retry within the
    # budget, then park for a human rather than guess a decline.
    return CallResult(Outcome.RETRYABLE_ERROR, error_code=f"http_{status}", uses_budget=True)


class HttpGateway:
    """The fake gateway's HTTP API. Thread-safe; one keep-alive pool per process."""

    def __init__(self, base_url: str, *, timeout: float, max_connections: int = 64):
        self._base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._max_connections = max_connections
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None

    @property
    def client(self) -> httpx.Client:
        # Created lazily so a process that forks after constructing us (the
        # Dramatiq worker) does not share sockets with its parent.
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = httpx.Client(
                        base_url=self._base_url,
                        timeout=self._timeout,
                        limits=httpx.Limits(max_connections=self._max_connections,
                                            max_keepalive_connections=self._max_connections),
                    )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def charge(self, *, idempotency_key: str, amount: int, currency: str,
               reference: str) -> CallResult:
        try:
            response = self.client.post(
                "/v1/charges",
                json={"amount": amount, "currency": currency, "reference": reference},
                headers={"Idempotency-Key": idempotency_key},
            )
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # Never reached the gateway: a definitive non-charge.
            return CallResult(Outcome.RETRYABLE_ERROR, error_code=type(exc).__name__,
                              uses_budget=True)
        except httpx.HTTPError as exc:
            # Sent, then no answer (timeout, dropped connection): never guess.
            return CallResult(Outcome.AMBIGUOUS, error_code=type(exc).__name__,
                              in_doubt=True, uses_budget=True)
        return classify(response)

    def _get(self, path: str, **params) -> httpx.Response:
        try:
            response = self.client.get(path, params=params)
        except httpx.HTTPError as exc:
            raise GatewayError(f"gateway unreachable: {type(exc).__name__}") from exc
        if response.status_code >= 500:
            raise GatewayError(f"gateway answered {response.status_code}")
        return response

    def find_charge(self, reference: str) -> Charge | None:
        response = self._get("/v1/charges", reference=reference)
        response.raise_for_status()
        charges = response.json()["data"]
        if not charges:
            return None
        first = charges[0]
        return Charge(id=first["id"], reference=first["reference"], amount=first["amount"],
                      currency=first["currency"], status=first["status"])

    def refund(self, *, charge_id: str, idempotency_key: str) -> dict:
        try:
            response = self.client.post("/v1/refunds", json={"charge": charge_id},
                                        headers={"Idempotency-Key": idempotency_key})
        except httpx.HTTPError as exc:
            raise GatewayError(f"refund failed: {type(exc).__name__}") from exc
        if response.status_code not in (200, 201):
            raise GatewayError(f"refund refused: {response.status_code} {response.text[:200]}")
        return response.json()

    def settlement_report(self, day: str) -> str:
        response = self._get("/v1/settlement-report", date=day)
        response.raise_for_status()
        return response.text
