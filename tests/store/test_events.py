"""GET /v1/events: the caller's own events, in order, resumable, never
skipping one whose transaction commits late."""

from __future__ import annotations

import base64
import time

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.conftest import future, iso
from tests.factories import insert_event
from tests.support import SENDABLE_WITHIN_SECONDS

URL = "/v1/events"
#: Another database's long transaction may hold the snapshot's xmin back
#: (tests.support): reads that expect events poll up to this long.
SETTLE_SECONDS = SENDABLE_WITHIN_SECONDS


def read(client, headers, *, after: str | None = None, limit: int | None = None) -> dict:
    params = {k: v for k, v in (("after", after), ("limit", limit)) if v is not None}
    response = client.get(URL, query_string=params, headers=headers)
    assert response.status_code == 200, response.get_json()
    return response.get_json()


def read_until(
    client, headers, count: int, *, after: str | None = None, limit: int | None = None
) -> tuple[list[dict], str]:
    """Polls the feed, following nextCursor, until ``count`` events came."""
    events, cursor = [], after
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        page = read(client, headers, after=cursor, limit=limit)
        events += page["data"]
        cursor = page["nextCursor"]
        if len(events) >= count or time.monotonic() > deadline:
            return events, cursor
        time.sleep(0.02)


def create_payment(client, headers, key: str) -> dict:
    response = client.post(
        "/v1/scheduled-payments",
        headers={**headers, "Idempotency-Key": key},
        json={"payee": "acme", "amount": 1000, "dueAt": iso(future())},
    )
    assert response.status_code == 201
    return response.get_json()


def test_the_feed_shows_the_callers_payment_events_in_order(client, alice, bob, conn):
    payment = create_payment(client, alice, "k1")
    assert (
        client.delete(f"/v1/scheduled-payments/{payment['id']}", headers=alice).status_code == 200
    )
    theirs = insert_event(conn, payer="bob")

    events, cursor = read_until(client, alice, 2)
    assert [e["type"] for e in events] == ["payment.created", "payment.cancelled"]
    created, cancelled = events
    assert set(created) == {"id", "type", "paymentId", "status", "attempt", "data", "createdAt"}
    assert created["paymentId"] == cancelled["paymentId"] == payment["id"]
    assert (created["status"], cancelled["status"]) == ("PENDING", "CANCELLED")
    assert created["attempt"] == 0
    assert created["data"]["amount"] == 1000 and created["data"]["currency"] == "USD"
    assert created["createdAt"].endswith("+00:00")
    assert created["id"] < cancelled["id"]

    bobs, bob_cursor = read_until(client, bob, 1)
    assert [e["id"] for e in bobs] == [theirs]
    # Nothing more for either; a cursor from another actor's feed shows only one's own.
    assert read(client, alice, after=cursor)["data"] == []
    assert [e["id"] for e in read(client, bob, after=cursor)["data"]] == [theirs]
    assert read(client, bob, after=bob_cursor)["data"] == []


def test_the_feed_pages_and_a_client_polls_with_next_cursor(client, alice, conn):
    start = read(client, alice)
    assert start["data"] == [] and start["nextCursor"]  # present even before any event

    ids = [insert_event(conn) for _ in range(5)]
    pages, cursor = [], start["nextCursor"]
    while sum(len(p) for p in pages) < 5:
        events, cursor = read_until(client, alice, 1, after=cursor, limit=2)
        assert len(events) <= 2
        pages.append([e["id"] for e in events])
    assert [i for page in pages for i in page] == ids

    empty = read(client, alice, after=cursor)
    assert empty == {"data": [], "nextCursor": cursor}  # nothing new: the same cursor back

    later = insert_event(conn)
    events, _ = read_until(client, alice, 1, after=cursor)
    assert [e["id"] for e in events] == [later]


@pytest.mark.parametrize(
    "params, field",
    [
        ({"after": "not-a-cursor"}, "after"),
        ({"after": base64.urlsafe_b64encode(b"12.x").decode()}, "after"),
        ({"after": base64.urlsafe_b64encode(b"-1.5").decode()}, "after"),
        ({"after": base64.urlsafe_b64encode(b"99999999999999999999.1").decode()}, "after"),
        ({"after": ""}, None),  # empty means "from the start"
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"cursor": "abc"}, "cursor"),  # unknown parameters are refused, not ignored
    ],
)
def test_bad_cursor_or_limit_is_a_400_naming_the_field(client, alice, params, field):
    response = client.get(URL, query_string=params, headers=alice)
    if field is None:
        assert response.status_code == 200
        return
    assert response.status_code == 400
    assert response.mimetype == "application/problem+json"
    body = response.get_json()
    assert body["code"] == "VALIDATION_FAILED"
    assert field in body["errors"]


def test_the_feed_needs_a_key(client):
    response = client.get(URL)
    assert response.status_code == 401
    assert response.get_json()["code"] == "UNAUTHENTICATED"


def test_an_event_that_commits_late_is_never_skipped(client, alice, conn, database_url):
    before = insert_event(conn)
    seen, start = read_until(client, alice, 1)
    assert [e["id"] for e in seen] == [before]

    with psycopg.connect(database_url, row_factory=dict_row) as slow:
        early = insert_event(slow)  # its transaction stays open
        late = insert_event(conn)  # committed after it, with a larger txid and id
        assert early < late
        with psycopg.connect(database_url, row_factory=dict_row, autocommit=True) as other:
            assert (
                other.execute(
                    "SELECT count(*) AS n FROM payment_events WHERE id = %s", (late,)
                ).fetchone()["n"]
                == 1
            )  # committed and visible...
        for _ in range(5):  # ...but the feed stops before the open transaction's position
            page = read(client, alice, after=start)
            assert page == {"data": [], "nextCursor": start}
            time.sleep(0.05)
        slow.commit()

    events, cursor = read_until(client, alice, 2, after=start)
    assert [e["id"] for e in events] == [early, late]
    assert read(client, alice, after=cursor)["data"] == []
