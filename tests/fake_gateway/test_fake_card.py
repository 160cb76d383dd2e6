"""The card surface, black box: the real server in a subprocess, httpx as client.

Every promise the engine relies on is checked against `GET /_ledger`, the
gateway's own truth: idempotent replays, serialization per key, magic
amounts, lookup by reference, refunds and the settlement report.
"""

from __future__ import annotations

import csv
import io
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.fake_gateway.fakeclient import (
    charge,
    is_replay,
    ledger,
    new_key,
    refund,
    set_faults,
    stats,
)

SETTLEMENT_HEADER = "charge_id,idempotency_key,reference,amount,currency,status,created_at"


# ---------------------------------------------------------------- charges


def test_charge_then_replay_returns_the_same_charge_once(client: httpx.Client) -> None:
    key = new_key()
    first = charge(client, key, amount=2500, reference="pay-a")
    assert first.status_code == 201
    body = first.json()
    assert body["id"].startswith("ch_")
    assert body["status"] == "succeeded"
    assert (body["amount"], body["currency"], body["reference"]) == (2500, "USD", "pay-a")
    assert body["idempotency_key"] == key
    assert body["created_at"].endswith("+00:00")
    assert not is_replay(first)

    second = charge(client, key, amount=2500, reference="pay-a")
    assert second.status_code == 201
    assert is_replay(second)
    assert second.json() == body

    assert [c["id"] for c in ledger(client)] == [body["id"]]
    assert ledger(client)[0] == {
        name: body[name]
        for name in (
            "id",
            "idempotency_key",
            "reference",
            "amount",
            "currency",
            "status",
            "created_at",
        )
    }
    assert stats(client)["charges"] == 1
    assert stats(client)["replays"] == 1


@pytest.mark.parametrize(
    "change", [{"amount": 1001}, {"reference": "pay-other"}, {"currency": "EUR"}]
)
def test_same_key_with_a_different_body_is_422(client: httpx.Client, change: dict) -> None:
    key = new_key()
    assert charge(client, key).status_code == 201
    response = charge(client, key, **change)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "idempotency_key_mismatch"
    assert len(ledger(client)) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"amount": 0, "currency": "USD", "reference": "r"},
        {"amount": -5, "currency": "USD", "reference": "r"},
        {"amount": 25.0, "currency": "USD", "reference": "r"},
        {"amount": "25", "currency": "USD", "reference": "r"},
        {"amount": True, "currency": "USD", "reference": "r"},
        {"amount": None, "currency": "USD", "reference": "r"},
        {"currency": "USD", "reference": "r"},
        {"amount": 25, "currency": "usd", "reference": "r"},
        {"amount": 25, "reference": "r"},
        {"amount": 25, "currency": "USD"},
        {"amount": 25, "currency": "USD", "reference": ""},
        {"amount": 25, "currency": "USD", "reference": 7},
        [25],
    ],
)
def test_invalid_charge_bodies_are_400(client: httpx.Client, body: object) -> None:
    response = client.post("/v1/charges", json=body, headers={"Idempotency-Key": new_key()})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert ledger(client) == []


def test_malformed_json_and_missing_key_are_400(client: httpx.Client) -> None:
    garbled = client.post(
        "/v1/charges", content=b"{not json", headers={"Idempotency-Key": new_key()}
    )
    assert garbled.status_code == 400
    missing = client.post("/v1/charges", json={"amount": 100, "currency": "USD", "reference": "r"})
    assert missing.status_code == 400
    assert missing.json()["error"]["code"] == "invalid_request"
    assert ledger(client) == []


def test_concurrent_requests_with_one_key_charge_once(client: httpx.Client) -> None:
    set_faults(client, latency_ms=400)
    key = new_key()
    callers = 8
    barrier = threading.Barrier(callers)

    def call() -> httpx.Response:
        barrier.wait()
        return charge(client, key, reference="pay-concurrent")

    with ThreadPoolExecutor(callers) as pool:
        responses = list(pool.map(lambda _: call(), range(callers)))

    fresh = [r for r in responses if r.status_code == 201 and not is_replay(r)]
    assert len(fresh) == 1
    charge_id = fresh[0].json()["id"]
    for response in responses:
        if response is fresh[0]:
            continue
        if response.status_code == 409:
            assert response.json()["error"]["code"] == "idempotency_key_in_use"
        else:
            assert response.status_code == 201 and is_replay(response)
            assert response.json()["id"] == charge_id
    assert any(r.status_code == 409 for r in responses)
    assert [c["id"] for c in ledger(client)] == [charge_id]


# ---------------------------------------------------------------- magic amounts


def test_magic_decline_is_terminal_and_replayed(client: httpx.Client) -> None:
    set_faults(client, error_rate=1.0)  # magic amounts ignore the faults
    key = new_key()
    first = charge(client, key, amount=40002)
    assert first.status_code == 402
    assert first.json()["error"]["code"] == "card_declined"
    assert first.json()["error"]["type"] == "card_error"
    again = charge(client, key, amount=40002)
    assert again.status_code == 402
    assert is_replay(again)
    assert again.json() == first.json()
    assert ledger(client) == []
    assert stats(client)["declined"] == 1


def test_magic_unavailable_is_503_and_not_stored(client: httpx.Client) -> None:
    set_faults(client, decline_rate=1.0)  # magic amounts ignore the faults
    key = new_key()
    for _ in range(2):
        response = charge(client, key, amount=50003)
        assert response.status_code == 503
        assert not is_replay(response)
    assert ledger(client) == []
    assert stats(client)["replays"] == 0


# ---------------------------------------------------------------- lookups


def test_lookup_by_reference_and_by_id(client: httpx.Client) -> None:
    first = charge(client, new_key(), reference="pay-lookup").json()
    second = charge(client, new_key(), reference="pay-lookup").json()
    charge(client, new_key(), reference="pay-elsewhere")

    found = client.get("/v1/charges", params={"reference": "pay-lookup"})
    assert found.status_code == 200
    assert [c["id"] for c in found.json()["data"]] == [first["id"], second["id"]]
    assert client.get("/v1/charges", params={"reference": "pay-none"}).json() == {"data": []}
    assert client.get("/v1/charges").status_code == 400

    by_id = client.get(f"/v1/charges/{first['id']}")
    assert by_id.status_code == 200
    assert by_id.json() == first
    missing = client.get("/v1/charges/ch_doesnotexist")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "resource_missing"


# ---------------------------------------------------------------- refunds


def test_refund_flow(client: httpx.Client) -> None:
    charged = charge(client, new_key(), amount=1200, reference="pay-refund").json()
    refund_key = f"refund:{charged['reference']}"

    first = refund(client, refund_key, {"charge": charged["id"]})
    assert first.status_code == 201
    body = first.json()
    assert body["id"].startswith("re_")
    assert (body["charge"], body["amount"], body["status"]) == (charged["id"], 1200, "succeeded")

    replay = refund(client, refund_key, {"charge": charged["id"]})
    assert replay.status_code == 201 and is_replay(replay)
    assert replay.json() == body

    again = refund(client, new_key(), {"charge": charged["id"]})
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "charge_already_refunded"

    after = client.get(f"/v1/charges/{charged['id']}").json()
    assert after["status"] == "refunded"
    assert after["refunded_at"]
    assert [c["status"] for c in ledger(client)] == ["refunded"]


def test_refund_errors(client: httpx.Client) -> None:
    charged = charge(client, new_key(), amount=500).json()
    assert refund(client, new_key(), {"charge": "ch_unknown"}).status_code == 404
    assert refund(client, new_key(), {"charge": charged["id"], "amount": 501}).status_code == 400
    assert refund(client, new_key(), {"charge": charged["id"], "amount": 1.5}).status_code == 400
    assert refund(client, new_key(), {}).status_code == 400
    missing_key = client.post("/v1/refunds", json={"charge": charged["id"]})
    assert missing_key.status_code == 400

    key = new_key()
    partial = refund(client, key, {"charge": charged["id"], "amount": 200})
    assert partial.status_code == 201 and partial.json()["amount"] == 200
    mismatch = refund(client, key, {"charge": charged["id"], "amount": 300})
    assert mismatch.status_code == 422


# ---------------------------------------------------------------- settlement report


def test_settlement_report_lists_the_days_charges(client: httpx.Client) -> None:
    kept = charge(client, new_key(), amount=700, reference="pay-s1").json()
    refunded = charge(client, new_key(), amount=800, reference="pay-s2").json()
    refund(client, new_key(), {"charge": refunded["id"]})
    charge(client, new_key(), amount=40002, reference="pay-s3")  # declined: not a charge

    day = kept["created_at"][:10]
    response = client.get("/v1/settlement-report", params={"date": day})
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/csv")
    assert response.text.splitlines()[0] == SETTLEMENT_HEADER
    rows = {row["charge_id"]: row for row in csv.DictReader(io.StringIO(response.text))}
    expected = {c["id"] for c in ledger(client) if c["created_at"].startswith(day)}
    assert set(rows) == expected
    assert rows[kept["id"]] == {
        "charge_id": kept["id"],
        "idempotency_key": kept["idempotency_key"],
        "reference": "pay-s1",
        "amount": "700",
        "currency": "USD",
        "status": "succeeded",
        "created_at": kept["created_at"],
    }
    if refunded["id"] in rows:
        assert rows[refunded["id"]]["status"] == "refunded"

    empty = client.get("/v1/settlement-report", params={"date": "2001-01-01"})
    assert empty.text.splitlines() == [SETTLEMENT_HEADER]


@pytest.mark.parametrize("bad", ["2024-13-01", "2024-02-30", "yesterday", "20240101", ""])
def test_settlement_report_rejects_bad_dates(client: httpx.Client, bad: str) -> None:
    response = client.get("/v1/settlement-report", params={"date": bad})
    assert response.status_code == 400
    assert client.get("/v1/settlement-report").status_code == 400
