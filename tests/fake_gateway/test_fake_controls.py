"""The test controls and the command line's key retention, black box."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.fake_gateway.fakeclient import (
    charge,
    is_replay,
    ledger,
    new_key,
    set_faults,
    start_gateway,
    stats,
)

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
    expected = {
        "charge_requests": 4,
        "charges": 1,
        "replays": 1,
        "declined": 1,
        "errors": 1,
        "rate_limited": 0,
        "timeouts": 0,
        "dropped": 0,
    }
    assert {name: counters[name] for name in expected} == expected
    assert client.get("/healthz").status_code == 200


def test_stats_count_the_charges_answered_at_once(client: httpx.Client) -> None:
    """What a client really had in flight, whatever it counts itself: three
    charges sent together are three at once, none once they are answered."""
    set_faults(client, latency_ms=300)
    base = str(client.base_url)

    def one(_):
        with httpx.Client(base_url=base) as own:
            return charge(own, new_key()).status_code

    with ThreadPoolExecutor(max_workers=3) as pool:
        assert list(pool.map(one, range(3))) == [201, 201, 201]
    charge(client, new_key())
    counters = stats(client)
    assert (counters["charges_in_progress_max"], counters["charges_in_progress"]) == (3, 0)


# ---------------------------------------------------------------- key retention


def test_keys_expire_but_charges_keep_their_reference(tmp_path: Path) -> None:
    group, url = start_gateway(tmp_path, "--key-retention-seconds", "1")
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
