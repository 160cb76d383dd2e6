"""The next-state policy (paycron.domain.policy) as tables: one row per case.

Pure: no database, no gateway. After a call (``decide``): every call answer,
with and without doubt, at the budget's edges. The budget here is four calls
(three retry delays), so the edges are 0 failures so far, 2 (the last retry
that waits, on the last delay), 3 (this failure uses the last call) and 4
(already at the budget); 409 "key in use" at its own edges (the first, the
9th, the 10th: looked up, and far past the delay's cap). After a lease
expiry (``after_lease_expiry``) at the expiry limit's edges, and after a
lookup (``after_lookup``). Delays are drawn with seeded rngs, so each row
checks its jitter bounds over many draws and replays exactly.
"""

from __future__ import annotations

import random

import pytest

from paycron.config import Config
from paycron.domain.enums import FailureReason, Outcome, Status
from paycron.domain.policy import (
    DEFAULT_RATE_LIMIT_DELAY,
    KEY_IN_USE_LOOKUP_AFTER,
    KEY_IN_USE_MAX_DELAY,
    Answer,
    Decision,
    Lookup,
    Settlement,
    after_lease_expiry,
    after_lease_expiry_limit,
    after_lookup,
    at_lease_expiry_limit,
    backoff,
    decide,
    judge_lookup,
    next_poll_delay,
    settlement_of,
)
from paycron.domain.processing import CallResult, Charge

CONFIG = Config(retry_delays=(60.0, 300.0, 1800.0), retry_jitter=0.2, max_lease_expiries=3)
BUDGET = CONFIG.max_gateway_calls
#: A rate-limited or "key in use" payment waits its delay times uniform(1, 1.5):
#: a burst of them does not come back as a burst.
SPREAD = 1.5
#: Seeded draws per row: the delay is random, its bounds are not.
SEEDS = range(50)

#: Each call answer as HttpGateway returns it (paycron.processors.card.client), and the
#: executor's own NOT_SENT (the lease was too short to send the call).
ANSWERS = {
    "succeeded": CallResult(Outcome.SUCCEEDED, gateway_ref="ch_1"),
    "declined": CallResult(Outcome.DECLINED, error_code="card_declined"),
    "429": CallResult(Outcome.RATE_LIMITED, error_code="rate_limited"),
    "429-retry-after-30s": CallResult(
        Outcome.RATE_LIMITED, error_code="rate_limited", retry_after=30.0
    ),
    "key_in_use": CallResult(
        Outcome.KEY_IN_USE, error_code="idempotency_key_in_use", in_doubt=True
    ),
    "not_sent": CallResult(Outcome.NOT_SENT, error_code="lease_too_short"),
    "refused": CallResult(Outcome.RETRYABLE_ERROR, error_code="NewConnectionError"),
    "http_503": CallResult(Outcome.RETRYABLE_ERROR, error_code="http_503", in_doubt=True),
    "timeout": CallResult(Outcome.AMBIGUOUS, error_code="ReadTimeoutError", in_doubt=True),
    # Stripe's answers (paycron.processors.stripe.client's table) beside the fake's.
    "retry_decline": CallResult(
        Outcome.DECLINED, gateway_ref="pi_1", error_code="try_again_later", retry_decline=True
    ),
    "customer_action": CallResult(
        Outcome.DECLINED,
        gateway_ref="pi_1",
        error_code="authentication_required",
        failure_reason=FailureReason.CUSTOMER_ACTION_REQUIRED,
    ),
    "invalid_request": CallResult(
        Outcome.REJECTED,
        error_code="resource_missing",
        failure_reason=FailureReason.INVALID_REQUEST,
    ),
    "idempotency_error": CallResult(
        Outcome.REJECTED,
        error_code="idempotency_error",
        failure_reason=FailureReason.GATEWAY_REJECTED,
    ),
    "auth_failed": CallResult(Outcome.AUTH_FAILED, error_code="http_401"),
    "processing": CallResult(Outcome.SUBMITTED, gateway_ref="pi_1"),
}

P, C, F = Status.PENDING, Status.COMPLETED, Status.FAILED
AW = Status.AWAITING_GATEWAY
DEC, EXH = FailureReason.DECLINED, FailureReason.RETRIES_EXHAUSTED
LER = FailureReason.LEASE_EXPIRED_REPEATEDLY
CAR, INV = FailureReason.CUSTOMER_ACTION_REQUIRED, FailureReason.INVALID_REQUEST
REJ, MIS = FailureReason.GATEWAY_REJECTED, FailureReason.LOOKUP_MISMATCH
AUTH = (CONFIG.circuit_open_seconds, CONFIG.circuit_open_seconds * SPREAD)
NOW = (0.0, 0.0)
RL = (DEFAULT_RATE_LIMIT_DELAY, DEFAULT_RATE_LIMIT_DELAY * SPREAD)
RL30 = (30.0, 30.0 * SPREAD)
D1 = (60.0 * 0.8, 60.0 * 1.2)  # after the 1st failure: the 1st delay ±20%
D3 = (1800.0 * 0.8, 1800.0 * 1.2)  # after the 3rd: the last delay ±20%
K1 = (1.0, 1.0 * SPREAD)  # the 1st 409: a second, doubling per 409 in a row
KCAP = (KEY_IN_USE_MAX_DELAY, KEY_IN_USE_MAX_DELAY * SPREAD)  # the 9th on: capped


def case(
    answer,
    failures,
    doubt,
    status,
    failures_after,
    doubt_after,
    reason,
    lookup,
    delay,
    *,
    streak=0,
    streak_after=0,
):
    streak_id = f"-{streak}inarow" if streak else ""
    return pytest.param(
        answer,
        failures,
        doubt,
        streak,
        status,
        failures_after,
        doubt_after,
        reason,
        lookup,
        delay,
        streak_after,
        id=f"{answer}-{failures}failed{streak_id}-{'in_doubt' if doubt else 'sure'}",
    )


#: answer, failures before, in doubt before (, 409s in a row before) ->
#: status, failures, in doubt, failure reason, needs a lookup first, delay
#: range in seconds (, 409s in a row after).
DECIDE = [
    # A success completes; the count is kept for the record; doubt is over.
    case("succeeded", 0, False, C, 0, False, None, False, NOW),
    case("succeeded", 0, True, C, 0, False, None, False, NOW),
    case("succeeded", 2, False, C, 2, False, None, False, NOW),
    case("succeeded", 2, True, C, 2, False, None, False, NOW),
    case("succeeded", 3, False, C, 3, False, None, False, NOW),
    case("succeeded", 3, True, C, 3, False, None, False, NOW),
    case("succeeded", 4, False, C, 4, False, None, False, NOW),
    case("succeeded", 4, True, C, 4, False, None, False, NOW),
    case("succeeded", 0, True, C, 0, False, None, False, NOW, streak=5),
    # A decline is definitive: FAILED at once, no budget, no doubt, no lookup.
    case("declined", 0, False, F, 0, False, DEC, False, NOW),
    case("declined", 0, True, F, 0, False, DEC, False, NOW),
    case("declined", 2, False, F, 2, False, DEC, False, NOW),
    case("declined", 2, True, F, 2, False, DEC, False, NOW),
    case("declined", 3, False, F, 3, False, DEC, False, NOW),
    case("declined", 3, True, F, 3, False, DEC, False, NOW),
    case("declined", 4, False, F, 4, False, DEC, False, NOW),
    case("declined", 4, True, F, 4, False, DEC, False, NOW),
    case("declined", 0, True, F, 0, False, DEC, False, NOW, streak=5),
    # A 429 is a definitive non-charge: no budget (never parks, even at the
    # budget), doubt unchanged, back after Retry-After or the default.
    case("429", 0, False, P, 0, False, None, False, RL),
    case("429", 0, True, P, 0, True, None, False, RL),
    case("429", 2, False, P, 2, False, None, False, RL),
    case("429", 2, True, P, 2, True, None, False, RL),
    case("429", 3, False, P, 3, False, None, False, RL),
    case("429", 3, True, P, 3, True, None, False, RL),
    case("429", 4, False, P, 4, False, None, False, RL),
    case("429", 4, True, P, 4, True, None, False, RL),
    case("429", 0, True, P, 0, True, None, False, RL, streak=5, streak_after=5),
    case("429-retry-after-30s", 0, False, P, 0, False, None, False, RL30),
    case("429-retry-after-30s", 0, True, P, 0, True, None, False, RL30),
    case("429-retry-after-30s", 2, False, P, 2, False, None, False, RL30),
    case("429-retry-after-30s", 2, True, P, 2, True, None, False, RL30),
    case("429-retry-after-30s", 3, False, P, 3, False, None, False, RL30),
    case("429-retry-after-30s", 3, True, P, 3, True, None, False, RL30),
    case("429-retry-after-30s", 4, False, P, 4, False, None, False, RL30),
    case("429-retry-after-30s", 4, True, P, 4, True, None, False, RL30),
    # 409 "key in use": an earlier call under the key still runs there. No
    # budget (never parks), in doubt, asked again after a doubling delay;
    # the 10th in a row is looked up by reference first.
    case("key_in_use", 0, False, P, 0, True, None, False, K1, streak_after=1),
    case("key_in_use", 0, True, P, 0, True, None, False, K1, streak_after=1),
    case("key_in_use", 3, False, P, 3, True, None, False, K1, streak_after=1),
    case("key_in_use", 3, True, P, 3, True, None, False, K1, streak_after=1),
    case("key_in_use", 4, False, P, 4, True, None, False, K1, streak_after=1),
    case("key_in_use", 4, True, P, 4, True, None, False, K1, streak_after=1),
    case("key_in_use", 0, True, P, 0, True, None, False, (2.0, 3.0), streak=1, streak_after=2),
    case("key_in_use", 0, True, P, 0, True, None, False, KCAP, streak=8, streak_after=9),
    case("key_in_use", 0, True, P, 0, True, None, True, KCAP, streak=9, streak_after=10),
    case("key_in_use", 0, True, P, 0, True, None, True, KCAP, streak=30, streak_after=31),
    # Not sent (the lease was too short): nothing happened, claim again at once.
    case("not_sent", 0, False, P, 0, False, None, False, NOW),
    case("not_sent", 0, True, P, 0, True, None, False, NOW),
    case("not_sent", 2, False, P, 2, False, None, False, NOW),
    case("not_sent", 2, True, P, 2, True, None, False, NOW),
    case("not_sent", 3, False, P, 3, False, None, False, NOW),
    case("not_sent", 3, True, P, 3, True, None, False, NOW),
    case("not_sent", 4, False, P, 4, False, None, False, NOW),
    case("not_sent", 4, True, P, 4, True, None, False, NOW),
    case("not_sent", 0, True, P, 0, True, None, False, NOW, streak=5, streak_after=5),
    # A refused connection never reached the gateway: it uses budget but
    # adds no doubt (and clears none); the last call parks, looked up only
    # if an earlier call left it in doubt.
    case("refused", 0, False, P, 1, False, None, False, D1),
    case("refused", 0, True, P, 1, True, None, False, D1),
    case("refused", 2, False, P, 3, False, None, False, D3),
    case("refused", 2, True, P, 3, True, None, False, D3),
    case("refused", 3, False, F, 4, False, EXH, False, NOW),
    case("refused", 3, True, F, 4, True, EXH, True, NOW),
    case("refused", 4, False, F, 5, False, EXH, False, NOW),
    case("refused", 4, True, F, 5, True, EXH, True, NOW),
    # A 5xx and a timeout may have charged: budget used, in doubt from now
    # on, and an exhausted payment is looked up before it parks.
    case("http_503", 0, False, P, 1, True, None, False, D1),
    case("http_503", 0, True, P, 1, True, None, False, D1),
    case("http_503", 2, False, P, 3, True, None, False, D3),
    case("http_503", 2, True, P, 3, True, None, False, D3),
    case("http_503", 3, False, F, 4, True, EXH, True, NOW),
    case("http_503", 3, True, F, 4, True, EXH, True, NOW),
    case("http_503", 4, False, F, 5, True, EXH, True, NOW),
    case("http_503", 4, True, F, 5, True, EXH, True, NOW),
    case("timeout", 0, False, P, 1, True, None, False, D1),
    case("timeout", 0, True, P, 1, True, None, False, D1),
    case("timeout", 2, False, P, 3, True, None, False, D3),
    case("timeout", 2, True, P, 3, True, None, False, D3),
    case("timeout", 3, False, F, 4, True, EXH, True, NOW),
    case("timeout", 3, True, F, 4, True, EXH, True, NOW),
    case("timeout", 4, False, F, 5, True, EXH, True, NOW),
    case("timeout", 4, True, F, 5, True, EXH, True, NOW),
    case("timeout", 0, True, P, 1, True, None, False, D1, streak=5),
    # A decline the processor advises retrying: within the budget, again
    # later (the same intent, the next key: test_a_retried_decline_moves_the_key);
    # its last call is a plain decline.
    case("retry_decline", 0, False, P, 1, False, None, False, D1),
    case("retry_decline", 0, True, P, 1, False, None, False, D1),
    case("retry_decline", 2, False, P, 3, False, None, False, D3),
    case("retry_decline", 2, True, P, 3, False, None, False, D3),
    case("retry_decline", 3, False, F, 3, False, DEC, False, NOW),
    case("retry_decline", 3, True, F, 3, False, DEC, False, NOW),
    case("retry_decline", 4, False, F, 4, False, DEC, False, NOW),
    case("retry_decline", 4, True, F, 4, False, DEC, False, NOW),
    # The customer must authenticate: a decline with its own reason.
    case("customer_action", 0, False, F, 0, False, CAR, False, NOW),
    case("customer_action", 0, True, F, 0, False, CAR, False, NOW),
    case("customer_action", 2, False, F, 2, False, CAR, False, NOW),
    case("customer_action", 2, True, F, 2, False, CAR, False, NOW),
    case("customer_action", 3, False, F, 3, False, CAR, False, NOW),
    case("customer_action", 3, True, F, 3, False, CAR, False, NOW),
    case("customer_action", 4, False, F, 4, False, CAR, False, NOW),
    case("customer_action", 4, True, F, 4, False, CAR, False, NOW),
    # Refused before executing: FAILED, no budget; in doubt from an earlier
    # call it is looked up first (every path from doubt to FAILED is).
    case("invalid_request", 0, False, F, 0, False, INV, False, NOW),
    case("invalid_request", 0, True, F, 0, True, INV, True, NOW),
    case("invalid_request", 2, False, F, 2, False, INV, False, NOW),
    case("invalid_request", 2, True, F, 2, True, INV, True, NOW),
    case("invalid_request", 3, False, F, 3, False, INV, False, NOW),
    case("invalid_request", 3, True, F, 3, True, INV, True, NOW),
    case("invalid_request", 4, False, F, 4, False, INV, False, NOW),
    case("invalid_request", 4, True, F, 4, True, INV, True, NOW),
    # Our parameters changed under a live key: it may have charged under the
    # first ones, so always looked up first; never retried under another key.
    case("idempotency_error", 0, False, F, 0, False, REJ, True, NOW),
    case("idempotency_error", 0, True, F, 0, True, REJ, True, NOW),
    case("idempotency_error", 2, False, F, 2, False, REJ, True, NOW),
    case("idempotency_error", 2, True, F, 2, True, REJ, True, NOW),
    case("idempotency_error", 3, False, F, 3, False, REJ, True, NOW),
    case("idempotency_error", 3, True, F, 3, True, REJ, True, NOW),
    case("idempotency_error", 4, False, F, 4, False, REJ, True, NOW),
    case("idempotency_error", 4, True, F, 4, True, REJ, True, NOW),
    # Our credentials were refused: not the payment's fault. No budget,
    # nothing parked (even at the budget), doubt and streak kept, back
    # after the breaker's open time.
    case("auth_failed", 0, False, P, 0, False, None, False, AUTH),
    case("auth_failed", 0, True, P, 0, True, None, False, AUTH),
    case("auth_failed", 2, False, P, 2, False, None, False, AUTH),
    case("auth_failed", 2, True, P, 2, True, None, False, AUTH),
    case("auth_failed", 3, False, P, 3, False, None, False, AUTH),
    case("auth_failed", 3, True, P, 3, True, None, False, AUTH),
    case("auth_failed", 4, False, P, 4, False, None, False, AUTH),
    case("auth_failed", 4, True, P, 4, True, None, False, AUTH, streak=5, streak_after=5),
    # Accepted, settled later (a bank debit): it waits for the processor,
    # no budget, no doubt (a processor-side payment exists and is known).
    case("processing", 0, False, AW, 0, False, None, False, NOW),
    case("processing", 0, True, AW, 0, False, None, False, NOW),
    case("processing", 2, False, AW, 2, False, None, False, NOW),
    case("processing", 2, True, AW, 2, False, None, False, NOW),
    case("processing", 3, False, AW, 3, False, None, False, NOW),
    case("processing", 3, True, AW, 3, False, None, False, NOW),
    case("processing", 4, False, AW, 4, False, None, False, NOW),
    case("processing", 4, True, AW, 4, False, None, False, NOW),
]


def test_a_retried_decline_moves_the_key_and_confirms_the_same_intent():
    d = decide(ANSWERS["retry_decline"], failures=0, in_doubt=False, config=CONFIG)
    assert (d.next_key, d.confirm) == (True, "pi_1")
    # No other answer moves the key (SPEC §3: never after a 409, 429, 5xx,
    # timeout or idempotency_error).
    for name, answer in ANSWERS.items():
        if name != "retry_decline":
            moved = decide(answer, failures=0, in_doubt=True, config=CONFIG).next_key
            assert not moved, name


def test_the_tables_sit_on_the_edges():
    assert BUDGET == 4 and KEY_IN_USE_LOOKUP_AFTER == 10
    assert {row.values[1] for row in DECIDE} == {0, BUDGET - 2, BUDGET - 1, BUDGET}
    assert {row.values[0] for row in DECIDE} == set(ANSWERS)
    assert {row.values[0] for row in LEASE_EXPIRY} == {
        0,
        CONFIG.max_lease_expiries - 2,
        CONFIG.max_lease_expiries - 1,
        CONFIG.max_lease_expiries,
    }


@pytest.mark.parametrize(
    "answer,failures,doubt,streak,status,failures_after,doubt_after,"
    "reason,lookup,delay,streak_after",
    DECIDE,
)
def test_decide(
    answer,
    failures,
    doubt,
    streak,
    status,
    failures_after,
    doubt_after,
    reason,
    lookup,
    delay,
    streak_after,
):
    low, high = delay
    for seed in SEEDS:
        d = decide(
            ANSWERS[answer],
            failures=failures,
            in_doubt=doubt,
            key_in_use=streak,
            config=CONFIG,
            rng=random.Random(seed),
        )
        assert (
            d.status,
            d.failures,
            d.in_doubt,
            d.failure_reason,
            d.needs_lookup,
            d.key_in_use,
        ) == (status, failures_after, doubt_after, reason, lookup, streak_after)
        assert low <= d.delay <= high, d.delay
    # The same seed replays the same delay.
    again = [
        decide(
            ANSWERS[answer],
            failures=failures,
            in_doubt=doubt,
            key_in_use=streak,
            config=CONFIG,
            rng=random.Random(seed),
        ).delay
        for seed in (3, 3)
    ]
    assert again[0] == again[1]


def expiry(lease_expiries, in_doubt, in_flight, status, reason, doubt_after):
    return pytest.param(
        lease_expiries,
        in_doubt,
        in_flight,
        status,
        reason,
        doubt_after,
        id=f"{lease_expiries}expired-{'in_doubt' if in_doubt else 'sure'}"
        f"-{'call_in_flight' if in_flight else 'no_call'}",
    )


#: lease expiries before, in doubt before, call in flight -> status, failure
#: reason, in doubt. The limit here is 3: the 3rd expiry parks.
LEASE_EXPIRY = [
    # Back to PENDING, in doubt when its call was in flight (it may have landed).
    expiry(0, False, False, P, None, False),
    expiry(0, False, True, P, None, True),
    expiry(0, True, False, P, None, True),
    expiry(0, True, True, P, None, True),
    expiry(1, False, False, P, None, False),
    expiry(1, False, True, P, None, True),
    expiry(1, True, False, P, None, True),
    expiry(1, True, True, P, None, True),
    # The limit-th counted expiry parks nothing by itself (its call may have
    # charged): back to PENDING in doubt, looked up on its next claim. Only
    # when that claim's lease expires too is it parked, doubt kept (a poison
    # payment must not loop). Only an expiry whose call was in flight counts:
    # a claim that never got its attempt row (a lost message, a
    # crash-looping deploy) made no call and never parks.
    expiry(2, False, False, P, None, False),
    expiry(2, False, True, P, None, True),
    expiry(2, True, False, P, None, True),
    expiry(2, True, True, P, None, True),
    expiry(3, False, False, P, None, False),
    expiry(3, False, True, F, LER, True),
    expiry(3, True, False, P, None, True),
    expiry(3, True, True, F, LER, True),
]


@pytest.mark.parametrize(
    "lookup,doubt,status,reason,doubt_after",
    [
        (Lookup(Answer.NONE, conclusive=False), True, F, LER, True),
        (Lookup(Answer.NONE, conclusive=True), True, F, LER, False),
        (
            Lookup(Answer.CHARGED, charge=Charge("ch_1", "p", 2500, "USD", "succeeded")),
            True,
            Status.COMPLETED,
            None,
            False,
        ),
        (
            Lookup(Answer.PROCESSING, charge=Charge("ch_1", "p", 2500, "USD", "processing")),
            True,
            Status.AWAITING_GATEWAY,
            None,
            False,
        ),
        (
            Lookup(Answer.MISMATCHED, charge=Charge("ch_1", "p", 9, "USD", "succeeded")),
            True,
            F,
            FailureReason.LOOKUP_MISMATCH,
            True,
        ),
    ],
)
def test_after_lease_expiry_limit(lookup, doubt, status, reason, doubt_after):
    assert not at_lease_expiry_limit(CONFIG.max_lease_expiries - 1, CONFIG)
    assert at_lease_expiry_limit(CONFIG.max_lease_expiries, CONFIG)
    d = after_lease_expiry_limit(lookup, failures=2, in_doubt=doubt)
    assert (d.status, d.failure_reason, d.in_doubt, d.next_key) == (
        status,
        reason,
        doubt_after,
        False,
    )


@pytest.mark.parametrize("lease_expiries,doubt,in_flight,status,reason,doubt_after", LEASE_EXPIRY)
def test_after_lease_expiry(lease_expiries, doubt, in_flight, status, reason, doubt_after):
    d = after_lease_expiry(
        lease_expiries=lease_expiries,
        failures=2,
        in_doubt=doubt,
        call_in_flight=in_flight,
        config=CONFIG,
    )
    # Expiries cost no budget (the call may never have been made) and wait for nothing.
    assert d == Decision(status, failures=2, in_doubt=doubt_after, failure_reason=reason)


EXHAUSTED = Decision(F, failures=4, in_doubt=True, failure_reason=EXH, needs_lookup=True)
TENTH_409 = Decision(P, delay=60.0, failures=1, in_doubt=True, needs_lookup=True, key_in_use=10)
REJECTED = Decision(F, failures=2, in_doubt=True, failure_reason=REJ, needs_lookup=True)
CHARGED = Lookup(Answer.CHARGED, charge=Charge("ch_1", "p", 2500, "USD", "succeeded"))
PROCESSING_ = Lookup(Answer.PROCESSING, charge=Charge("ch_1", "p", 2500, "USD", "processing"))
MISMATCHED = Lookup(Answer.MISMATCHED, charge=Charge("ch_1", "p", 9999, "USD", "succeeded"))
NONE_YET = Lookup(Answer.NONE, conclusive=False)
NONE = Lookup(Answer.NONE, conclusive=True)


@pytest.mark.parametrize(
    "before,lookup,after",
    [
        # A charge found completes, whatever was about to happen.
        pytest.param(EXHAUSTED, CHARGED, Decision(C, failures=4), id="exhausted-charged"),
        pytest.param(TENTH_409, CHARGED, Decision(C, failures=1), id="tenth_409-charged"),
        pytest.param(REJECTED, CHARGED, Decision(C, failures=2), id="rejected-charged"),
        # Another amount, currency or customer: parked for a human, doubt kept, key kept.
        pytest.param(
            EXHAUSTED,
            MISMATCHED,
            Decision(F, failures=4, in_doubt=True, failure_reason=MIS),
            id="exhausted-mismatched",
        ),
        pytest.param(
            TENTH_409,
            MISMATCHED,
            Decision(F, failures=1, in_doubt=True, failure_reason=MIS),
            id="tenth_409-mismatched",
        ),
        # Still processing there: it waits for the processor's outcome.
        pytest.param(EXHAUSTED, PROCESSING_, Decision(AW, failures=4), id="exhausted-processing"),
        pytest.param(TENTH_409, PROCESSING_, Decision(AW, failures=1), id="tenth_409-processing"),
        # None, while a call may still land: the decision stands, in doubt.
        pytest.param(
            EXHAUSTED,
            NONE_YET,
            Decision(F, failures=4, in_doubt=True, failure_reason=EXH),
            id="exhausted-none-yet-parks-in-doubt",
        ),
        pytest.param(
            TENTH_409,
            NONE_YET,
            Decision(P, delay=60.0, failures=1, in_doubt=True, key_in_use=10),
            id="tenth_409-none-yet-asks-again-in-doubt",
        ),
        pytest.param(
            REJECTED,
            NONE_YET,
            Decision(F, failures=2, in_doubt=True, failure_reason=REJ),
            id="rejected-none-yet-parks-in-doubt",
        ),
        # A conclusive none settles the doubt; a payment to be called again
        # moves to its next key generation, a parked one keeps its key.
        pytest.param(
            EXHAUSTED,
            NONE,
            Decision(F, failures=4, failure_reason=EXH),
            id="exhausted-none-parks-sure",
        ),
        pytest.param(
            TENTH_409,
            NONE,
            Decision(P, delay=0.0, failures=1, next_key=True),
            id="tenth_409-none-next-key-at-once",
        ),
        pytest.param(
            REJECTED,
            NONE,
            Decision(F, failures=2, failure_reason=REJ),
            id="rejected-none-parks-sure",
        ),
    ],
)
def test_after_lookup(before, lookup, after):
    assert after_lookup(before, lookup) == after


def charge(
    status="succeeded", amount=2500, currency="USD", reference="p", customer=None, id="ch_1"
):
    return Charge(id, reference, amount, currency, status, customer=customer)


@pytest.mark.parametrize(
    "found,answer",
    [
        pytest.param([], Answer.NONE, id="nothing"),
        pytest.param([charge()], Answer.CHARGED, id="succeeded"),
        pytest.param([charge("refunded")], Answer.CHARGED, id="refunded-is-charged"),
        pytest.param([charge(currency="usd")], Answer.CHARGED, id="currency-case"),
        pytest.param([charge("processing")], Answer.PROCESSING, id="processing"),
        pytest.param([charge("failed")], Answer.NONE, id="failed-proves-nothing"),
        pytest.param([charge(reference="other")], Answer.NONE, id="another-reference"),
        pytest.param([charge(amount=9999)], Answer.MISMATCHED, id="another-amount"),
        pytest.param([charge(currency="EUR")], Answer.MISMATCHED, id="another-currency"),
        pytest.param([charge(customer="cus_other")], Answer.MISMATCHED, id="another-customer"),
        pytest.param(
            [charge("processing", amount=9999)], Answer.MISMATCHED, id="another-amount-processing"
        ),
        pytest.param([charge("failed", amount=9999)], Answer.NONE, id="another-amount-failed"),
        pytest.param(
            [charge("failed", id="a"), charge(id="b")],
            Answer.CHARGED,
            id="a-later-generation-charged",
        ),
        pytest.param(
            [charge(amount=9999, id="a"), charge(id="b")],
            Answer.CHARGED,
            id="charged-beats-mismatched",
        ),
        pytest.param(
            [charge("processing", id="a"), charge(amount=1, id="b")],
            Answer.MISMATCHED,
            id="mismatched-beats-processing",
        ),
    ],
)
def test_judge_lookup_gives_four_answers(found, answer):
    lookup = judge_lookup(
        found, payment_id="p", amount=2500, currency="USD", customer="cus_1", conclusive=True
    )
    assert lookup.answer is answer


def test_two_charged_payments_for_one_id_are_reported():
    lookup = judge_lookup(
        [charge(id="a"), charge(id="b")],
        payment_id="p",
        amount=2500,
        currency="USD",
        conclusive=True,
    )
    assert (lookup.charge.id, [c.id for c in lookup.extra]) == ("a", ["b"])


def test_none_is_conclusive_only_when_told():
    assert not judge_lookup(
        [], payment_id="p", amount=1, currency="USD", conclusive=False
    ).conclusive


@pytest.mark.parametrize(
    "failures,base",
    [
        pytest.param(1, 60.0, id="1st-failure-1st-delay"),
        pytest.param(2, 300.0, id="2nd-failure-2nd-delay"),
        pytest.param(3, 1800.0, id="3rd-failure-last-delay"),
        pytest.param(4, 1800.0, id="past-the-schedule-stays-on-the-last-delay"),
        pytest.param(10, 1800.0, id="far-past-the-schedule"),
    ],
)
def test_backoff_jitters_within_its_bounds(failures, base):
    delays = [backoff(failures, CONFIG, random.Random(seed)) for seed in range(200)]
    assert all(base * 0.8 <= d <= base * 1.2 for d in delays)
    # Spread both ways (with these seeds, near both bounds), not a constant.
    assert min(delays) < base * 0.85 and max(delays) > base * 1.15
    assert backoff(failures, CONFIG, random.Random(7)) == delays[7]  # a seed replays


def test_backoff_without_jitter_is_the_schedule():
    flat = Config(retry_delays=(60.0, 300.0, 1800.0), retry_jitter=0.0)
    assert [backoff(n, flat, random.Random(1)) for n in (1, 2, 3, 4)] == [
        60.0,
        300.0,
        1800.0,
        1800.0,
    ]


@pytest.mark.parametrize(
    "polls,delay", [(0, 300.0), (1, 1800.0), (2, 7200.0), (3, 43200.0), (4, 43200.0), (50, 43200.0)]
)
def test_a_waiting_payment_is_polled_with_backing_off_intervals(polls, delay):
    assert next_poll_delay(polls, Config(gateway_poll_seconds=300.0)) == delay


@pytest.mark.parametrize(
    "status,settlement",
    [
        ("succeeded", Settlement.COMPLETED),
        ("refunded", Settlement.COMPLETED),
        ("failed", Settlement.FAILED),
        ("processing", Settlement.WAITING),
        ("requires_capture", Settlement.WAITING),
    ],
)
def test_what_a_retrieved_payment_settles(status, settlement):
    assert settlement_of(charge(status)) is settlement
