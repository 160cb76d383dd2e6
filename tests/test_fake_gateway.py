"""The fake gateway, tested as a black box: the real server in a subprocess, httpx as client.

Every promise the engine relies on is checked against `GET /_ledger`, the
gateway's own truth: idempotent replays, serialization per key, magic
amounts, transient faults that are not stored, a charge whose answer is
lost, timeouts, the rate ceiling, lookup by reference, refunds, the
settlement report and key retention.
"""

from __future__ import annotations

import csv
import io
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from devtools.procs import ProcessGroup, free_port, gateway_args, wait_http

REPO_ROOT = Path(__file__).resolve().parents[1]
STARTUP_SECONDS = 15.0
SETTLEMENT_HEADER = "charge_id,idempotency_key,reference,amount,currency,status,created_at"


def _start_gateway(logdir: Path, *args: str) -> tuple[ProcessGroup, str]:
    """Start `python -m gateway.fake` on a free port; return it once /healthz answers."""
    port = free_port()
    group = ProcessGroup(logdir)
    proc = group.start("gateway", [*gateway_args(port), *args])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/healthz", proc, timeout=STARTUP_SECONDS)
    except RuntimeError as exc:
        group.stop()
        pytest.fail(f"gateway did not start: {exc}")
    return group, url


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    group, url = _start_gateway(tmp_path_factory.mktemp("gateway"))
    yield url
    group.stop()


@pytest.fixture
def client(gateway_url: str) -> Iterator[httpx.Client]:
    """A client on a freshly reset gateway."""
    with httpx.Client(base_url=gateway_url, timeout=10) as http:
        http.post("/_reset").raise_for_status()
        yield http


def new_key() -> str:
    return f"key-{uuid.uuid4()}"


def charge(
    http: httpx.Client,
    key: str,
    *,
    amount: int = 1000,
    reference: str = "pay-1",
    currency: str = "USD",
    timeout: float | None = None,
) -> httpx.Response:
    body = {"amount": amount, "currency": currency, "reference": reference}
    extra = {} if timeout is None else {"timeout": timeout}
    return http.post("/v1/charges", json=body, headers={"Idempotency-Key": key}, **extra)


def set_faults(http: httpx.Client, **settings: object) -> dict:
    response = http.post("/_faults", json=settings)
    assert response.status_code == 200, response.text
    return response.json()


def ledger(http: httpx.Client) -> list[dict]:
    return http.get("/_ledger").json()["charges"]


def stats(http: httpx.Client) -> dict:
    return http.get("/_stats").json()


def is_replay(response: httpx.Response) -> bool:
    return response.headers.get("Idempotent-Replayed") == "true"


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
        for name in ("id", "idempotency_key", "reference", "amount", "currency", "status",
                     "created_at")
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
    missing = client.post(
        "/v1/charges", json={"amount": 100, "currency": "USD", "reference": "r"}
    )
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


# ---------------------------------------------------------------- injected faults


def test_server_errors_do_not_charge_and_are_not_stored(client: httpx.Client) -> None:
    set_faults(client, error_rate=1.0)
    key = new_key()
    for _ in range(3):
        response = charge(client, key)
        assert response.status_code in (500, 502, 503)
        assert not is_replay(response)
    assert ledger(client) == []
    assert stats(client)["errors"] == 3

    assert set_faults(client, reset=True)["error_rate"] == 0.0
    retried = charge(client, key)
    assert retried.status_code == 201
    assert not is_replay(retried)
    assert [c["id"] for c in ledger(client)] == [retried.json()["id"]]


def test_random_declines_are_stored_like_real_ones(client: httpx.Client) -> None:
    set_faults(client, decline_rate=1.0)
    key = new_key()
    assert charge(client, key).status_code == 402
    set_faults(client, reset=True)
    replay = charge(client, key)
    assert replay.status_code == 402
    assert is_replay(replay)
    assert ledger(client) == []


def test_charge_then_drop_charges_but_the_client_gets_no_answer(client: httpx.Client) -> None:
    set_faults(client, charge_then_drop_rate=1.0)
    key = new_key()
    with pytest.raises(httpx.RemoteProtocolError):
        charge(client, key, reference="pay-dropped")

    charges = ledger(client)
    assert len(charges) == 1
    assert charges[0]["idempotency_key"] == key
    assert stats(client)["dropped"] == 1

    # Still dropping: a replay is answered from the stored result, not re-processed.
    retried = charge(client, key, reference="pay-dropped")
    assert retried.status_code == 201
    assert is_replay(retried)
    assert retried.json()["id"] == charges[0]["id"]
    assert len(ledger(client)) == 1


def test_timeout_holds_the_key_then_releases_it_without_charging(
    client: httpx.Client,
) -> None:
    set_faults(client, timeout_rate=1.0, timeout_sleep_ms=1500)
    key = new_key()
    with pytest.raises(httpx.ReadTimeout):
        charge(client, key, timeout=0.3)

    during = charge(client, key)
    assert during.status_code == 409
    assert during.json()["error"]["code"] == "idempotency_key_in_use"
    assert ledger(client) == []
    assert stats(client)["timeouts"] == 1

    set_faults(client, reset=True)
    deadline = time.monotonic() + 5
    while (retried := charge(client, key)).status_code == 409:
        assert time.monotonic() < deadline, "the key was never released"
        time.sleep(0.1)
    assert retried.status_code == 201
    assert not is_replay(retried)
    assert [c["id"] for c in ledger(client)] == [retried.json()["id"]]


def test_rate_ceiling_answers_429_and_charges_nothing(client: httpx.Client) -> None:
    set_faults(client, rate_limit_per_s=5)
    keys = [new_key() for _ in range(20)]
    responses = [charge(client, key, reference=f"pay-{i}") for i, key in enumerate(keys)]

    limited = [r for r in responses if r.status_code == 429]
    accepted = [r for r in responses if r.status_code == 201]
    assert len(limited) + len(accepted) == 20
    # A burst this short spans at most two one-second windows.
    assert 5 <= len(accepted) <= 10
    for response in limited:
        assert response.headers["Retry-After"] == "1"
        assert response.json()["error"]["code"] == "rate_limited"
    assert len(ledger(client)) == len(accepted)
    assert stats(client)["rate_limited"] == len(limited)

    # A 429 is not stored: the same key goes through once the window has passed.
    limited_key = keys[responses.index(limited[0])]
    time.sleep(1.1)
    later = charge(client, limited_key, reference=f"pay-{responses.index(limited[0])}")
    assert later.status_code == 201
    assert not is_replay(later)


def test_seeded_faults_are_deterministic(client: httpx.Client) -> None:
    def outcomes() -> list[int]:
        set_faults(client, reset=True, decline_rate=0.5, seed=42)
        return [charge(client, new_key()).status_code for _ in range(20)]

    first = outcomes()
    assert set(first) == {201, 402}
    assert outcomes() == first


@pytest.mark.parametrize(
    "settings",
    [
        {"decline_rate": 1.5},
        {"error_rate": -0.1},
        {"timeout_rate": "0.5"},
        {"charge_then_drop_rate": True},
        {"latency_ms": 1.5},
        {"timeout_sleep_ms": -1},
        {"rate_limit_per_s": -1},
        {"seed": "x"},
        {"reset": "yes"},
        {"unknown_knob": 1},
        {"decline_rate": 0.5, "error_rate": 2},
    ],
)
def test_invalid_fault_settings_are_400_and_change_nothing(
    client: httpx.Client, settings: dict
) -> None:
    before = set_faults(client, decline_rate=0.25)
    response = client.post("/_faults", json=settings)
    assert response.status_code == 400
    assert client.get("/_faults").json() == before


def test_fault_settings_round_trip(client: httpx.Client) -> None:
    settings = set_faults(client, latency_ms=5, rate_limit_per_s=100, timeout_rate=0)
    assert settings["latency_ms"] == 5
    assert settings["rate_limit_per_s"] == 100
    assert client.get("/_faults").json() == settings
    cleared = set_faults(client, reset=True)
    assert cleared["latency_ms"] == 0 and cleared["rate_limit_per_s"] is None


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


def refund(http: httpx.Client, key: str, body: dict) -> httpx.Response:
    return http.post("/v1/refunds", json=body, headers={"Idempotency-Key": key})


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


# ---------------------------------------------------------------- control endpoints


def test_reset_forgets_ledger_keys_faults_and_stats(client: httpx.Client) -> None:
    key = new_key()
    first = charge(client, key).json()
    set_faults(client, latency_ms=10)
    client.post("/_reset").raise_for_status()

    assert ledger(client) == []
    assert client.get("/_faults").json()["latency_ms"] == 0
    assert set(stats(client).values()) == {0}
    again = charge(client, key)
    assert again.status_code == 201 and not is_replay(again)
    assert again.json()["id"] != first["id"]


def test_stats_count_each_outcome(client: httpx.Client) -> None:
    key = new_key()
    charge(client, key)
    charge(client, key)
    charge(client, new_key(), amount=40002)
    charge(client, new_key(), amount=50003)
    counters = stats(client)
    expected = {"charge_requests": 4, "charges": 1, "replays": 1, "declined": 1, "errors": 1,
                "rate_limited": 0, "timeouts": 0, "dropped": 0}
    assert {name: counters[name] for name in expected} == expected
    assert client.get("/healthz").status_code == 200


# ---------------------------------------------------------------- key retention


def test_keys_expire_but_charges_keep_their_reference(tmp_path: Path) -> None:
    group, url = _start_gateway(tmp_path, "--key-retention-seconds", "1")
    try:
        with httpx.Client(base_url=url, timeout=10) as http:
            key = new_key()
            first = charge(http, key, reference="pay-retained")
            assert first.status_code == 201
            assert is_replay(charge(http, key, reference="pay-retained"))

            time.sleep(1.3)
            second = charge(http, key, reference="pay-retained")
            assert second.status_code == 201
            assert not is_replay(second)
            assert second.json()["id"] != first.json()["id"]

            found = http.get("/v1/charges", params={"reference": "pay-retained"}).json()["data"]
            assert [c["id"] for c in found] == [first.json()["id"], second.json()["id"]]
            assert len(ledger(http)) == 2
    finally:
        group.stop()
