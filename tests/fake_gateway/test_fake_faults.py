"""Injected faults, black box: transient answers are not stored, a lost answer
still charged, timeouts hold the key, the rate ceiling and seeded dice."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.fake_gateway.fakeclient import (
    charge,
    is_replay,
    ledger,
    new_key,
    set_faults,
    stats,
)

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
