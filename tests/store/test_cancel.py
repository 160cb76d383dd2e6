"""DELETE is a compare-and-swap on status: it wins or honestly loses."""

from __future__ import annotations

import threading

import pytest

from paycron.config import Config
from paycron.store import transitions
from paycron.store.db import connect
from tests.factories import insert_payment
from tests.rows import event_types as events

URL = "/v1/scheduled-payments"


def test_cancel_a_pending_payment(client, alice, conn):
    row = insert_payment(conn)
    response = client.delete(f"{URL}/{row['id']}", headers=alice)
    assert response.status_code == 200
    assert response.get_json() == {"id": str(row["id"]), "status": "CANCELLED"}
    assert conn.execute("SELECT status FROM payments").fetchone()["status"] == "CANCELLED"
    assert events(conn, row["id"]) == ["payment.cancelled"]
    # cancelling again is a 200 too, and writes nothing new
    assert client.delete(f"{URL}/{row['id']}", headers=alice).status_code == 200
    assert events(conn, row["id"]) == ["payment.cancelled"]


@pytest.mark.parametrize(
    "status,code",
    [
        ("PROCESSING", "ALREADY_PROCESSING"),
        ("COMPLETED", "ALREADY_COMPLETED"),
        ("FAILED", "ALREADY_FAILED"),
    ],
)
def test_cancel_refused_by_status(client, alice, conn, status, code):
    row = insert_payment(conn, status=status)
    response = client.delete(f"{URL}/{row['id']}", headers=alice)
    assert response.status_code == 409
    assert response.get_json()["code"] == code
    assert conn.execute("SELECT status FROM payments").fetchone()["status"] == status
    assert events(conn, row["id"]) == []


def test_a_payment_in_doubt_cannot_be_cancelled(client, alice, conn):
    row = insert_payment(conn, in_doubt=True, attempt=1, failures=1)
    response = client.delete(f"{URL}/{row['id']}", headers=alice)
    assert response.status_code == 409
    assert response.get_json()["code"] == "OUTCOME_IN_DOUBT"
    assert conn.execute("SELECT status FROM payments").fetchone()["status"] == "PENDING"


def _race_round(setup, claimer, cancellers, per_round) -> tuple[list, dict]:
    """Insert due rows, then claim them while 4 connections cancel them."""
    rows = [insert_payment(setup) for _ in range(per_round)]
    answers: dict = {}
    barrier = threading.Barrier(len(cancellers) + 1)

    def cancel_some(conn, mine):
        barrier.wait()
        for row in mine:
            answers[row["id"]] = transitions.cancel(conn, row["id"], actor="alice").value

    def claim():
        barrier.wait()
        transitions.claim_due(claimer, limit=per_round, lease_seconds=60)

    threads = [threading.Thread(target=claim)] + [
        threading.Thread(target=cancel_some, args=(c, rows[i :: len(cancellers)]))
        for i, c in enumerate(cancellers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rows, answers


def test_cancel_and_claim_race_one_winner(database_url):
    """Run the real claim SQL against concurrent cancels, many rounds: never
    both, and cancel's answer always matches the final row."""
    config = Config(database_url=database_url)
    tally = {"CANCELLED": 0, "ALREADY_PROCESSING": 0}
    expected = {"CANCELLED": "CANCELLED", "ALREADY_PROCESSING": "PROCESSING"}
    with connect(config) as setup, connect(config) as claimer:
        cancellers = [connect(config) for _ in range(4)]
        try:
            for _ in range(40):
                rows, answers = _race_round(setup, claimer, cancellers, per_round=25)
                final = {
                    r["id"]: r["status"]
                    for r in setup.execute(
                        "SELECT id, status FROM payments WHERE id = ANY(%s)",
                        ([r["id"] for r in rows],),
                    )
                }
                for row in rows:
                    tally[answers[row["id"]]] += 1
                    assert final[row["id"]] == expected[answers[row["id"]]]
                    kinds = events(setup, row["id"])
                    assert kinds in (["payment.cancelled"], ["payment.processing"])
                setup.execute("DELETE FROM payments")
                setup.execute("DELETE FROM payment_events")
        finally:
            for c in cancellers:
                c.close()
    # both orders really happened, so both branches were checked
    assert tally["CANCELLED"] > 0 and tally["ALREADY_PROCESSING"] > 0, tally
