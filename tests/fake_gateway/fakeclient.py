"""Driving the fake gateway over HTTP: the helpers its black-box tests share."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from devtools.procs import ProcessGroup, free_port, gateway_args, wait_http

STARTUP_SECONDS = 15.0


def start_gateway(logdir: Path, *args: str) -> tuple[ProcessGroup, str]:
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


def refund(http: httpx.Client, key: str, body: dict) -> httpx.Response:
    return http.post("/v1/refunds", json=body, headers={"Idempotency-Key": key})


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
