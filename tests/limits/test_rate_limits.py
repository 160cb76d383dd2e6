"""Rate limits per actor (docs/design.md): a token bucket per actor in Redis,
429 RATE_LIMITED with Retry-After above it, failing open without Redis."""

from __future__ import annotations

import logging
import time

import pytest
from prometheus_client import REGISTRY

from web import close_app, create_app

URL = "/v1/webhook-endpoints"  # any authenticated route: the limit is in web/auth.py


@pytest.fixture
def limited(config):
    """An app whose actors get ``burst`` requests at once, refilled at ``rate``/s."""
    apps = []

    def make(*, rate: int, burst: int, **overrides):
        app = create_app(
            config.with_overrides(
                api_rate_limit=rate,
                api_rate_burst=burst,
                batch_max_items=min(burst, overrides.pop("batch_max_items", burst)),
                **overrides,
            )
        )
        apps.append(app)
        return app.test_client()

    yield make
    for app in apps:
        close_app(app)


def _errors() -> float:
    return REGISTRY.get_sample_value("paycron_rate_limiter_errors_total") or 0.0


def test_a_burst_beyond_the_limit_is_429_for_that_actor_only(limited, alice, bob):
    client = limited(rate=1, burst=3)
    assert [client.get(URL, headers=alice).status_code for _ in range(3)] == [200] * 3

    refused = client.get(URL, headers=alice)
    assert refused.status_code == 429
    assert refused.mimetype == "application/problem+json"
    assert refused.json["code"] == "RATE_LIMITED"
    assert int(refused.headers["Retry-After"]) >= 1
    assert client.get(URL, headers=bob).status_code == 200  # bob has a bucket of his own


def test_tokens_refill_at_the_rate(limited, alice):
    client = limited(rate=5, burst=1)
    assert client.get(URL, headers=alice).status_code == 200
    assert client.get(URL, headers=alice).status_code == 429
    time.sleep(0.3)  # 1.5 tokens at 5/s
    assert client.get(URL, headers=alice).status_code == 200


def test_the_bucket_is_shared_by_every_web_process(limited, alice):
    first, second = limited(rate=1, burst=2), limited(rate=1, burst=2)
    assert first.get(URL, headers=alice).status_code == 200
    assert second.get(URL, headers=alice).status_code == 200
    assert first.get(URL, headers=alice).status_code == 429


def test_unauthenticated_requests_are_charged_to_no_one(limited, alice, make_key):
    client = limited(rate=1, burst=1)
    wrong = {"Authorization": "Bearer " + make_key("alice")[:-2] + "xx"}
    for _ in range(5):
        assert client.get(URL, headers=wrong).status_code == 401
        assert client.get(URL).status_code == 401
    assert client.get(URL, headers=alice).status_code == 200


def test_without_redis_requests_are_served_counted_and_logged_once(limited, alice, caplog):
    client = limited(rate=1, burst=1, redis_url="redis://127.0.0.1:9/0")  # nothing listens
    before = _errors()
    with caplog.at_level(logging.WARNING, logger="paycron.rate_limits"):
        statuses = [client.get(URL, headers=alice).status_code for _ in range(5)]
    assert statuses == [200] * 5  # far beyond the burst: the limiter failed open
    assert _errors() > before
    warnings = [r for r in caplog.records if r.name == "paycron.rate_limits"]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_the_openapi_document_states_the_429(client):
    operation = client.get("/openapi.json").json["paths"][URL]["get"]
    answer = operation["responses"]["429"]
    assert "Retry-After" in answer["headers"]


def test_a_charge_of_many_takes_all_or_none(config, redis_client):
    """A bucket of 500 refilled at 1/s: what refills meanwhile never changes an answer."""
    from paycron.errors import RateLimited
    from paycron.limits.rate_limits import ActorRateLimiter

    limiter = ActorRateLimiter(
        redis_client,
        config.with_overrides(api_rate_limit=1, api_rate_burst=500, batch_max_items=500),
    )
    limiter.charge("alice", 300)
    with pytest.raises(RateLimited) as refused:
        limiter.charge("alice", 250)  # ~200 left: ~50 more at 1/s
    assert refused.value.retry_after >= 30
    limiter.charge("alice", 200)  # the refusal took nothing
    with pytest.raises(RateLimited):
        limiter.charge("alice", 60)
    limiter.charge("bob", 500)


def _limiter(redis_client, config, *, rate: int, burst: int, clock=time.monotonic):
    from paycron.limits.rate_limits import ActorRateLimiter

    settings = config.with_overrides(
        api_rate_limit=rate, api_rate_burst=burst, batch_max_items=min(burst, 1000)
    )
    return ActorRateLimiter(redis_client, settings, clock=clock)


def _spend(limiter, actor: str) -> int:
    """Charges of one token until the first refusal: how many were granted."""
    from paycron.errors import RateLimited

    granted = 0
    while True:
        try:
            limiter.charge(actor)
        except RateLimited:
            return granted
        granted += 1


def test_a_busy_actor_pays_a_round_trip_for_many_requests_not_each(config, redis_client):
    limiter = _limiter(redis_client, config, rate=1000, burst=5000)
    for _ in range(200):
        limiter.charge("alice")
    assert limiter.round_trips <= 25  # one per request without allowances


def test_allowances_never_grant_more_than_the_bucket_holds(config, redis_client):
    """Two processes' limiters sharing one bucket of 1,000 refilled at 1/s,
    both taking allowances: together they grant what the bucket held (and
    what refilled meanwhile), never more, and lose none of it."""
    first = _limiter(redis_client, config, rate=1, burst=1000)
    second = _limiter(redis_client, config, rate=1, burst=1000)
    started = time.monotonic()
    granted = 0
    refused_in_a_row = 0
    while refused_in_a_row < 2:
        for limiter in (first, second):
            n = _spend_some(limiter, "carol", 7)
            granted += n
            refused_in_a_row = 0 if n else refused_in_a_row + 1
    refilled = time.monotonic() - started  # at 1 token/s
    assert 1000 <= granted <= 1000 + refilled + 1
    assert first.round_trips + second.round_trips < granted / 4


def _spend_some(limiter, actor: str, n: int) -> int:
    from paycron.errors import RateLimited

    for done in range(n):
        try:
            limiter.charge(actor)
        except RateLimited:
            return done
    return n


def test_an_expired_allowance_is_not_spent_and_goes_back_with_the_next_charge(config, redis_client):
    now = [0.0]
    holder = _limiter(redis_client, config, rate=1, burst=1000, clock=lambda: now[0])
    other = _limiter(redis_client, config, rate=1, burst=1000)
    for _ in range(40):
        holder.charge("dave")  # builds an allowance: a few spare tokens held here
    drained = _spend(other, "dave")
    assert drained < 1000 - 40  # some of dave's tokens sit in holder's allowance

    now[0] += 1.0  # the allowance expired: its tokens are not spent ...
    trips = holder.round_trips
    holder.charge("dave")  # ... but given back by this charge's round trip
    assert holder.round_trips == trips + 1
    came_back = _spend(other, "dave")
    assert came_back >= 1
    assert 1000 <= 40 + drained + 1 + came_back <= 1000 + 3  # (+ refilled at 1/s meanwhile)
