"""The Stripe answer table (docs/design.md), one row per test, through the official SDK.

paycron.processors.stripe.client.StripeProcessor (the real ``stripe`` SDK over our
urllib3 transport) against a loopback server that answers each request as
the test scripts it, in Stripe's wire format: so every row — also those the
Stripe-shaped stub never gives (403, an unknown 409, a 200 in an unexpected
status) — is checked through what the SDK really parses, and each request
is checked as the SDK really sends it.
"""

from __future__ import annotations

import json
import threading
import time
from urllib.parse import parse_qs, urlsplit

import pytest

from paycron.config import STRIPE_API_VERSION
from paycron.domain.enums import FailureReason, Outcome
from paycron.domain.processing import ChargeRequest, LookupRequest
from paycron.errors import GatewayError, GatewayRequestRefused, ProcessorPaymentMissing
from paycron.processors.stripe.client import StripeProcessor
from tests.support import QuietHandler, serve_on_loopback
from web.problems import status_for

KEY = "sk_test_scripted_0123456789"
JSON = {"Content-Type": "application/json"}


def intent(status="succeeded", id="pi_1", **extra):
    return {
        "id": id,
        "object": "payment_intent",
        "status": status,
        "amount": 2500,
        "currency": "usd",
        "customer": "cus_1",
        "metadata": {},
        **extra,
    }


def error(status, *, headers=None, **fields):
    return status, {**JSON, **(headers or {})}, json.dumps({"error": fields}).encode()


def ok(body):
    return 200, JSON, json.dumps(body).encode()


class ScriptedStripe:
    """Answers ``POST`` by ``answers[path]`` (a list, one per request, the last
    repeated) and ``GET /v1/payment_intents`` by ``pages``; records requests."""

    def __init__(self):
        self.answers: dict[str, list] = {}
        self.pages: list[dict] = []
        self.gets: dict[str, tuple] = {}  # an answer by path, instead of a page
        self.requests: list[dict] = []
        stub = self

        class Handler(QuietHandler):
            def _record(self, body: bytes):
                url = urlsplit(self.path)
                stub.requests.append(
                    {
                        "method": self.command,
                        "path": url.path,
                        "query": parse_qs(url.query),
                        "form": parse_qs(body.decode()),
                        "headers": dict(self.headers),
                    }
                )
                return url.path

            def do_POST(self):
                path = self._record(self.rfile.read(int(self.headers["Content-Length"] or 0)))
                queue = stub.answers[path]
                answer = queue.pop(0) if len(queue) > 1 else queue[0]
                status, headers, body = answer() if callable(answer) else answer
                self.answer(status, body, headers)

            def do_GET(self):
                path = self._record(b"")
                if path in stub.gets:
                    status, headers, body = stub.gets[path]
                    self.answer(status, body, headers)
                    return
                after = parse_qs(urlsplit(self.path).query).get("starting_after", [None])[0]
                index = (
                    0
                    if after is None
                    else 1
                    + next(i for i, p in enumerate(stub.pages) if p["data"][-1]["id"] == after)
                )
                status, headers, body = ok(
                    {"object": "list", "url": "/v1/payment_intents", **stub.pages[index]}
                )
                self.answer(status, body, headers)

        self.server = serve_on_loopback(Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def posts(self, path):
        return [r for r in self.requests if r["method"] == "POST" and r["path"] == path]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stripe_stub():
    stub = ScriptedStripe()
    yield stub
    stub.close()


@pytest.fixture
def adapter(stripe_stub):
    gateway = StripeProcessor(
        api_key=KEY, api_base=stripe_stub.url, api_version=STRIPE_API_VERSION, timeout=1.0
    )
    yield gateway
    gateway.close()


REQUEST = ChargeRequest(
    reference="019b0000-0000-7000-8000-000000000001",
    idempotency_key="019b0000-0000-7000-8000-000000000001:2",
    amount=2500,
    currency="USD",
    customer="cus_1",
    payment_method="pm_card_visa",
)
CREATE = "/v1/payment_intents"


def test_the_charge_is_sent_exactly_as_spec_12_gives_it(stripe_stub, adapter):
    stripe_stub.answers[CREATE] = [ok(intent())]
    adapter.charge(REQUEST)
    [sent] = stripe_stub.posts(CREATE)
    assert sent["form"] == {
        "amount": ["2500"],
        "currency": ["usd"],
        "customer": ["cus_1"],
        "payment_method": ["pm_card_visa"],
        "confirm": ["true"],
        "off_session": ["true"],
        "metadata[paycron_payment_id]": [REQUEST.reference],
    }
    headers = {k.lower(): v for k, v in sent["headers"].items()}
    assert headers["idempotency-key"] == REQUEST.idempotency_key
    assert headers["stripe-version"] == STRIPE_API_VERSION
    assert headers["authorization"] == f"Bearer {KEY}"


def test_the_key_is_not_in_the_adapters_repr(adapter):
    assert KEY not in repr(adapter) and KEY not in str(vars(adapter))


#: Stripe answer -> (outcome, in doubt, failure reason, retry the decline, stored code)
ROWS = {
    "succeeded": (ok(intent()), Outcome.SUCCEEDED, False, None, False, None),
    "processing": (ok(intent("processing")), Outcome.SUBMITTED, False, None, False, None),
    "200-requires_action": (
        ok(intent("requires_action")),
        Outcome.DECLINED,
        False,
        FailureReason.CUSTOMER_ACTION_REQUIRED,
        False,
        "authentication_required",
    ),
    "200-unexpected-status": (
        ok(intent("requires_payment_method")),
        Outcome.AMBIGUOUS,
        True,
        None,
        False,
        "requires_payment_method",
    ),
    "200-malformed": (
        (200, JSON, b'{"object": "payment_intent"}'),
        Outcome.AMBIGUOUS,
        True,
        None,
        False,
        "malformed_answer",
    ),
    "402-authentication_required": (
        error(
            402,
            type="card_error",
            code="authentication_required",
            payment_intent=intent("requires_payment_method"),
        ),
        Outcome.DECLINED,
        False,
        FailureReason.CUSTOMER_ACTION_REQUIRED,
        False,
        "authentication_required",
    ),
    "402-generic_decline": (
        error(
            402,
            type="card_error",
            code="card_declined",
            decline_code="generic_decline",
            payment_intent=intent("requires_payment_method"),
        ),
        Outcome.DECLINED,
        False,
        None,
        False,
        "generic_decline",
    ),
    "402-processing_error": (
        error(
            402,
            type="card_error",
            code="processing_error",
            payment_intent=intent("requires_payment_method"),
        ),
        Outcome.DECLINED,
        False,
        None,
        True,
        "processing_error",
    ),
    "402-advice-try_again_later": (
        error(
            402,
            type="card_error",
            code="card_declined",
            decline_code="do_not_honor",
            advice_code="try_again_later",
            payment_intent=intent("requires_payment_method"),
        ),
        Outcome.DECLINED,
        False,
        None,
        True,
        "do_not_honor",
    ),
    "402-advice-do_not_try_again": (
        error(
            402,
            type="card_error",
            code="processing_error",
            advice_code="do_not_try_again",
            payment_intent=intent("requires_payment_method"),
        ),
        Outcome.DECLINED,
        False,
        None,
        False,
        "processing_error",
    ),
    "429": (
        error(429, headers={"Retry-After": "7"}, type="invalid_request_error", code="rate_limit"),
        Outcome.RATE_LIMITED,
        False,
        None,
        False,
        "rate_limited",
    ),
    "409-key-in-use": (
        error(409, type="idempotency_error", code="idempotency_key_in_use"),
        Outcome.KEY_IN_USE,
        True,
        None,
        False,
        "idempotency_key_in_use",
    ),
    "409-other": (
        error(409, type="invalid_request_error", code="lock_timeout"),
        Outcome.RETRYABLE_ERROR,
        True,
        None,
        False,
        "http_409",
    ),
    "400-idempotency_error": (
        error(400, type="idempotency_error"),
        Outcome.REJECTED,
        False,
        FailureReason.GATEWAY_REJECTED,
        False,
        "idempotency_error",
    ),
    "400-resource_missing": (
        error(400, type="invalid_request_error", code="resource_missing", param="payment_method"),
        Outcome.REJECTED,
        False,
        FailureReason.INVALID_REQUEST,
        False,
        "resource_missing",
    ),
    "404": (
        error(404, type="invalid_request_error", code="resource_missing"),
        Outcome.REJECTED,
        False,
        FailureReason.INVALID_REQUEST,
        False,
        "resource_missing",
    ),
    # Stripe sends ``code`` "for some errors" only: none is no decline.
    "400-no-code": (
        error(400, type="invalid_request_error", message="Invalid request"),
        Outcome.REJECTED,
        False,
        FailureReason.INVALID_REQUEST,
        False,
        "http_400",
    ),
    "404-no-code": (
        error(404, type="invalid_request_error", message="Unrecognized request URL"),
        Outcome.REJECTED,
        False,
        FailureReason.INVALID_REQUEST,
        False,
        "http_404",
    ),
    "401": (
        error(401, type="invalid_request_error", message="Invalid API Key provided"),
        Outcome.AUTH_FAILED,
        False,
        None,
        False,
        "http_401",
    ),
    "403": (
        error(403, type="invalid_request_error"),
        Outcome.AUTH_FAILED,
        False,
        None,
        False,
        "http_403",
    ),
    "500": (error(500, type="api_error"), Outcome.RETRYABLE_ERROR, True, None, False, "http_500"),
    "503": (error(503, type="api_error"), Outcome.RETRYABLE_ERROR, True, None, False, "http_503"),
}


@pytest.mark.parametrize("row", ROWS)
def test_answer_table(stripe_stub, adapter, row):
    answer, outcome, in_doubt, reason, retry, code = ROWS[row]
    stripe_stub.answers[CREATE] = [answer]
    stripe_stub.answers["/v1/payment_intents/pi_1/cancel"] = [ok(intent("canceled"))]
    result = adapter.charge(REQUEST)
    assert (
        result.outcome,
        result.in_doubt,
        result.failure_reason,
        result.retry_decline,
        result.error_code,
    ) == (outcome, in_doubt, reason, retry, code)
    # one request each: the SDK never retries (Postgres is the only retry layer)
    assert len(stripe_stub.posts(CREATE)) == 1


def test_a_decline_needing_the_customer_cancels_its_intent(stripe_stub, adapter):
    stripe_stub.answers[CREATE] = [ROWS["402-authentication_required"][0]]
    stripe_stub.answers["/v1/payment_intents/pi_1/cancel"] = [ok(intent("canceled"))]
    result = adapter.charge(REQUEST)
    assert result.gateway_ref == "pi_1"
    [cancel] = stripe_stub.posts("/v1/payment_intents/pi_1/cancel")
    assert {k.lower(): v for k, v in cancel["headers"].items()}["idempotency-key"] == (
        "cancel:pi_1"
    )


def test_a_retried_decline_confirms_the_same_intent_under_the_new_key(stripe_stub, adapter):
    stripe_stub.answers["/v1/payment_intents/pi_1/confirm"] = [ok(intent())]
    again = ChargeRequest(**{**REQUEST.__dict__, "confirm": "pi_1"})
    assert adapter.charge(again).outcome is Outcome.SUCCEEDED
    [sent] = stripe_stub.posts("/v1/payment_intents/pi_1/confirm")
    assert sent["form"] == {"payment_method": ["pm_card_visa"], "off_session": ["true"]}
    assert stripe_stub.posts(CREATE) == []


def test_a_replayed_500_is_resolved_by_lookup(stripe_stub, adapter):
    stripe_stub.answers[CREATE] = [
        error(500, headers={"Idempotent-Replayed": "true"}, type="api_error")
    ]
    result = adapter.charge(REQUEST)
    assert (result.outcome, result.in_doubt, result.replayed, result.lookup_first) == (
        Outcome.RETRYABLE_ERROR,
        True,
        True,
        True,
    )
    assert not result.may_land


def test_a_call_that_outlives_its_timeout_is_ambiguous(stripe_stub, adapter):
    def slow():
        time.sleep(1.0)
        return ok(intent())

    stripe_stub.answers[CREATE] = [slow]
    started = time.monotonic()
    result = adapter.charge(REQUEST, timeout=0.3)  # the lease left cuts the call
    assert time.monotonic() - started < 0.9
    assert (result.outcome, result.in_doubt) == (Outcome.AMBIGUOUS, True)


def test_a_refused_connection_never_reached_stripe():
    gateway = StripeProcessor(
        api_key=KEY, api_base="http://127.0.0.1:9", api_version=STRIPE_API_VERSION, timeout=1.0
    )
    try:
        result = gateway.charge(REQUEST)
    finally:
        gateway.close()
    assert (result.outcome, result.in_doubt) == (Outcome.RETRYABLE_ERROR, False)


def listed(n, *, reference=None, id_prefix="pi_"):
    return {
        "id": f"{id_prefix}{n}",
        **{k: v for k, v in intent().items() if k != "id"},
        "metadata": {"paycron_payment_id": reference or f"other-{n}"},
    }


def test_a_lookup_follows_every_page_and_matches_by_metadata(stripe_stub, adapter):
    stripe_stub.pages = [
        {"data": [listed(n) for n in range(0, 100)], "has_more": True},
        {"data": [listed(n) for n in range(100, 200)], "has_more": True},
        {"data": [listed(200), listed(201, reference=REQUEST.reference)], "has_more": False},
    ]
    tokens = []
    adapter._take_token = lambda: tokens.append(1)
    [found] = adapter.find_charges(LookupRequest(reference=REQUEST.reference, customer="cus_1"))
    assert (found.id, found.amount, found.currency, found.status) == (
        "pi_201",
        2500,
        "USD",
        "succeeded",
    )
    gets = [r for r in stripe_stub.requests if r["method"] == "GET"]
    assert [g["query"].get("starting_after") for g in gets] == [None, ["pi_99"], ["pi_199"]]
    assert all(g["query"]["customer"] == ["cus_1"] and g["query"]["limit"] == ["100"] for g in gets)
    assert len(tokens) == 3  # every page takes a token from the shared window


def test_a_lookup_that_cannot_list_raises(stripe_stub, adapter):
    adapter.close()
    gateway = StripeProcessor(
        api_key=KEY, api_base="http://127.0.0.1:9", api_version=STRIPE_API_VERSION, timeout=1.0
    )
    try:
        with pytest.raises(GatewayError):
            gateway.find_charges(LookupRequest(reference="x", customer="cus_1"))
    finally:
        gateway.close()


def test_a_list_stripe_refuses_is_our_request_refused_not_an_outage(stripe_stub, adapter):
    """A 400 to a list is a bug or an API change: a distinct error (500
    PROCESSOR_REFUSED_REQUEST), not GATEWAY_UNAVAILABLE/502, which tells an
    operator to wait out something waiting will not fix."""
    stripe_stub.gets["/v1/payment_intents"] = error(
        400, type="invalid_request_error", code="parameter_unknown", param="created[gte]"
    )
    with pytest.raises(GatewayRequestRefused) as refused:
        adapter.find_charges(LookupRequest(reference="x", customer="cus_1"))
    assert refused.value.code == "PROCESSOR_REFUSED_REQUEST"
    assert "parameter_unknown" in str(refused.value)
    assert status_for(refused.value) == 500


def test_a_list_stripe_rate_limits_is_still_unavailability(stripe_stub, adapter):
    stripe_stub.gets["/v1/payment_intents"] = error(
        400, type="invalid_request_error", code="rate_limit"
    )
    with pytest.raises(GatewayError) as failed:
        adapter.find_charges(LookupRequest(reference="x", customer="cus_1"))
    assert not isinstance(failed.value, GatewayRequestRefused)
    assert status_for(failed.value) == 502


def test_an_intent_stripe_does_not_hold_is_missing(stripe_stub, adapter):
    stripe_stub.gets["/v1/payment_intents/pi_elsewhere"] = error(
        404, type="invalid_request_error", code="resource_missing", param="intent"
    )
    with pytest.raises(ProcessorPaymentMissing):
        adapter.retrieve("pi_elsewhere")


def test_calls_from_many_threads_share_one_pool(stripe_stub, adapter):
    stripe_stub.answers[CREATE] = [ok(intent())]
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(adapter.charge(REQUEST))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.outcome for r in results] == [Outcome.SUCCEEDED] * 8
