"""The processor's answers are bounded before we keep or show them: ids of a
sane length and alphabet, bodies read to a limit, a refused refund's text
never shown (over real HTTP, from a server on loopback)."""

from __future__ import annotations

import json

import pytest
import stripe

from paycron.domain.enums import Outcome
from paycron.domain.processing import Charge, ChargeRequest
from paycron.errors import GatewayError
from paycron.processors.card.client import CardProcessor
from paycron.processors.stripe.client import classify_intent
from paycron.processors.stripe.transport import PooledHttpClient
from paycron.processors.wire import MAX_ANSWER_BYTES, UNUSABLE_ID, processor_id
from tests.support import QuietHandler, serve_on_loopback


@pytest.fixture
def answering():
    """A server answering every request with ``answer[0]`` (status, body)."""
    answer: list[tuple[int, bytes]] = [(200, b"{}")]

    class Handler(QuietHandler):
        def _any(self):
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            status, body = answer[0]
            self.answer(status, body, {"Content-Type": "application/json"})

        do_GET = do_POST = _any

    server = serve_on_loopback(Handler)
    yield answer, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def _charge(charge_at, url: str):
    return charge_at(
        url, ChargeRequest(reference="r", idempotency_key="k", amount=100, currency="USD")
    )


@pytest.mark.parametrize(
    "charge_id", ["ch_" + "x" * 300, "ch_1\n2026-01-01 INFO forged", "ch_<script>", "ch_é"]
)
def test_an_absurd_charge_id_is_not_kept_the_outcome_is(answering, charge_at, charge_id):
    answer, url = answering
    answer[0] = (200, json.dumps({"id": charge_id}).encode())
    result = _charge(charge_at, url)
    assert (result.outcome, result.gateway_ref) == (Outcome.SUCCEEDED, UNUSABLE_ID)


def test_a_sane_charge_id_is_kept(answering, charge_at):
    answer, url = answering
    answer[0] = (200, b'{"id": "ch_3Pq-x.y:z_1"}')
    assert _charge(charge_at, url).gateway_ref == "ch_3Pq-x.y:z_1"


def test_an_oversized_answer_is_not_read_whole(answering, charge_at):
    answer, url = answering
    answer[0] = (200, b'{"id": "ch_1", "pad": "' + b"x" * (MAX_ANSWER_BYTES + 10) + b'"}')
    result = _charge(charge_at, url)
    assert (result.outcome, result.error_code, result.in_doubt) == (
        Outcome.AMBIGUOUS,
        "oversized_answer",
        True,
    )


def test_a_refused_refund_shows_the_code_never_the_text(answering):
    answer, url = answering
    answer[0] = (
        500,
        json.dumps(
            {"error": {"code": "processing_error", "message": "\x1b[2J fake operator prompt " * 20}}
        ).encode(),
    )
    client = CardProcessor(url, timeout=2)
    try:
        with pytest.raises(GatewayError) as refused:
            client.refund(Charge(id="ch_1", reference="r", amount=100, currency="USD", status="x"))
    finally:
        client.close()
    assert str(refused.value) == "refund refused: 500 processing_error"


def test_stripe_answers_are_bounded_and_their_ids_checked(answering):
    answer, url = answering
    answer[0] = (200, b'{"id": "pi_1", "pad": "' + b"x" * (MAX_ANSWER_BYTES + 10) + b'"}')
    http = PooledHttpClient(timeout=2)
    try:
        with pytest.raises(stripe.APIConnectionError):
            http.request("post", f"{url}/v1/payment_intents", {}, b"a=1")
        answer[0] = (200, b'{"id": "pi_ok"}')
        body, status, _ = http.request("post", f"{url}/v1/payment_intents", {}, b"a=1")
        assert (status, json.loads(body)["id"]) == (200, "pi_ok")
    finally:
        http.close()
    assert classify_intent({"id": "pi_" + "9" * 300, "status": "succeeded"}).gateway_ref == (
        UNUSABLE_ID
    )
    assert processor_id("pi_1") == "pi_1" and processor_id("") is None and processor_id(7) is None
