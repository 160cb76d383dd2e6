"""Throughput of the fake gateway: N charges, each under its own idempotency key.

Starts `python -m gateway.fake` on a free port (or uses `--url`), fires the
charges from a pool of threads, each with its own keep-alive httpx client,
and prints requests/s, the answers by status, and the server's CPU use.
httpx costs more CPU per request than the server does, so one client process
is usually the bottleneck: `--processes` spreads the threads over several
processes, and the server's CPU figure tells what one server core can take
whatever the client manages.

    python bench/gateway_throughput.py [--requests 20000] [--threads 16] [--processes 1]
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_gateway() -> tuple[subprocess.Popen[bytes], str]:
    """The fake gateway on a free port, once it answers /healthz."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.fake", "--port", str(port)],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the gateway did not start")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def fire(url: str, first: int, total: int, threads: int) -> Counter[int]:
    """Send charges `first`..`first + total - 1` from `threads` keep-alive clients.

    Returns the count of answers by HTTP status.
    """
    tickets = itertools.count(first)
    last = first + total
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    run = uuid.uuid4().hex[:8]

    def worker() -> None:
        local: Counter[int] = Counter()
        with httpx.Client(base_url=url, timeout=30) as http:
            while (n := next(tickets)) < last:
                response = http.post(
                    "/v1/charges",
                    json={"amount": 1000 + n % 100, "currency": "USD", "reference": f"bench-{n}"},
                    headers={"Idempotency-Key": f"bench-{run}-{n}"},
                )
                local[response.status_code] += 1
        with lock:
            statuses.update(local)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return statuses


def fire_all(url: str, total: int, threads: int, processes: int) -> tuple[float, Counter[int]]:
    """Send `total` charges from `processes` processes of `threads` threads; (seconds, statuses)."""
    shares = [total // processes + (i < total % processes) for i in range(processes)]
    firsts = list(itertools.accumulate([0, *shares[:-1]]))
    started = time.perf_counter()
    if processes == 1:
        statuses = fire(url, 0, total, threads)
    else:
        with multiprocessing.Pool(processes) as pool:
            jobs = [(url, f, n, threads) for f, n in zip(firsts, shares, strict=True)]
            parts = pool.starmap(fire, jobs)
        statuses = sum(parts, Counter())
    return time.perf_counter() - started, statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=16, help="threads per process")
    parser.add_argument("--processes", type=int, default=1, help="client processes")
    parser.add_argument("--url", help="an already running gateway (default: start one)")
    args = parser.parse_args()

    proc, url = (None, args.url) if args.url else start_gateway()
    try:
        httpx.post(f"{url}/_reset").raise_for_status()
        cpu_before = cpu_seconds(proc.pid) if proc else None
        elapsed, statuses = fire_all(url, args.requests, args.threads, args.processes)
        rate = args.requests / elapsed
        print(f"{args.requests} charges, {args.processes} x {args.threads} threads: "
              f"{elapsed:.2f} s, {rate:,.0f} requests/s")
        print(f"answers: {dict(sorted(statuses.items()))}")
        if proc:
            busy = (cpu_seconds(proc.pid) - cpu_before) / elapsed
            print(f"server CPU: {busy:.0%} of one core "
                  f"(about {rate / busy:,.0f} requests/s per fully used core)")
        ledger = httpx.get(f"{url}/_ledger", timeout=30).json()["charges"]
        print(f"ledger: {len(ledger)} charges")
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
