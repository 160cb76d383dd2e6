"""GET one, GET list, and the walls between actors."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime

import pytest

from paycron.ids import new_payment_id
from tests.conftest import future, iso
from tests.factories import insert_payment

URL = "/v1/scheduled-payments"


def create(client, headers, key, **overrides):
    payload = {"payee": "acme", "amount": 1000, "dueAt": iso(future()), **overrides}
    response = client.post(URL, json=payload, headers={**headers, "Idempotency-Key": key})
    assert response.status_code == 201
    return response.get_json()


def test_get_returns_the_payment_with_attempts_oldest_first(client, alice, conn):
    row = insert_payment(conn, status="FAILED", attempt=2, failures=2,
                         failure_reason="RETRIES_EXHAUSTED")
    for n, outcome in ((2, "AMBIGUOUS"), (1, "RETRYABLE_ERROR")):
        conn.execute(
            "INSERT INTO attempts (payment_id, attempt, gateway_key, outcome, error_code,"
            " finished_at, due_at) VALUES (%s, %s, %s, %s, 'http_503', now(), %s)",
            (row["id"], n, str(row["id"]), outcome, row["due_at"]))
    response = client.get(f"{URL}/{row['id']}", headers=alice)
    assert response.status_code == 200
    data = response.get_json()
    assert data["status"] == "FAILED"
    assert data["failureReason"] == "RETRIES_EXHAUSTED"
    assert data["nextAttemptAt"] is None
    assert [a["attempt"] for a in data["attempts"]] == [1, 2]
    assert [a["outcome"] for a in data["attempts"]] == ["RETRYABLE_ERROR", "AMBIGUOUS"]
    assert data["attempts"][0]["errorCode"] == "http_503"


def test_get_pending_shows_next_attempt(client, alice):
    created = create(client, alice, "k1")
    data = client.get(f"{URL}/{created['id']}", headers=alice).get_json()
    assert data["nextAttemptAt"] == data["dueAt"]
    assert data == {**created, "nextAttemptAt": data["nextAttemptAt"]}


@pytest.mark.parametrize("path_id", [
    "not-a-uuid", "123", "00000000-0000-0000-0000-000000000000", "' OR 1=1 --",
    str(uuid.uuid4()), str(new_payment_id(datetime(2001, 1, 1, tzinfo=UTC))),
])
def test_unknown_or_malformed_ids_are_404(client, alice, path_id):
    for method in (client.get, client.delete):
        response = method(f"{URL}/{path_id}", headers=alice)
        assert response.status_code == 404
        assert response.get_json()["code"] == "NOT_FOUND"


def test_another_actors_payment_is_invisible(client, alice, bob, conn):
    created = create(client, alice, "k1")
    get = client.get(f"{URL}/{created['id']}", headers=bob)
    assert get.status_code == 404
    delete = client.delete(f"{URL}/{created['id']}", headers=bob)
    assert delete.status_code == 404
    assert get.get_json() == delete.get_json() | {"detail": get.get_json()["detail"]}
    assert client.get(URL, headers=bob).get_json()["data"] == []
    status = conn.execute("SELECT status FROM payments").fetchone()["status"]
    assert status == "PENDING"


def test_list_is_newest_first_and_pages_with_an_opaque_cursor(client, alice, bob):
    ids = [create(client, alice, f"k{n}")["id"] for n in range(7)]
    create(client, bob, "bob-1")
    seen, cursor = [], None
    while True:
        query = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = client.get(URL, headers=alice, query_string=query).get_json()
        seen += [p["id"] for p in page["data"]]
        assert len(page["data"]) <= 3
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))


def test_list_filters_by_status(client, alice, conn):
    done = create(client, alice, "k0")
    conn.execute("UPDATE payments SET status = 'COMPLETED' WHERE id = %s", (done["id"],))
    for n in range(30):  # more than one page of other statuses to scan past
        create(client, alice, f"p{n}")
    pending = create(client, alice, "k1")
    data = client.get(URL, headers=alice, query_string={"status": "PENDING", "limit": 1}
                      ).get_json()
    assert [p["id"] for p in data["data"]] == [pending["id"]]
    assert data["nextCursor"]
    data = client.get(URL, headers=alice, query_string={"status": "COMPLETED", "limit": 5}
                      ).get_json()
    assert [p["id"] for p in data["data"]] == [done["id"]]
    assert data["nextCursor"] is None


@pytest.mark.parametrize("query,field", [
    ({"status": "DONE"}, "status"),
    ({"limit": 0}, "limit"),
    ({"limit": 101}, "limit"),
    ({"limit": "ten"}, "limit"),
    ({"cursor": "garbage!!"}, "cursor"),
    ({"cursor": "WyJ4IiwgInkiXQ"}, "cursor"),  # base64 of ["x", "y"]
    ({"sort": "amount"}, "sort"),
])
def test_bad_list_queries_are_400(client, alice, query, field):
    response = client.get(URL, headers=alice, query_string=query)
    assert response.status_code == 400
    assert field in response.get_json()["errors"]


def test_list_requires_a_key(client):
    assert client.get(URL).status_code == 401


def test_an_id_in_the_url_is_checked_after_the_key(client):
    response = client.get(f"{URL}/not-a-uuid")
    assert (response.status_code, response.get_json()["code"]) == (401, "UNAUTHENTICATED")


def test_cursors_round_trip_every_position_and_refuse_the_rest():
    """One Cursor field for both listings: what it writes, it reads back; what
    it could not have written, it refuses with one message."""
    from marshmallow import ValidationError

    from paycron.events import Position
    from web.events import FeedQuerySchema
    from web.payments import ListQuerySchema

    payments, feed = ListQuerySchema().fields["cursor"], FeedQuerySchema().fields["after"]
    key = (datetime(2031, 2, 3, 4, 5, 6, 789012, tzinfo=UTC), new_payment_id(future()))
    assert payments.decode(payments.encode(key)) == key
    assert feed.decode(feed.encode(Position(2 ** 63 - 1, 7))) == Position(2 ** 63 - 1, 7)
    # The feed's cursor is what clients stored since its first version: txid.id.
    assert feed.encode(Position(12, 5)) == base64.urlsafe_b64encode(b"12.5").decode().rstrip("=")
    for bad in (b"12", b"12.5.1", b"-1.5", b"1.x", str(2 ** 63).encode() + b".1", b"\xff.1"):
        with pytest.raises(ValidationError, match="not a cursor this API returned"):
            feed.decode(base64.urlsafe_b64encode(bad).decode())
    for bad in (b"1", b"99999999999999999999.1", str(2 ** 62).encode() + b".1",  # year 146,000
                b"1." + str(2 ** 128).encode()):
        with pytest.raises(ValidationError, match="not a cursor this API returned"):
            payments.decode(base64.urlsafe_b64encode(bad).decode())
