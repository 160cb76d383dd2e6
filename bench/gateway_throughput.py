"""Throughput of the fake gateway: N charges, each under its own idempotency key.

`--surface stripe` sends them to the Stripe-shaped surface instead (form-encoded
payment intents, confirmed at once, as the official SDK sends them, without
the SDK's own client-side cost), and prints the server's memory per payment.

Starts `python -m gateway.fake` on a free port (or uses `--url`), fires the
charges from a pool of threads, each with its own keep-alive httpx client,
and prints requests/s, the answers by status, and the server's CPU use.
httpx costs more CPU per request than the server does, so one client process
is usually the bottleneck: `--processes` spreads the threads over several
processes, and the server's CPU figure tells what one server core can take
whatever the client manages.

    python bench/gateway_throughput.py [--requests 20000] [--threads 16] [--processes 1]
                                       [--surface card|stripe]
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

from bench.harness import parse_args

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


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def card_charge(http: httpx.Client, n: int, key: str) -> httpx.Response:
    return http.post(
        "/v1/charges",
        headers={"Idempotency-Key": key},
        json={"amount": 1000 + n % 100, "currency": "USD", "reference": f"bench-{n}"},
    )


def stripe_charge(http: httpx.Client, n: int, key: str) -> httpx.Response:
    return http.post(
        "/stripe/v1/payment_intents",
        headers={
            "Idempotency-Key": key,
            "Authorization": "Bearer sk_test_paycron",
            "Stripe-Version": "2026-10-28.endive",
        },
        data={
            "amount": str(1000 + n % 100),
            "currency": "usd",
            "customer": f"cus_{n % 1000}",
            "payment_method": "pm_card_visa",
            "confirm": "true",
            "off_session": "true",
            "metadata[paycron_payment_id]": f"bench-{n}",
        },
    )


SURFACES = {"card": card_charge, "stripe": stripe_charge}


def fire(url: str, first: int, total: int, threads: int, surface: str = "card") -> Counter[int]:
    """Send charges `first`..`first + total - 1` from `threads` keep-alive clients.

    Returns the count of answers by HTTP status.
    """
    tickets = itertools.count(first)
    last = first + total
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    run = uuid.uuid4().hex[:8]
    send = SURFACES[surface]

    def worker() -> None:
        local: Counter[int] = Counter()
        with httpx.Client(base_url=url, timeout=30) as http:
            while (n := next(tickets)) < last:
                response = send(http, n, f"bench-{run}-{n}")
                local[response.status_code] += 1
        with lock:
            statuses.update(local)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return statuses


def fire_all(
    url: str, total: int, threads: int, processes: int, surface: str
) -> tuple[float, Counter[int]]:
    """Send `total` charges from `processes` processes of `threads` threads; (seconds, statuses)."""
    shares = [total // processes + (i < total % processes) for i in range(processes)]
    firsts = list(itertools.accumulate([0, *shares[:-1]]))
    started = time.perf_counter()
    if processes == 1:
        statuses = fire(url, 0, total, threads, surface)
    else:
        with multiprocessing.Pool(processes) as pool:
            jobs = [(url, f, n, threads, surface) for f, n in zip(firsts, shares, strict=True)]
            parts = pool.starmap(fire, jobs)
        statuses = sum(parts, Counter())
    return time.perf_counter() - started, statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=16, help="threads per process")
    parser.add_argument("--processes", type=int, default=1, help="client processes")
    parser.add_argument("--url", help="an already running gateway (default: start one)")
    parser.add_argument("--surface", choices=sorted(SURFACES), default="card")
    args = parse_args(parser, requests=200, threads=4)

    proc, url = (None, args.url) if args.url else start_gateway()
    try:
        httpx.post(f"{url}/_reset").raise_for_status()
        cpu_before = cpu_seconds(proc.pid) if proc else None
        rss_before = rss_bytes(proc.pid) if proc else None
        elapsed, statuses = fire_all(url, args.requests, args.threads, args.processes, args.surface)
        rate = args.requests / elapsed
        print(
            f"{args.requests} {args.surface} charges, {args.processes} x {args.threads} threads: "
            f"{elapsed:.2f} s, {rate:,.0f} requests/s"
        )
        print(f"answers: {dict(sorted(statuses.items()))}")
        if proc:
            busy = (cpu_seconds(proc.pid) - cpu_before) / elapsed
            print(
                f"server CPU: {busy:.0%} of one core "
                f"(about {rate / busy:,.0f} requests/s per fully used core)"
            )
            grown = rss_bytes(proc.pid) - (rss_before or 0)
            print(
                f"server memory: +{grown / 2**20:.0f} MiB, "
                f"{grown / args.requests / 1024:.1f} KiB per charge"
            )
        ledger = httpx.get(f"{url}/_ledger", timeout=60).json()
        if args.surface == "stripe":
            print(
                f"ledger: {len(ledger['stripe']['payment_intents'])} intents, "
                f"{len(ledger['stripe']['charges'])} charges"
            )
        else:
            print(f"ledger: {len(ledger['charges'])} charges")
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
