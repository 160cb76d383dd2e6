"""Test-side handles on real processes: the fake gateway's controls."""

from __future__ import annotations

import httpx

from paycron.procs import ProcessGroup, free_port, stop, wait_http

__all__ = ["GatewayHandle", "ProcessGroup", "free_port", "stop", "wait_http"]


class GatewayHandle:
    """The fake gateway's test controls, over HTTP."""

    def __init__(self, url: str):
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=10)

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
        counts: dict[str, int] = {}
        for charge in self.ledger():
            counts[charge["idempotency_key"]] = counts.get(charge["idempotency_key"], 0) + 1
        return counts
