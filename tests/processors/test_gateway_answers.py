"""A bad answer never hurts its neighbours (docs/design.md): the gateway client
and the executor against a gateway that answers absurdly, over real HTTP."""

from __future__ import annotations

import json

import pytest
import redis

from paycron.domain.enums import Outcome
from paycron.domain.processing import ChargeRequest
from paycron.engine.execution import Executor
from paycron.errors import ProcessorPaymentMissing
from paycron.limits.breaker import CircuitBreaker
from paycron.processors.card.client import CardProcessor
from paycron.store.db import make_pool
from paycron.store.transitions import UNWRITABLE, claim_due
from tests.factories import insert_payment


def charge(charge_at, scripted, status, body=b"{}", headers=None):
    scripted.answers[100] = (status, headers or {}, body)
    return charge_at(
        scripted.url, ChargeRequest(reference="r", idempotency_key="k", amount=100, currency="USD")
    )


@pytest.mark.parametrize(
    "header, expected",
    [
        ("2.5", 2.5),
        ("0", 1.0),
        ("0.01", 1.0),
        ("86400000", 3600.0),
        ("3600", 3600.0),
        ("-5", None),
        ("inf", None),
        ("-inf", None),
        ("nan", None),
        ("soon", None),
        (None, None),
    ],
)
def test_retry_after_is_clamped_and_absurd_values_ignored(scripted, charge_at, header, expected):
    headers = {} if header is None else {"Retry-After": header}
    result = charge(charge_at, scripted, 429, headers=headers)
    assert result.outcome is Outcome.RATE_LIMITED
    assert result.retry_after == expected


@pytest.mark.parametrize(
    "body", [b"not json", b"{}", b'{"id": 5}', b'{"id": ""}', b"[]", b"null", b'"ch_1"']
)
def test_a_malformed_2xx_is_ambiguous_for_that_payment(scripted, charge_at, body):
    result = charge(charge_at, scripted, 200, body=body)
    assert (result.outcome, result.in_doubt) == (Outcome.AMBIGUOUS, True)


def test_one_bad_answer_does_not_lose_its_groups_outcomes(config, conn, scripted):
    """Three payments in one message: a good answer, a malformed one, and one
    whose charge id Postgres cannot store (a NUL byte). Each is recorded on
    its own row; the good one completes whatever its neighbours said."""
    good, malformed, unwritable = (insert_payment(conn, amount_minor=a) for a in (111, 222, 333))
    scripted.answers = {
        111: (200, {}, b'{"id": "ch_good"}'),
        222: (200, {}, b"<html>oops</html>"),
        333: (200, {}, json.dumps({"id": "ch_\u0000bad"}).encode()),
    }
    pool = make_pool(config, max_size=2, name="test-answers")
    gateway = CardProcessor(scripted.url, timeout=2)
    try:
        executor = Executor(
            config=config,
            pool=pool,
            gateway=gateway,
            call_limiter=None,
            breaker=CircuitBreaker(redis.Redis.from_url(config.redis_url), config),
        )
        claims = claim_due(conn, limit=10, lease_seconds=30)
        assert len(claims) == 3
        counts = executor.execute(claims)
    finally:
        gateway.close()
        pool.close()
    assert counts.calls == 3
    rows = {
        r["id"]: r
        for r in conn.execute(
            "SELECT p.id, p.status, p.in_doubt, a.outcome, a.gateway_ref, a.error_code"
            " FROM payments p JOIN attempts a ON a.payment_id = p.id"
        ).fetchall()
    }
    assert (rows[good["id"]]["status"], rows[good["id"]]["gateway_ref"]) == ("COMPLETED", "ch_good")
    assert (
        rows[malformed["id"]]["status"],
        rows[malformed["id"]]["in_doubt"],
        rows[malformed["id"]]["outcome"],
    ) == ("PENDING", True, "AMBIGUOUS")
    assert (
        rows[unwritable["id"]]["status"],
        rows[unwritable["id"]]["outcome"],
        rows[unwritable["id"]]["gateway_ref"],
    ) == ("COMPLETED", "SUCCEEDED", UNWRITABLE)


def test_a_charge_the_card_processor_does_not_hold_is_missing_not_unavailable(gateway):
    """A retrieve answered 404 is a missing processor payment (paged by the
    poller), not GATEWAY_UNAVAILABLE, which tells an operator to wait."""
    adapter = CardProcessor(gateway.url, timeout=2)
    try:
        with pytest.raises(ProcessorPaymentMissing):
            adapter.retrieve("ch_not_held_here")
    finally:
        adapter.close()
