"""Real processes for tests: the fake gateway, workers, schedulers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(args: list[str], *, log_path: Path, env: dict | None = None) -> subprocess.Popen:
    """Start ``python <args>`` from the repository root, output to ``log_path``."""
    with log_path.open("ab") as log:
        return subprocess.Popen([sys.executable, *args], cwd=REPO_ROOT, stdout=log,
                                stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                start_new_session=True)


def wait_http(url: str, proc: subprocess.Popen, *, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode} at start-up")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer in {timeout}s")


def stop(proc: subprocess.Popen, *, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Stop a process and everything it started (its own session)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


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
