"""A processor call ends by its deadline, whatever the processor does: a
real local server that trickles its answer (a byte every quarter second,
status line included) never trips a socket read timeout, so only a
wall-clock deadline stops the call. A charge cut by it is in doubt (it may
have landed); a lookup cut by it is an error, never an answer."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from paycron.config import STRIPE_API_VERSION
from paycron.domain.enums import Outcome
from paycron.domain.processing import ChargeRequest
from paycron.errors import GatewayError
from paycron.processors.card.aio import AsyncCardProcessor
from paycron.processors.card.client import CardProcessor
from paycron.processors.stripe.client import StripeProcessor
from tests.support import TricklingServer

#: The whole trickled answer takes over 40 s (over 160 bytes at 0.25 s each);
#: every call here is given 1 s and must be over long before the answer.
CALL_SECONDS = 1.0
#: Far above the deadline plus any scheduling delay on a loaded machine, far
#: below the trickle: a call still reading the trickle cannot end by then.
WELL_BEFORE_THE_ANSWER = 8.0

CHARGE = {"id": "ch_trickled", "status": "succeeded", "amount": 2500, "currency": "USD"}
INTENT = {
    "id": "pi_trickled",
    "object": "payment_intent",
    "status": "succeeded",
    "amount": 2500,
    "currency": "usd",
    "metadata": {"paycron_payment_id": "p1"},
}


@pytest.fixture
def trickler():
    made = []

    def make(payload: dict) -> TricklingServer:
        made.append(TricklingServer(json.dumps(payload).encode() + b" " * 64))
        return made[-1]

    yield make
    for server in made:
        server.close()


def _request() -> ChargeRequest:
    return ChargeRequest(
        reference="p1",
        idempotency_key="p1",
        amount=2500,
        currency="USD",
        customer="cus_1",
        payment_method="pm_card_visa",
    )


def _timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def _hung_up(server: TricklingServer) -> bool:
    """The server saw the client leave before its last byte (it notices at
    its next write)."""
    until = time.monotonic() + 3.0
    while not server.hung_up and time.monotonic() < until:
        time.sleep(0.05)
    return server.hung_up > 0


def test_a_trickled_charge_at_the_card_processor_ends_by_its_deadline_in_doubt(trickler):
    server = trickler(CHARGE)
    gateway = CardProcessor(server.url, timeout=5.0)
    try:
        result, seconds = _timed(lambda: gateway.charge(_request(), timeout=CALL_SECONDS))
    finally:
        gateway.close()
    assert seconds < WELL_BEFORE_THE_ANSWER
    assert (result.outcome, result.in_doubt) == (Outcome.AMBIGUOUS, True)
    assert result.error_code == "DeadlineExceeded"
    assert server.requests == 1 and _hung_up(server)


def test_a_trickled_lookup_at_the_card_processor_is_an_error_by_its_deadline(trickler):
    server = trickler({"data": [CHARGE]})
    gateway = CardProcessor(server.url, timeout=CALL_SECONDS)
    try:
        started = time.monotonic()
        with pytest.raises(GatewayError, match="DeadlineExceeded"):
            gateway.retrieve("ch_trickled")
        assert time.monotonic() - started < WELL_BEFORE_THE_ANSWER
    finally:
        gateway.close()


def test_a_trickled_charge_at_stripe_ends_by_its_deadline_in_doubt(trickler):
    server = trickler(INTENT)
    gateway = StripeProcessor(
        api_key="sk_test_trickle_0123456789",
        api_base=server.url,
        api_version=STRIPE_API_VERSION,
        timeout=5.0,
    )
    try:
        result, seconds = _timed(lambda: gateway.charge(_request(), timeout=CALL_SECONDS))
    finally:
        gateway.close()
    assert seconds < WELL_BEFORE_THE_ANSWER
    assert (result.outcome, result.in_doubt) == (Outcome.AMBIGUOUS, True)
    assert result.error_code == "DeadlineExceeded"
    assert server.requests == 1 and _hung_up(server)


def test_a_trickled_retrieve_at_stripe_is_an_error_by_the_configured_timeout(trickler):
    server = trickler(INTENT)
    gateway = StripeProcessor(
        api_key="sk_test_trickle_0123456789",
        api_base=server.url,
        api_version=STRIPE_API_VERSION,
        timeout=CALL_SECONDS,
    )
    try:
        started = time.monotonic()
        with pytest.raises(GatewayError):
            gateway.retrieve("pi_trickled")
        assert time.monotonic() - started < WELL_BEFORE_THE_ANSWER
    finally:
        gateway.close()


def test_a_trickled_charge_at_the_async_card_processor_ends_by_its_deadline_in_doubt(trickler):
    """The async executor's client: one deadline around the whole call."""
    server = trickler(CHARGE)

    async def charge():
        gateway = AsyncCardProcessor(server.url, timeout=5.0)
        try:
            return await gateway.charge(_request(), timeout=CALL_SECONDS)
        finally:
            await gateway.close()

    result, seconds = _timed(lambda: asyncio.run(charge()))
    assert seconds < WELL_BEFORE_THE_ANSWER
    assert (result.outcome, result.in_doubt) == (Outcome.AMBIGUOUS, True)
    assert result.error_code == "DeadlineExceeded"
    assert server.requests == 1 and _hung_up(server)
