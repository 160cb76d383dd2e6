"""Injected faults, black box: transient answers are not stored, a lost answer
still charged, timeouts hold the key, the rate ceiling, seeded dice, and the
latency distribution (checked through the latency each answer reports)."""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

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
    ("settings", "named"),
    [
        ({"decline_rate": 1.5}, "decline_rate"),
        ({"error_rate": -0.1}, "error_rate"),
        ({"timeout_rate": "0.5"}, "timeout_rate"),
        ({"charge_then_drop_rate": True}, "charge_then_drop_rate"),
        ({"latency_ms": 1.5}, "latency_ms"),
        ({"timeout_sleep_ms": -1}, "timeout_sleep_ms"),
        ({"rate_limit_per_s": -1}, "rate_limit_per_s"),
        ({"seed": "x"}, "seed"),
        ({"reset": "yes"}, "reset"),
        ({"unknown_knob": 1}, "unknown_knob"),
        ({"decline_rate": 0.5, "error_rate": 2}, "error_rate"),
        ({"latency_dist": "normal"}, "latency_dist"),
        ({"latency_dist": "lognormal"}, "latency_p50_ms"),
        ({"latency_dist": "lognormal", "latency_p50_ms": 100}, "latency_p99_ms"),
        ({"latency_p50_ms": 0}, "latency_p50_ms"),
        ({"latency_p50_ms": 2.5}, "latency_p50_ms"),
        ({"latency_p99_ms": "300"}, "latency_p99_ms"),
        ({"latency_cap_ms": -1}, "latency_cap_ms"),
        ({"latency_p50_ms": 300, "latency_p99_ms": 100}, "latency_p99_ms"),
        (
            {
                "latency_dist": "lognormal",
                "latency_p50_ms": 100,
                "latency_p99_ms": 300,
                "latency_cap_ms": 200,
            },
            "latency_cap_ms",
        ),
    ],
)
def test_invalid_fault_settings_are_400_and_change_nothing(
    client: httpx.Client, settings: dict, named: str
) -> None:
    before = set_faults(client, decline_rate=0.25)
    response = client.post("/_faults", json=settings)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert named in error["message"]
    assert client.get("/_faults").json() == before


def test_latency_settings_are_checked_together_with_the_current_ones(
    client: httpx.Client,
) -> None:
    set_faults(client, latency_p50_ms=100, latency_p99_ms=400)
    # Each change alone is well formed; the settings they would make are not.
    assert client.post("/_faults", json={"latency_cap_ms": 300}).status_code == 400
    assert client.post("/_faults", json={"latency_p50_ms": 500}).status_code == 400
    on = set_faults(client, latency_dist="lognormal")
    assert (on["latency_p50_ms"], on["latency_p99_ms"]) == (100, 400)
    # Cleared while in use, the distribution would be undefined.
    assert client.post("/_faults", json={"latency_p99_ms": None}).status_code == 400
    assert client.get("/_faults").json() == on


def test_fault_settings_round_trip(client: httpx.Client) -> None:
    settings = set_faults(client, latency_ms=5, rate_limit_per_s=100, timeout_rate=0)
    assert settings["latency_ms"] == 5
    assert settings["rate_limit_per_s"] == 100
    assert client.get("/_faults").json() == settings
    cleared = set_faults(client, reset=True)
    assert cleared["latency_ms"] == 0 and cleared["rate_limit_per_s"] is None


# ---------------------------------------------------------------- latency


LATENCY_HEADER = "Fake-Latency-Ms"


def timed_charges(http: httpx.Client, count: int, threads: int) -> list[tuple[float, float]]:
    """`count` fresh charges from `threads` callers: (reported latency s, measured s) each.

    Each caller has a client of its own: 32 threads sharing one httpx client
    once met a connection another thread's pool bookkeeping had closed
    (``ReadError: Bad file descriptor``), a race in the client, not the fake."""
    local = threading.local()
    clients: list[httpx.Client] = []

    def call(_: int) -> tuple[float, float]:
        if not hasattr(local, "http"):
            local.http = httpx.Client(base_url=http.base_url, timeout=http.timeout)
            clients.append(local.http)
        started = time.perf_counter()
        response = charge(local.http, new_key())
        elapsed = time.perf_counter() - started
        assert response.status_code == 201, response.text
        return float(response.headers[LATENCY_HEADER]) / 1000, elapsed

    try:
        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(call, range(count)))
    finally:
        for client in clients:
            client.close()


def test_lognormal_latency_has_the_asked_median_and_tail(client: httpx.Client) -> None:
    # The latency dice are seeded and thrown once per request on arrival, so
    # the values drawn are the same whatever order the requests come in:
    # these quantiles are exact for this seed, not a timing measurement.
    set_faults(client, seed=5, latency_dist="lognormal", latency_p50_ms=20, latency_p99_ms=80)
    samples = timed_charges(client, count=1000, threads=32)

    drawn = [reported for reported, _ in samples]
    cuts = statistics.quantiles(drawn, n=100)
    assert cuts[49] == pytest.approx(0.020, rel=0.10)
    assert cuts[98] == pytest.approx(0.080, rel=0.20)
    # The server really waited what it reports (a little slack for the clocks).
    assert all(measured >= reported - 0.001 for reported, measured in samples)

    set_faults(client, seed=5)
    again = [reported for reported, _ in timed_charges(client, count=1000, threads=32)]
    assert sorted(again) == sorted(drawn)


def test_fixed_latency_is_waited_and_reported_on_fresh_answers_only(
    client: httpx.Client,
) -> None:
    instant = charge(client, new_key())
    assert LATENCY_HEADER not in instant.headers

    set_faults(client, latency_ms=30)
    key = new_key()
    started = time.perf_counter()
    first = charge(client, key)
    assert time.perf_counter() - started >= 0.030
    assert first.headers[LATENCY_HEADER] == "30.000"
    replay = charge(client, key)
    assert is_replay(replay)
    assert LATENCY_HEADER not in replay.headers

    set_faults(client, decline_rate=1.0)
    assert charge(client, new_key()).headers[LATENCY_HEADER] == "30.000"


def test_a_latency_distribution_leaves_the_seeds_faults_as_they_were(
    client: httpx.Client,
) -> None:
    def outcomes(**latency: object) -> list[int]:
        set_faults(client, reset=True, decline_rate=0.5, error_rate=0.2, seed=42, **latency)
        return [charge(client, new_key()).status_code for _ in range(30)]

    instant = outcomes()
    assert {201, 402} <= set(instant)
    assert outcomes(latency_dist="lognormal", latency_p50_ms=1, latency_p99_ms=3) == instant
