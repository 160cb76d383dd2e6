"""The next-state policy (paycron.policy) as tables: one row per case.

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
from paycron.enums import FailureReason, Outcome, Status
from paycron.gateway_client import CallResult
from paycron.policy import (
    DEFAULT_RATE_LIMIT_DELAY,
    KEY_IN_USE_LOOKUP_AFTER,
    KEY_IN_USE_MAX_DELAY,
    Decision,
    after_lease_expiry,
    after_lookup,
    backoff,
    decide,
)

CONFIG = Config(retry_delays=(60.0, 300.0, 1800.0), retry_jitter=0.2, max_lease_expiries=3)
BUDGET = CONFIG.max_gateway_calls
#: A rate-limited or "key in use" payment waits its delay times uniform(1, 1.5):
#: a burst of them does not come back as a burst.
SPREAD = 1.5
#: Seeded draws per row: the delay is random, its bounds are not.
SEEDS = range(50)

#: Each call answer as HttpGateway returns it (paycron.gateway_client), and the
#: executor's own NOT_SENT (the lease was too short to send the call).
ANSWERS = {
    "succeeded": CallResult(Outcome.SUCCEEDED, gateway_ref="ch_1"),
    "declined": CallResult(Outcome.DECLINED, error_code="card_declined"),
    "429": CallResult(Outcome.RATE_LIMITED, error_code="rate_limited"),
    "429-retry-after-30s": CallResult(Outcome.RATE_LIMITED, error_code="rate_limited",
                                      retry_after=30.0),
    "key_in_use": CallResult(Outcome.KEY_IN_USE, error_code="idempotency_key_in_use",
                             in_doubt=True),
    "not_sent": CallResult(Outcome.NOT_SENT, error_code="lease_too_short"),
    "refused": CallResult(Outcome.RETRYABLE_ERROR, error_code="NewConnectionError"),
    "http_503": CallResult(Outcome.RETRYABLE_ERROR, error_code="http_503", in_doubt=True),
    "timeout": CallResult(Outcome.AMBIGUOUS, error_code="ReadTimeoutError", in_doubt=True),
}

P, C, F = Status.PENDING, Status.COMPLETED, Status.FAILED
DEC, EXH = FailureReason.DECLINED, FailureReason.RETRIES_EXHAUSTED
LER = FailureReason.LEASE_EXPIRED_REPEATEDLY
NOW = (0.0, 0.0)
RL = (DEFAULT_RATE_LIMIT_DELAY, DEFAULT_RATE_LIMIT_DELAY * SPREAD)
RL30 = (30.0, 30.0 * SPREAD)
D1 = (60.0 * 0.8, 60.0 * 1.2)  # after the 1st failure: the 1st delay ±20%
D3 = (1800.0 * 0.8, 1800.0 * 1.2)  # after the 3rd: the last delay ±20%
K1 = (1.0, 1.0 * SPREAD)  # the 1st 409: a second, doubling per 409 in a row
KCAP = (KEY_IN_USE_MAX_DELAY, KEY_IN_USE_MAX_DELAY * SPREAD)  # the 9th on: capped


def case(answer, failures, doubt, status, failures_after, doubt_after, reason, lookup, delay,
         *, streak=0, streak_after=0):
    streak_id = f"-{streak}inarow" if streak else ""
    return pytest.param(
        answer, failures, doubt, streak, status, failures_after, doubt_after, reason, lookup,
        delay, streak_after,
        id=f"{answer}-{failures}failed{streak_id}-{'in_doubt' if doubt else 'sure'}")


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
    case("429", 0, True, P, 0, True, None, False, RL, streak=5),
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
]


def test_the_tables_sit_on_the_edges():
    assert BUDGET == 4 and KEY_IN_USE_LOOKUP_AFTER == 10
    assert {row.values[1] for row in DECIDE} == {0, BUDGET - 2, BUDGET - 1, BUDGET}
    assert {row.values[0] for row in DECIDE} == set(ANSWERS)
    assert {row.values[0] for row in LEASE_EXPIRY} == {
        0, CONFIG.max_lease_expiries - 2, CONFIG.max_lease_expiries - 1,
        CONFIG.max_lease_expiries}


@pytest.mark.parametrize("answer,failures,doubt,streak,status,failures_after,doubt_after,"
                         "reason,lookup,delay,streak_after", DECIDE)
def test_decide(answer, failures, doubt, streak, status, failures_after, doubt_after, reason,
                lookup, delay, streak_after):
    low, high = delay
    for seed in SEEDS:
        d = decide(ANSWERS[answer], failures=failures, in_doubt=doubt, key_in_use=streak,
                   config=CONFIG, rng=random.Random(seed))
        assert (d.status, d.failures, d.in_doubt, d.failure_reason, d.needs_lookup,
                d.key_in_use) == (status, failures_after, doubt_after, reason, lookup,
                                  streak_after)
        assert low <= d.delay <= high, d.delay
    # The same seed replays the same delay.
    again = [decide(ANSWERS[answer], failures=failures, in_doubt=doubt, key_in_use=streak,
                    config=CONFIG, rng=random.Random(seed)).delay for seed in (3, 3)]
    assert again[0] == again[1]


def expiry(lease_expiries, in_doubt, in_flight, status, reason, doubt_after):
    return pytest.param(
        lease_expiries, in_doubt, in_flight, status, reason, doubt_after,
        id=f"{lease_expiries}expired-{'in_doubt' if in_doubt else 'sure'}"
           f"-{'call_in_flight' if in_flight else 'no_call'}")


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
    # The limit-th expiry parks it (a poison payment must not loop), doubt kept.
    expiry(2, False, False, F, LER, False),
    expiry(2, False, True, F, LER, True),
    expiry(2, True, False, F, LER, True),
    expiry(2, True, True, F, LER, True),
    expiry(3, False, False, F, LER, False),
    expiry(3, False, True, F, LER, True),
    expiry(3, True, False, F, LER, True),
    expiry(3, True, True, F, LER, True),
]


@pytest.mark.parametrize("lease_expiries,doubt,in_flight,status,reason,doubt_after",
                         LEASE_EXPIRY)
def test_after_lease_expiry(lease_expiries, doubt, in_flight, status, reason, doubt_after):
    d = after_lease_expiry(lease_expiries=lease_expiries, failures=2, in_doubt=doubt,
                           call_in_flight=in_flight, config=CONFIG)
    # Expiries cost no budget (the call may never have been made) and wait for nothing.
    assert d == Decision(status, failures=2, in_doubt=doubt_after, failure_reason=reason)


EXHAUSTED = Decision(F, failures=4, in_doubt=True, failure_reason=EXH, needs_lookup=True)
TENTH_409 = Decision(P, delay=60.0, failures=1, in_doubt=True, needs_lookup=True,
                     key_in_use=10)


@pytest.mark.parametrize("before,charged,after", [
    pytest.param(EXHAUSTED, True, Decision(C, failures=4), id="exhausted-charge-found"),
    pytest.param(EXHAUSTED, False,
                 Decision(F, failures=4, in_doubt=True, failure_reason=EXH),
                 id="exhausted-none-parks-in-doubt"),
    pytest.param(TENTH_409, True, Decision(C, failures=1), id="tenth_409-charge-found"),
    pytest.param(TENTH_409, False,
                 Decision(P, delay=60.0, failures=1, in_doubt=True, key_in_use=10),
                 id="tenth_409-none-asks-again-in-doubt"),
])
def test_after_lookup(before, charged, after):
    assert after_lookup(before, charged=charged) == after


@pytest.mark.parametrize("failures,base", [
    pytest.param(1, 60.0, id="1st-failure-1st-delay"),
    pytest.param(2, 300.0, id="2nd-failure-2nd-delay"),
    pytest.param(3, 1800.0, id="3rd-failure-last-delay"),
    pytest.param(4, 1800.0, id="past-the-schedule-stays-on-the-last-delay"),
    pytest.param(10, 1800.0, id="far-past-the-schedule"),
])
def test_backoff_jitters_within_its_bounds(failures, base):
    delays = [backoff(failures, CONFIG, random.Random(seed)) for seed in range(200)]
    assert all(base * 0.8 <= d <= base * 1.2 for d in delays)
    # Spread both ways (with these seeds, near both bounds), not a constant.
    assert min(delays) < base * 0.85 and max(delays) > base * 1.15
    assert backoff(failures, CONFIG, random.Random(7)) == delays[7]  # a seed replays


def test_backoff_without_jitter_is_the_schedule():
    flat = Config(retry_delays=(60.0, 300.0, 1800.0), retry_jitter=0.0)
    assert [backoff(n, flat, random.Random(1)) for n in (1, 2, 3, 4)] == [
        60.0, 300.0, 1800.0, 1800.0]
