"""GET one, GET list, and the walls between actors."""

from __future__ import annotations

import base64
import random
import uuid
from datetime import UTC, datetime

import pytest

from paycron.domain.ids import new_payment_id
from paycron.store import payments
from tests.conftest import future, iso
from tests.factories import insert_payment

URL = "/v1/scheduled-payments"


def create(client, headers, key, **overrides):
    payload = {"payee": "acme", "amount": 1000, "dueAt": iso(future()), **overrides}
    response = client.post(URL, json=payload, headers={**headers, "Idempotency-Key": key})
    assert response.status_code == 201
    return response.get_json()


def test_get_returns_the_payment_with_attempts_oldest_first(client, alice, conn):
    row = insert_payment(
        conn, status="FAILED", attempt=2, failures=2, failure_reason="RETRIES_EXHAUSTED"
    )
    for n, outcome in ((2, "AMBIGUOUS"), (1, "RETRYABLE_ERROR")):
        conn.execute(
            "INSERT INTO attempts (payment_id, attempt, gateway_key, outcome, error_code,"
            " finished_at, due_at) VALUES (%s, %s, %s, %s, 'http_503', now(), %s)",
            (row["id"], n, str(row["id"]), outcome, row["due_at"]),
        )
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


@pytest.mark.parametrize(
    "path_id",
    [
        "not-a-uuid",
        "123",
        "00000000-0000-0000-0000-000000000000",
        "' OR 1=1 --",
        str(uuid.uuid4()),
        str(new_payment_id(datetime(2001, 1, 1, tzinfo=UTC))),
    ],
    # Stable ids, whatever the values: parallel runners must collect the same tests.
    ids=["not-a-uuid", "digits", "nil", "injection", "unknown-uuid4", "unknown-payment-id"],
)
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


def walk(client, headers, **query) -> tuple[list[str], int]:
    """Every page of a list, following nextCursor until it is null: the ids
    in order, and how many pages it took."""
    seen, cursor, pages = [], None, 0
    while True:
        page = client.get(
            URL, headers=headers, query_string={**query, **({"cursor": cursor} if cursor else {})}
        ).get_json()
        pages += 1
        assert len(page["data"]) <= query["limit"]
        seen += [p["id"] for p in page["data"]]
        cursor = page["nextCursor"]
        if cursor is None:
            return seen, pages


def test_list_filters_by_status(client, alice, conn):
    done = create(client, alice, "k0")
    conn.execute("UPDATE payments SET status = 'COMPLETED' WHERE id = %s", (done["id"],))
    for n in range(30):  # more than one page of other statuses to scan past
        create(client, alice, f"p{n}")
    pending = create(client, alice, "k1")
    data = client.get(URL, headers=alice, query_string={"status": "PENDING", "limit": 1}).get_json()
    assert [p["id"] for p in data["data"]] == [pending["id"]]
    assert data["nextCursor"]
    assert walk(client, alice, status="COMPLETED", limit=5) == ([done["id"]], 2)


def test_a_filtered_page_reads_a_bounded_stretch_of_history(client, alice, conn):
    """limit=5 scans FILTERED_SCAN_FACTOR x 5 = 20 keys: a match 31 payments
    back is not on page one, which is empty with a cursor to go on from; the
    next 20 keys reach it and the end of the history."""
    assert payments.FILTERED_SCAN_FACTOR == 4
    done = create(client, alice, "old")
    conn.execute("UPDATE payments SET status = 'COMPLETED' WHERE id = %s", (done["id"],))
    for n in range(30):
        create(client, alice, f"p{n}")
    first = client.get(
        URL, headers=alice, query_string={"status": "COMPLETED", "limit": 5}
    ).get_json()
    assert first["data"] == [] and first["nextCursor"] is not None
    second = client.get(
        URL,
        headers=alice,
        query_string={"status": "COMPLETED", "limit": 5, "cursor": first["nextCursor"]},
    ).get_json()
    assert ([p["id"] for p in second["data"]], second["nextCursor"]) == ([done["id"]], None)


def test_every_filtered_walk_is_exact_over_a_mixed_history(client, alice, bob, conn):
    """Statuses in runs (long stretches with no match, then many at once):
    walking every page of each filter, at several limits, yields exactly the
    payer's payments of that status, newest first, none skipped or repeated."""
    statuses = ["PENDING", "CANCELLED", "COMPLETED", "FAILED"]
    rng = random.Random(13)
    for n in range(90):
        create(client, alice, f"a{n}")
    create(client, bob, "b0")  # another payer's rows are never listed
    order = [
        r["payment_id"]
        for r in conn.execute(
            "SELECT payment_id FROM idempotency_keys WHERE actor = 'alice' "
            "ORDER BY created_at DESC, payment_id DESC"
        )
    ]
    status_of, run_left, current = {}, 0, None
    for payment_id in order:
        if run_left == 0:
            current, run_left = rng.choice(statuses), rng.choice([1, 2, 5, 17, 30])
        status_of[payment_id], run_left = current, run_left - 1
    for status in statuses:
        ids = [i for i, s in status_of.items() if s == status]
        conn.execute(
            "UPDATE payments SET status = %s, failure_reason = %s WHERE id = ANY(%s)",
            (status, "DECLINED" if status == "FAILED" else None, ids),
        )
    for limit in (1, 2, 3, 7, 100):
        assert walk(client, alice, limit=limit)[0] == [str(i) for i in order]
        for status in statuses:
            expected = [str(i) for i in order if status_of[i] == status]
            assert walk(client, alice, status=status, limit=limit)[0] == expected, (status, limit)


@pytest.mark.parametrize(
    "query,field",
    [
        ({"status": "DONE"}, "status"),
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"cursor": "garbage!!"}, "cursor"),
        ({"cursor": "WyJ4IiwgInkiXQ"}, "cursor"),  # base64 of ["x", "y"]
        ({"sort": "amount"}, "sort"),
    ],
)
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

    from paycron.store.events import Position
    from web.events import FeedQuerySchema
    from web.payments import ListQuerySchema

    payments, feed = ListQuerySchema().fields["cursor"], FeedQuerySchema().fields["after"]
    key = (datetime(2031, 2, 3, 4, 5, 6, 789012, tzinfo=UTC), new_payment_id(future()))
    assert payments.decode(payments.encode(key)) == key
    assert feed.decode(feed.encode(Position(2**63 - 1, 7))) == Position(2**63 - 1, 7)
    # The feed's cursor is what clients stored since its first version: txid.id.
    assert feed.encode(Position(12, 5)) == base64.urlsafe_b64encode(b"12.5").decode().rstrip("=")
    for bad in (b"12", b"12.5.1", b"-1.5", b"1.x", str(2**63).encode() + b".1", b"\xff.1"):
        with pytest.raises(ValidationError, match="not a cursor this API returned"):
            feed.decode(base64.urlsafe_b64encode(bad).decode())
    for bad in (
        b"1",
        b"99999999999999999999.1",
        str(2**62).encode() + b".1",  # year 146,000
        b"1." + str(2**128).encode(),
    ):
        with pytest.raises(ValidationError, match="not a cursor this API returned"):
            payments.decode(base64.urlsafe_b64encode(bad).decode())


def test_the_document_says_a_page_may_be_short_before_the_end(client):
    operation = client.get("/openapi.json").get_json()["paths"][URL]["get"]
    text = " ".join([operation["description"], operation["responses"]["200"]["description"]])
    assert f"at most {payments.FILTERED_SCAN_FACTOR} x limit" in text
    assert "even none, while nextCursor is not null" in text
    assert "follow the cursor until it is null" in text
