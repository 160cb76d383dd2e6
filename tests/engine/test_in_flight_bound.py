"""SPEC §3 as amended: when a call can still land (the in-flight bound), the
key retention rule, and one processor per payment. Against a scripted
gateway over real HTTP and the real Postgres."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis

from paycron.engine import dead_letters
from paycron.engine.execution import Executor
from paycron.errors import DeadLetterActionRefused, GatewayError
from paycron.limits.breaker import CircuitBreaker
from paycron.processors.card.client import HttpGateway
from paycron.store.db import make_pool
from paycron.store.transitions import Claim, claim_due, reap_expired, start
from tests.factories import insert_payment
from tests.rows import attempts_of, payment

OK = (200, {}, b'{"id": "ch_1"}')
REPLAYED_500 = (500, {"Idempotent-Replayed": "true"}, b'{"error": {"type": "api_error"}}')


@pytest.fixture
def executor(config, scripted):
    pool = make_pool(config, max_size=2, name="test-bound")
    gateway = HttpGateway(scripted.url, timeout=config.gateway_timeout_seconds)
    made = Executor(
        config=config,
        pool=pool,
        gateway=gateway,
        call_limiter=None,
        breaker=CircuitBreaker(redis.Redis.from_url(config.redis_url), config),
    )
    yield made
    gateway.close()
    pool.close()


def bound_after(conn, row_id):
    started = attempts_of(conn, row_id)[-1]["started_at"]
    return payment(conn, row_id)["calls_land_by"] - started


@pytest.mark.parametrize(
    "answer",
    [
        (503, {}, b"{}"),  # may have executed
        (409, {}, b"{}"),  # a call under the key runs right now: it lands within the same bound
    ],
    ids=["503", "409"],
)
def test_a_call_that_may_land_moves_the_bound_past_its_lease_timeout_and_margin(
    conn, config, scripted, executor, answer
):
    scripted.answers[2500] = answer
    row = insert_payment(conn)
    executor.execute(claim_due(conn, limit=1, lease_seconds=config.lease_seconds))
    assert bound_after(conn, row["id"]) == timedelta(seconds=config.in_flight_bound_seconds)
    assert config.in_flight_bound_seconds == 30 + 2 + 600


@pytest.mark.parametrize(
    "answer",
    [
        OK,  # definitive
        (402, {}, b'{"error": {"code": "card_declined"}}'),  # definitive
        (429, {}, b"{}"),  # never executed
        REPLAYED_500,  # the stored answer of an earlier call
    ],
    ids=["success", "decline", "429", "replayed-500"],
)
def test_an_answer_that_cannot_land_later_leaves_the_bound(
    conn, config, scripted, executor, answer
):
    scripted.answers[2500] = answer
    row = insert_payment(conn)
    executor.execute(claim_due(conn, limit=1, lease_seconds=config.lease_seconds))
    assert payment(conn, row["id"])["calls_land_by"] is None


def test_a_replayed_500_is_resolved_by_lookup_not_by_resending(conn, config, scripted, executor):
    scripted.answers[2500] = REPLAYED_500
    row = insert_payment(conn, in_doubt=True)
    scripted.charges[str(row["id"])] = [
        {
            "id": "ch_9",
            "reference": str(row["id"]),
            "amount": 2500,
            "currency": "USD",
            "status": "succeeded",
        }
    ]
    executor.execute(claim_due(conn, limit=1, lease_seconds=config.lease_seconds))
    after = payment(conn, row["id"])
    assert (after["status"], after["in_doubt"]) == ("COMPLETED", False)
    assert [a["outcome"] for a in attempts_of(conn, row["id"])] == ["FOUND_BY_LOOKUP"]


def test_a_reaped_call_in_flight_moves_the_bound(conn, config, executor):
    row = insert_payment(conn)
    [claim] = claim_due(conn, limit=1, lease_seconds=config.lease_seconds)
    start(executor.pool, [claim], lease_seconds=config.lease_seconds)
    conn.execute(
        "UPDATE payments SET lease_until = now() - interval '1 second' WHERE id = %s", (row["id"],)
    )
    reap_expired(conn, limit=10, config=config)
    after = payment(conn, row["id"])
    assert after["in_doubt"] and after["in_doubt_since"] is not None
    assert bound_after(conn, row["id"]) == timedelta(seconds=config.in_flight_bound_seconds)


def old_doubt(conn, config, *, bound_passed: bool):
    """In doubt since longer than the processor keeps a key (less the bound)."""
    since = datetime.now(UTC) - timedelta(seconds=config.gateway_key_retention_seconds)
    bound = datetime.now(UTC) + timedelta(seconds=-1 if bound_passed else 300)
    return insert_payment(
        conn, in_doubt=True, in_doubt_since=since, calls_land_by=bound, failures=2
    )


def test_an_old_doubt_is_looked_up_before_it_is_called(conn, config, scripted, executor):
    scripted.answers[2500] = OK
    row = old_doubt(conn, config, bound_passed=True)
    scripted.charges[str(row["id"])] = [
        {
            "id": "ch_7",
            "reference": str(row["id"]),
            "amount": 2500,
            "currency": "USD",
            "status": "succeeded",
        }
    ]
    executor.execute(claim_due(conn, limit=1, lease_seconds=config.lease_seconds))
    assert scripted.charge_requests() == 0
    assert payment(conn, row["id"])["status"] == "COMPLETED"
    assert [(a["outcome"], a["gateway_ref"]) for a in attempts_of(conn, row["id"])] == [
        ("FOUND_BY_LOOKUP", "ch_7")
    ]


def test_an_old_doubt_found_nothing_conclusively_is_called_under_the_next_key(
    conn, config, scripted, executor
):
    scripted.answers[2500] = OK
    row = old_doubt(conn, config, bound_passed=True)
    executor.execute(claim_due(conn, limit=1, lease_seconds=config.lease_seconds))
    assert scripted.charge_requests() == 0  # looked up, not called
    after = payment(conn, row["id"])
    assert (after["status"], after["in_doubt"], after["key_generation"], after["failures"]) == (
        "PENDING",
        False,
        2,
        2,
    )
    executor.execute(claim_due(conn, limit=1, lease_seconds=config.lease_seconds))
    assert payment(conn, row["id"])["status"] == "COMPLETED"
    assert [a["gateway_key"] for a in attempts_of(conn, row["id"])] == [
        str(row["id"]),
        f"{row['id']}:2",
    ]


def test_an_old_doubt_not_yet_conclusive_waits_for_the_bound(conn, config, scripted, executor):
    scripted.answers[2500] = OK
    row = old_doubt(conn, config, bound_passed=False)
    executor.execute(claim_due(conn, limit=1, lease_seconds=config.lease_seconds))
    assert scripted.charge_requests() == 0
    after = payment(conn, row["id"])
    assert (after["status"], after["in_doubt"], after["key_generation"]) == ("PENDING", True, 1)
    assert after["run_at"] >= after["calls_land_by"]


def test_a_payment_of_another_processor_is_neither_claimed_nor_called(
    conn, config, scripted, executor
):
    scripted.answers[2500] = OK
    row = insert_payment(conn, processor="stripe", in_doubt=True)
    assert claim_due(conn, limit=10, lease_seconds=30, processor="fake") == []
    [claim] = claim_due(conn, limit=10, lease_seconds=30, processor="stripe")
    # a worker configured for another processor than the one that saw the
    # payment's first call drops the claim without a call
    counts = executor.execute([Claim(claim.payment_id, claim.due_at, claim.attempt)])
    assert (counts.stale, counts.calls, scripted.charge_requests()) == (1, 0, 0)
    assert attempts_of(conn, row["id"]) == []


@pytest.mark.parametrize("earlier", ["never in doubt", "in doubt, bound passed"])
def test_the_call_that_exhausts_the_budget_keeps_its_lookup_inconclusive(
    conn, config, scripted, executor, earlier
):
    # The last call of the budget gets a 503 (it may have charged) and the
    # lookup before parking finds nothing. That call's own bound is ahead:
    # the none is not conclusive, so the payment parks in doubt (a re-drive
    # under the next key, or a cancel, would let that call charge too).
    scripted.answers[2500] = (503, {}, b"{}")
    past = datetime.now(UTC) - timedelta(hours=1)
    row = insert_payment(
        conn,
        failures=5,
        attempt=5,
        **(
            {}
            if earlier == "never in doubt"
            else {"in_doubt": True, "in_doubt_since": past, "calls_land_by": past}
        ),
    )
    executor.execute(claim_due(conn, limit=1, lease_seconds=config.lease_seconds))
    after = payment(conn, row["id"])
    assert (after["status"], after["failure_reason"]) == ("FAILED", "RETRIES_EXHAUSTED")
    assert after["in_doubt"] and after["calls_land_by"] > datetime.now(UTC)
    assert after["key_generation"] == 1
    with pytest.raises(DeadLetterActionRefused, match="may still land"):
        dead_letters.redrive(conn, executor.gateway, row["id"], actor="ops")


def unbounded_doubt(conn, config, **columns):
    """In doubt from before the in-flight bound was recorded (no calls_land_by)."""
    since = datetime.now(UTC) - timedelta(seconds=config.gateway_key_retention_seconds)
    return insert_payment(
        conn, in_doubt=True, in_doubt_since=since, calls_land_by=None, failures=2, **columns
    )


def test_a_doubt_without_a_bound_is_never_conclusive(conn, config, scripted):
    """A re-drive of a row parked in doubt with no recorded bound finds
    nothing: that is not conclusive (an old call may still land), so it is
    refused and the key stays."""
    row = unbounded_doubt(
        conn, config, status="FAILED", failure_reason="RETRIES_EXHAUSTED", attempt=6
    )
    conn.execute(
        "INSERT INTO dead_letters (payment_id, due_at, payer, reason) "
        "VALUES (%s, %s, %s, 'RETRIES_EXHAUSTED')",
        (row["id"], row["due_at"], row["payer"]),
    )
    gateway = HttpGateway(scripted.url, timeout=config.gateway_timeout_seconds)
    try:
        with pytest.raises(DeadLetterActionRefused, match="not known"):
            dead_letters.redrive(conn, gateway, row["id"], actor="ops")
    finally:
        gateway.close()
    after = payment(conn, row["id"])
    assert (after["status"], after["key_generation"], after["in_doubt"]) == ("FAILED", 1, True)


def test_a_failed_lookup_of_a_doubt_without_a_bound_keeps_the_groups_outcomes(
    conn, config, scripted, executor, monkeypatch
):
    scripted.answers[111] = OK
    old = unbounded_doubt(conn, config)
    neighbour = insert_payment(conn, amount_minor=111)

    def unreachable(request):
        raise GatewayError("processor unreachable")

    monkeypatch.setattr(executor.gateway, "find_charges", unreachable)
    executor.execute(claim_due(conn, limit=2, lease_seconds=config.lease_seconds))
    assert payment(conn, neighbour["id"])["status"] == "COMPLETED"
    after = payment(conn, old["id"])
    assert (after["status"], after["in_doubt"], after["key_generation"]) == ("PENDING", True, 1)
    assert after["run_at"] > datetime.now(UTC) + timedelta(seconds=60)  # asked again later
    assert scripted.charge_requests() == 1  # the neighbour's call only
