"""A handle on a running fake gateway (``gateway.fake``): its test
controls over HTTP, for the tests, the benchmarks and the demo."""

from __future__ import annotations

import httpx


def charges_per_key(ledger: list[dict]) -> dict[str, int]:
    """How many charges the gateway holds for each idempotency key."""
    counts: dict[str, int] = {}
    for charge in ledger:
        counts[charge["idempotency_key"]] = counts.get(charge["idempotency_key"], 0) + 1
    return counts


class GatewayHandle:
    """The fake gateway's controls: faults, counters, the ledger, reset."""

    def __init__(self, url: str, *, timeout: float = 10):
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=timeout)

    def reset(self) -> None:
        self.http.post("/_reset").raise_for_status()

    def faults(self, **settings) -> dict:
        response = self.http.post("/_faults", json=settings)
        response.raise_for_status()
        return response.json()

    def ledger(self) -> list[dict]:
        return self.http.get("/_ledger").json()["charges"]

    def stats(self) -> dict:
        return self.http.get("/_stats").json()

    def charges_per_key(self) -> dict[str, int]:
        return charges_per_key(self.ledger())

    def charge(self, row: dict, *, amount: int | None = None, currency: str = "USD",
               key: str | None = None) -> dict:
        """Charge for payment ``row`` as a caller other than our worker would
        (a zombie, a lost answer): keyed by its id unless ``key`` is given."""
        response = self.http.post(
            "/v1/charges", headers={"Idempotency-Key": key or str(row["id"])},
            json={"amount": amount or row["amount_minor"], "currency": currency,
                  "reference": str(row["id"])})
        if response.status_code != 201:  # a replay (200) or a refusal: no new charge
            raise RuntimeError(f"no charge made: {response.status_code} {response.text}")
        return response.json()

    def close(self) -> None:
        self.http.close()
