"""Rate limits per actor (docs/design.md): a token bucket per actor in Redis,
429 RATE_LIMITED with Retry-After above it, failing open without Redis."""

from __future__ import annotations

import logging
import time

import pytest
from prometheus_client import REGISTRY

from web import create_app

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
        app.extensions["paycron.pool"].close()


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
