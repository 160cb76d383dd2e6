"""Unencodable text (docs/design.md): JSON may escape a lone surrogate ("\\ud800"),
which no UTF-8 encoder, hash or Postgres text column accepts. Every string
the API takes answers 400 VALIDATION_FAILED naming the field, never a 500,
and nothing is stored."""

from __future__ import annotations

import json

import pytest

from tests.conftest import future, iso
from tests.factories import insert_payment

PAYMENTS = "/v1/scheduled-payments"
LONE = ["\ud800", "\udfff", "shop\ud83d", "\udc00tail"]


def send(client, path: str, payload: dict, headers: dict):
    """POST ``payload`` as JSON exactly as a client would write it: a lone
    surrogate goes on the wire as its escape, ``"\\ud800"``."""
    raw = json.dumps(payload, ensure_ascii=True)
    assert "\\ud8" in raw or "\\udf" in raw or "\\udc" in raw
    return client.post(path, data=raw, content_type="application/json", headers=headers)


def count(conn, table: str) -> int:
    return conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]


def payment(**overrides) -> dict:
    return {"payee": "acme", "amount": 2500, "dueAt": iso(future()), **overrides}


def assert_refused(response, field: str) -> None:
    assert response.status_code == 400, response.get_data(as_text=True)
    problem = response.get_json()
    assert problem["code"] == "VALIDATION_FAILED"
    assert field in problem["errors"], problem


@pytest.mark.parametrize("payee", LONE)
def test_a_lone_surrogate_in_payee_is_a_400(client, alice, conn, payee):
    response = send(client, PAYMENTS, payment(payee=payee), {**alice, "Idempotency-Key": "key-1"})
    assert_refused(response, "payee")
    assert response.get_json()["errors"]["payee"] == [
        "must be valid Unicode text: no unpaired surrogate (U+D800 to U+DFFF)"
    ]
    assert count(conn, "payments") == count(conn, "idempotency_keys") == 0


@pytest.mark.parametrize("field", ["currency", "dueAt"])
def test_a_lone_surrogate_in_another_field_is_a_400(client, alice, conn, field):
    response = send(
        client, PAYMENTS, payment(**{field: "\ud800"}), {**alice, "Idempotency-Key": "key-1"}
    )
    assert_refused(response, field)
    assert count(conn, "payments") == 0


def test_a_lone_surrogate_in_a_key_is_a_400(client, alice, conn):
    response = send(
        client, PAYMENTS, {**payment(), "\ud800": 1}, {**alice, "Idempotency-Key": "key-1"}
    )
    assert response.status_code == 400 and response.get_json()["code"] == "VALIDATION_FAILED"
    assert count(conn, "payments") == 0


def test_a_used_key_with_a_lone_surrogate_is_a_different_body(client, alice, conn):
    """The body is hashed before it is validated (a replay answers even when
    its body no longer validates): the hash must take any JSON text."""
    headers = {**alice, "Idempotency-Key": "key-1"}
    assert client.post(PAYMENTS, json=payment(), headers=headers).status_code == 201
    response = send(client, PAYMENTS, payment(payee="\ud800"), headers)
    assert response.status_code == 409
    assert response.get_json()["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert count(conn, "payments") == 1


def test_a_surrogate_pair_is_ordinary_text(client, alice):
    """The escape of a character outside the BMP is a pair: valid."""
    response = send(
        client, PAYMENTS, payment(payee="caf\ud83d\ude00"), {**alice, "Idempotency-Key": "key-1"}
    )
    assert response.status_code == 201
    assert response.get_json()["payee"] == "caf\U0001f600"


def test_a_lone_surrogate_in_a_webhook_url_is_a_400(client, alice, conn):
    response = send(client, "/v1/webhook-endpoints", {"url": "http://hooks.example/\ud800"}, alice)
    assert_refused(response, "url")
    assert count(conn, "webhook_endpoints") == 0


def test_a_lone_surrogate_in_a_dismiss_note_is_a_400(client, make_key, conn):
    admin = {"Authorization": f"Bearer {make_key('ops-ann', admin=True)}"}
    row = insert_payment(conn, status="FAILED", failure_reason="RETRIES_EXHAUSTED", attempt=6)
    conn.execute(
        "INSERT INTO dead_letters (payment_id, due_at, payer, reason) "
        "VALUES (%s, %s, %s, 'RETRIES_EXHAUSTED')",
        (row["id"], row["due_at"], row["payer"]),
    )
    response = send(
        client, f"/v1/admin/dead-letters/{row['id']}/dismiss", {"note": "gone \ud800"}, admin
    )
    assert_refused(response, "note")
    assert conn.execute("SELECT resolution FROM dead_letters").fetchone()["resolution"] is None
