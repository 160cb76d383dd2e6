"""/v1/admin/dead-letters: the DLQ tools over HTTP, admin keys only."""

from __future__ import annotations

import pytest

from tests.factories import park
from web import close_app

URL = "/v1/admin/dead-letters"


@pytest.fixture
def admin(make_key) -> dict:
    return {"Authorization": f"Bearer {make_key('ops-ann', admin=True)}"}


@pytest.fixture
def app(config, gateway):  # the admin actions reach the gateway
    from web import create_app

    application = create_app(config)
    yield application
    close_app(application)


def test_a_non_admin_key_sees_nothing_there(client, alice, conn):
    row = park(conn)
    for method, path in (
        ("get", URL),
        ("get", f"{URL}/{row['id']}"),
        ("post", f"{URL}/{row['id']}/redrive"),
        ("post", f"{URL}/{row['id']}/dismiss"),
    ):
        response = getattr(client, method)(path, headers=alice)
        assert response.status_code == 404
    assert conn.execute("SELECT resolution FROM dead_letters").fetchone()["resolution"] is None


def test_list_and_show(client, admin, conn):
    row = park(conn)
    listed = client.get(URL, headers=admin).get_json()["data"]
    assert [d["paymentId"] for d in listed] == [str(row["id"])]
    shown = client.get(f"{URL}/{row['id']}", headers=admin).get_json()
    assert shown["payment"]["status"] == "FAILED"
    assert shown["deadLetters"][0]["reason"] == "RETRIES_EXHAUSTED"
    assert client.get(f"{URL}/not-an-id", headers=admin).status_code == 404


def test_redrive_records_the_operator(client, admin, conn):
    row = park(conn)
    response = client.post(f"{URL}/{row['id']}/redrive", headers=admin)
    assert response.status_code == 200 and response.get_json()["action"] == "redriven"
    letter = conn.execute("SELECT * FROM dead_letters").fetchone()
    assert (letter["resolution"], letter["resolved_by"]) == ("REDRIVEN", "ops-ann")
    again = client.post(f"{URL}/{row['id']}/redrive", headers=admin)
    assert again.status_code == 409
    assert again.get_json()["code"] == "DEAD_LETTER_ACTION_REFUSED"


def test_refund_and_dismiss(client, admin, conn, gateway):
    charged, other = park(conn), park(conn)
    gateway.http.post(
        "/v1/charges",
        headers={"Idempotency-Key": str(charged["id"])},
        json={
            "amount": charged["amount_minor"],
            "currency": "USD",
            "reference": str(charged["id"]),
        },
    ).raise_for_status()
    assert client.post(f"{URL}/{charged['id']}/refund", headers=admin).status_code == 200
    assert gateway.ledger()[0]["status"] == "refunded"
    response = client.post(
        f"{URL}/{other['id']}/dismiss", headers=admin, json={"note": "duplicate of an invoice"}
    )
    assert response.status_code == 200
    rows = {r["payment_id"]: r for r in conn.execute("SELECT * FROM dead_letters")}
    assert rows[charged["id"]]["resolution"] == "REFUNDED"
    assert rows[other["id"]]["note"] == "duplicate of an invoice"
    bad = client.post(f"{URL}/{other['id']}/dismiss", headers=admin, json={"why": "x"})
    assert bad.status_code == 400
