"""Webhook endpoints per actor (docs/design.md): at most MAX_WEBHOOK_ENDPOINTS
live ones, bound held under concurrent registrations; the list is paginated."""

from __future__ import annotations

import threading

import pytest

from paycron.config import Config
from paycron.errors import LimitReached
from paycron.store import webhooks
from paycron.store.db import connect
from web import close_app, create_app

URL = "/v1/webhook-endpoints"


@pytest.fixture
def quota_client(config):
    app = create_app(config.with_overrides(max_webhook_endpoints=3))
    yield app.test_client()
    close_app(app)


def _register(client, headers, n: int = 1) -> list:
    return [
        client.post(URL, json={"url": f"https://hooks.example/{i}"}, headers=headers)
        for i in range(n)
    ]


def _live(conn, actor: str) -> int:
    return conn.execute(
        "SELECT count(*) AS n FROM webhook_endpoints WHERE actor = %s AND deleted_at IS NULL",
        (actor,),
    ).fetchone()["n"]


def test_registering_beyond_the_quota_is_409_and_creates_nothing(quota_client, alice, bob, conn):
    assert [r.status_code for r in _register(quota_client, alice, 3)] == [201] * 3
    refused = quota_client.post(URL, json={"url": "https://hooks.example/x"}, headers=alice)
    assert refused.status_code == 409
    assert refused.mimetype == "application/problem+json"
    assert refused.json["code"] == "LIMIT_REACHED"
    assert _live(conn, "alice") == 3
    assert _register(quota_client, bob)[0].status_code == 201  # bob's quota is his own

    first = quota_client.get(URL, headers=alice).json["data"][0]["id"]
    assert quota_client.delete(f"{URL}/{first}", headers=alice).status_code == 204
    assert _register(quota_client, alice)[0].status_code == 201  # a deleted one frees a place


def test_concurrent_registrations_never_exceed_the_quota(database_url):
    """Twelve registrations at once, each on its own connection, against a
    quota of three: exactly three land (a count-then-insert without the
    per-actor lock lets several through)."""
    attempts, quota = 12, 3
    barrier = threading.Barrier(attempts)
    outcomes: list[str] = []
    conns = [connect(Config(database_url=database_url)) for _ in range(attempts)]

    def register(conn):
        barrier.wait()
        try:
            webhooks.create_endpoint(
                conn, actor="racer", url="https://hooks.example/", max_endpoints=quota
            )
            outcomes.append("created")
        except LimitReached:
            outcomes.append("refused")

    threads = [threading.Thread(target=register, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert sorted(outcomes) == ["created"] * quota + ["refused"] * (attempts - quota)
        assert _live(conns[0], "racer") == quota
    finally:
        for c in conns:
            c.close()


def test_the_list_pages_oldest_first_with_an_opaque_cursor(client, alice, bob):
    created = [r.json["id"] for r in _register(client, alice, 5)]
    _register(client, bob, 2)
    client.delete(f"{URL}/{created[1]}", headers=alice)
    live = [created[0], *created[2:]]

    seen, cursor, pages = [], "", 0
    while True:
        page = client.get(URL, query_string={"limit": 2, "cursor": cursor}, headers=alice).json
        seen += [e["id"] for e in page["data"]]
        pages += 1
        cursor = page["nextCursor"]
        if cursor is None:
            break
        assert "." not in cursor and len(page["data"]) == 2
    assert seen == live and pages == 2
    assert client.get(URL, headers=alice).json["nextCursor"] is None  # default limit 20


@pytest.mark.parametrize(
    "query, field",
    [
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"after": "x"}, "after"),
    ],
)
def test_bad_list_queries_are_400(client, alice, query, field):
    response = client.get(URL, query_string=query, headers=alice)
    assert response.status_code == 400
    assert field in response.json["errors"]
