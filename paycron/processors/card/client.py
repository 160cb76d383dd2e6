"""The fake gateway's adapter: its (Stripe-like) card API over urllib3.

One implementation of :class:`paycron.processors.base.Processor`; every answer maps to
one :class:`~paycron.processors.base.CallResult` (:func:`classify`).
"""

from __future__ import annotations

from datetime import UTC, date, datetime

import orjson
import urllib3

from paycron.deadline import deadline, pool_manager
from paycron.domain.enums import Outcome
from paycron.domain.processing import CallResult, Charge, ChargeRequest, LookupRequest, Refund
from paycron.errors import GatewayError, GatewayRequestRefused, ProcessorPaymentMissing
from paycron.processors.card.settlement_csv import parse_report
from paycron.processors.wire import (
    MAX_ANSWER_BYTES,
    MAX_REPORT_BYTES,
    NOT_SENT,
    AnswerTooLarge,
    answered_id,
    error_code_of,
    processor_id,
    read_bounded,
    retry_after,
)

#: The settlement report is a day's charges, streamed: it has this long in all.
REPORT_DEADLINE_SECONDS = 300.0


def _json(response: urllib3.BaseHTTPResponse):
    try:
        return orjson.loads(response.data)
    except ValueError:
        return None


def _declined(response: urllib3.BaseHTTPResponse) -> str:
    try:
        return error_code_of(_json(response)["error"]["code"])
    except (KeyError, TypeError):
        return "declined"


def _charge_id(response: urllib3.BaseHTTPResponse) -> str | None:
    """The charge id of a 2xx body, or None when the body is not one."""
    body = _json(response)
    return answered_id(body.get("id")) if isinstance(body, dict) else None


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
    if status < 300:
        # An interim answer taken for the last (a 103 through http.client),
        # or a 2xx that is not a charge made (202: accepted, still at work):
        # the charge may exist. In doubt, asked again under its key.
        return CallResult(Outcome.AMBIGUOUS, error_code=f"http_{status}", in_doubt=True)
    if status == 402:
        return CallResult(Outcome.DECLINED, error_code=_declined(response))
    if status == 429:
        return CallResult(
            Outcome.RATE_LIMITED,
            error_code="rate_limited",
            retry_after=retry_after(response.headers),
        )
    if status == 409:
        # Our key is being processed by another request (a zombie's call, or
        # one the processor still runs after our timeout): its outcome is
        # unknown to us until we ask again. Not a failure (docs/design.md).
        return CallResult(Outcome.KEY_IN_USE, error_code="idempotency_key_in_use", in_doubt=True)
    if status >= 500:
        # A 5xx may come from behind the charge: treat it as in doubt. One the
        # gateway replays for the key is a stored answer: asking again gets
        # it again, so it is resolved by lookup.
        replayed = response.headers.get("Idempotent-Replayed") == "true"
        return CallResult(
            Outcome.RETRYABLE_ERROR,
            error_code=f"http_{status}",
            in_doubt=True,
            replayed=replayed,
            lookup_first=replayed,
        )
    # Any other 4xx is our bug or a gateway contract change: retry within the
    # budget, then park for a human rather than guess a decline.
    return CallResult(Outcome.RETRYABLE_ERROR, error_code=f"http_{status}")


class CardProcessor:
    """The fake gateway's HTTP API over urllib3: thread-safe, keep-alive.

    urllib3 rather than httpx on this path: measured here, httpx spent
    1.46 ms of CPU per charge and its pool lock was the workers' hottest
    spot; urllib3 spends 0.53 ms.
    """

    name = "fake"

    def __init__(self, base_url: str, *, timeout: float, max_connections: int = 64):
        self._timeout = urllib3.Timeout(connect=min(timeout, 3.0), read=timeout)
        self._call_seconds = timeout
        # Every request has a wall-clock deadline (paycron/deadline.py): the
        # timeout above bounds each socket read only.
        self._pool = pool_manager(
            num_pools=4, maxsize=max_connections, block=False, retries=False, timeout=self._timeout
        )
        self._base_url = base_url.rstrip("/")

    def close(self) -> None:
        self._pool.clear()

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: dict | None = None,
        headers: dict | None = None,
        fields: dict | None = None,
        seconds: float | None = None,
        limit: int = MAX_ANSWER_BYTES,
    ):
        """One request, answered in full within ``seconds`` (the configured
        timeout by default) or :class:`~paycron.deadline.DeadlineExceeded`,
        read to at most ``limit`` bytes (AnswerTooLarge beyond)."""
        seconds = seconds or self._call_seconds
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        with deadline(seconds):
            response = self._pool.request(
                method,
                self._base_url + path,
                body=orjson.dumps(body) if body is not None else None,
                fields=fields,
                headers=all_headers,
                timeout=urllib3.Timeout(connect=min(seconds, 3.0), read=seconds),
                preload_content=False,
            )
            return read_bounded(response, limit)

    def charge(self, request: ChargeRequest, *, timeout: float | None = None) -> CallResult:
        # The whole call (connect, send, every read) ends within the time
        # given, at most the configured timeout: a call never outlives its lease.
        limit = min(timeout, self._call_seconds) if timeout else None
        try:
            response = self._request(
                "POST",
                "/v1/charges",
                body={
                    "amount": request.amount,
                    "currency": request.currency,
                    "reference": request.reference,
                },
                headers={"Idempotency-Key": request.idempotency_key},
                seconds=limit,
            )
        except NOT_SENT as exc:
            return CallResult(Outcome.RETRYABLE_ERROR, error_code=type(exc).__name__)
        except urllib3.exceptions.HTTPError as exc:
            # Sent, then no (whole) answer in time (timeout, the deadline,
            # a dropped connection): it may have charged. Never guess.
            return CallResult(Outcome.AMBIGUOUS, error_code=type(exc).__name__, in_doubt=True)
        except AnswerTooLarge:
            # Sent, then an answer we do not read: the charge may exist.
            return CallResult(Outcome.AMBIGUOUS, error_code="oversized_answer", in_doubt=True)
        return classify(response)

    def _get(
        self,
        path: str,
        *,
        seconds: float | None = None,
        missing: str = "",
        limit: int = MAX_ANSWER_BYTES,
        **params,
    ):
        """A 200's response; a 400/404 is our request refused (``missing``:
        the 404 of one object), anything else the processor unavailable."""
        try:
            response = self._request("GET", path, fields=params, seconds=seconds, limit=limit)
        except urllib3.exceptions.HTTPError as exc:
            raise GatewayError(f"gateway unreachable: {type(exc).__name__}") from exc
        except AnswerTooLarge as exc:
            raise GatewayError(f"absurd answer to GET {path}: {exc}") from exc
        if response.status == 404 and missing:
            raise ProcessorPaymentMissing(f"gateway answered 404 to GET {path}: {missing}")
        if response.status in (400, 404):
            raise GatewayRequestRefused(f"gateway refused GET {path}: {response.status}")
        if response.status != 200:
            raise GatewayError(f"gateway answered {response.status} to GET {path}")
        return response

    def find_charges(self, request: LookupRequest) -> list[Charge]:
        body = _json(self._get("/v1/charges", reference=request.reference))
        try:
            return [_charge(c) for c in body["data"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise GatewayError(f"absurd answer to a lookup: {type(exc).__name__}") from exc

    def retrieve(self, charge_id: str) -> Charge:
        body = _json(self._get(f"/v1/charges/{charge_id}", missing=f"no charge {charge_id}"))
        try:
            return _charge(body)
        except (KeyError, TypeError, ValueError) as exc:
            raise GatewayError(f"absurd answer to a retrieve: {type(exc).__name__}") from exc

    def refund(self, charge: Charge) -> Refund:
        key = f"refund:{charge.reference}"
        try:
            response = self._request(
                "POST", "/v1/refunds", body={"charge": charge.id}, headers={"Idempotency-Key": key}
            )
        except (urllib3.exceptions.HTTPError, AnswerTooLarge) as exc:
            raise GatewayError(f"refund failed: {type(exc).__name__}") from exc
        if response.status in (400, 404):
            # the processor's code only (a short token), never its text
            raise GatewayRequestRefused(f"refund refused: {response.status} {_declined(response)}")
        if response.status not in (200, 201):
            # the processor's code only (a short token), never its text
            raise GatewayError(f"refund refused: {response.status} {_declined(response)}")
        answer = _json(response) or {}
        refund_id = processor_id(answer.get("id")) if isinstance(answer, dict) else None
        if refund_id is None:
            raise GatewayError("refund answered without a refund id")
        return Refund(
            id=refund_id,
            amount=answer.get("amount", charge.amount),
            idempotency_key=key,
        )

    def settlement_report(self, day: date) -> list[Charge]:
        text = self._get(
            "/v1/settlement-report",
            seconds=REPORT_DEADLINE_SECONDS,
            limit=MAX_REPORT_BYTES,
            date=day.isoformat(),
        ).data.decode()
        return parse_report(text, source=f"settlement report {day}")


def _charge(c: dict) -> Charge:
    """A charge of the fake's JSON (its statuses are ours: succeeded, refunded)."""
    if not isinstance(c["amount"], int) or not isinstance(c["currency"], str):
        raise ValueError("amount or currency of the wrong type")
    created = c.get("created_at")
    charge_id, reference = processor_id(c["id"]), c["reference"]
    if charge_id is None or not isinstance(reference, str) or len(reference) > 64:
        raise ValueError("a charge id or reference that is none")
    return Charge(
        id=charge_id,
        reference=reference,
        amount=c["amount"],
        currency=c["currency"],
        status=str(c["status"]),
        idempotency_key=c.get("idempotency_key"),
        created_at=datetime.fromisoformat(created).astimezone(UTC) if created else None,
    )
