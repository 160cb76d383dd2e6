"""Batch create: payments created per second through
``POST /v1/scheduled-payments/batch``, beside single creates at saturation
and beside the raw COPY floor, in one run on this machine.

1. COPY floor: the rows a create writes (payment, idempotency key,
   ``payment.created`` event), ``--batch-size`` per transaction, COPYed by
   one client straight into Postgres: no HTTP, no validation.
2. Single creates at saturation: ``wrk`` on the Procfile's web, as
   ``bench.api_saturation`` measures them.
3. The import: one client sends ``--payments`` payments, all due at one
   instant (a month's subscriptions at 00:00 on the 1st), in batches of
   ``--batch-size`` (``--connections`` requests in flight: 1 by default, a
   client that sends a batch once the last one is answered, as
   examples/batch_import.py does; with 2 the web checks one batch while
   Postgres writes the other), each batch on a new TCP connection.
   Figures: payments/s, the time to create them all, p50/p99 per batch,
   the peak RSS of the web workers. Meanwhile another actor sends
   single creates at ``--beside-rate`` per second from a process of its own:
   their p50/p99 (target p99 < 50 ms).

The CPU per 1,000 payments is printed for the import (the web's workers,
and Postgres's backends for the database, the other actor's few creates
included) and for the COPY floor (its client, its backend): on a machine
shared with other work the rates follow the load, the CPU much less.

Every item must be answered 201 and the database must hold exactly the
payments sent; the run fails otherwise. Targets: >= 10,000 payments/s and
>= 0.4 x the COPY floor.

    python -m bench.batch_create [--payments 1000000] [--batch-size 1000]
        [--connections 1] [--single-seconds 20] [--copy-rows 200000]
    python -m bench.batch_create --smoke     # seconds, tiny N: CI's check it still runs
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from bench.api_saturation import Server, Wrk
from bench.harness import (
    REDIS_URL,
    SMOKE_ENV,
    UNLIMITED_API,
    postgres_cpu_seconds,
    private_database,
)
from paycron.config import Config
from paycron.domain.ids import new_payment_id
from paycron.store.apikeys import create_api_key
from paycron.store.db import connect
from paycron.store.payments import request_hash

PATH = "/v1/scheduled-payments/batch"
SINGLE = "/v1/scheduled-payments"


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# -- 1. the COPY floor -------------------------------------------------------------------


def copy_floor(url: str, rows: int, batch_size: int, due: datetime) -> tuple[float, float, float]:
    """Rows per second (each a payment, its key and its event) COPYed by one
    client, and the CPU seconds per row of the client and of Postgres."""
    due_text = due.isoformat()
    with psycopg.connect(url) as conn:
        started, client_cpu = time.perf_counter(), time.process_time()
        postgres_cpu = postgres_cpu_seconds(url)
        for start in range(0, rows, batch_size):
            n = min(batch_size, rows - start)
            ids = [new_payment_id(due) for _ in range(n)]
            with conn.transaction():
                cur = conn.cursor()
                with cur.copy(
                    "COPY payments (id, due_at, payer, payee, amount_minor, currency, run_at)"
                    " FROM STDIN"
                ) as copy:
                    for i, pid in enumerate(ids):
                        copy.write_row((pid, due, "floor", f"sub-{start + i}", 990, "USD", due))
                with cur.copy(
                    "COPY idempotency_keys (actor, key, request_hash, payment_id, due_at)"
                    " FROM STDIN"
                ) as copy:
                    for i, pid in enumerate(ids):
                        body = {"payee": f"sub-{start + i}", "amount": 990, "dueAt": due_text}
                        copy.write_row(
                            ("floor", f"floor-{start + i}", request_hash(body), pid, due)
                        )
                with cur.copy(
                    "COPY payment_events (payment_id, payer, type, status, attempt, data)"
                    " FROM STDIN"
                ) as copy:
                    for pid in ids:
                        data = json.dumps({"amount": 990, "currency": "USD", "dueAt": due_text})
                        copy.write_row((pid, "floor", "payment.created", "PENDING", 0, data))
        seconds = time.perf_counter() - started
        postgres_cpu = postgres_cpu_seconds(url) - postgres_cpu
        client_cpu = time.process_time() - client_cpu
    return rows / seconds, client_cpu / rows, postgres_cpu / rows


# -- 3. the import -----------------------------------------------------------------------


def batch_bodies(total: int, size: int, due: str, prefix: str):
    for start in range(0, total, size):
        items = [
            {
                "idempotencyKey": f"{prefix}-{n}",
                "payee": f"subscriber-{n}",
                "amount": 990 + n % 7,
                "dueAt": due,
            }
            for n in range(start, min(total, start + size))
        ]
        yield len(items), json.dumps({"items": items}).encode()


def post(port: int, path: str, body: bytes, headers: dict) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def send_batch(port: int, token: str, n: int, body: bytes) -> float:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    started = time.perf_counter()
    status, data = post(port, PATH, body, headers)
    elapsed = time.perf_counter() - started
    if status != 200:
        raise RuntimeError(f"batch answered {status}: {data[:300]!r}")
    results = json.loads(data)["results"]
    created = sum(1 for r in results if r["status"] == 201)
    if created != n:
        raise RuntimeError(f"{n - created} of {n} items not created: {data[:300]!r}")
    return elapsed


def beside(port: int, token: str, rate: float, stop, out) -> None:
    """Another actor's single creates at ``rate``/s until ``stop``; latencies (ms) to ``out``."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    due = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0).isoformat()
    latencies, errors, n = [], 0, 0
    next_at = time.perf_counter()
    while not stop.is_set():
        n += 1
        body = json.dumps({"payee": "shop", "amount": 500, "dueAt": due}).encode()
        started = time.perf_counter()
        try:
            status, _ = post(port, SINGLE, body, {**headers, "Idempotency-Key": f"beside-{n}"})
            errors += status != 201
        except OSError:
            errors += 1
        latencies.append((time.perf_counter() - started) * 1000)
        next_at += 1 / rate
        time.sleep(max(0.0, next_at - time.perf_counter()))
    out.send((latencies, errors))


def peak_rss_mb(session: int) -> tuple[float, float]:
    """Peak resident memory (VmHWM) of the session's processes: the largest
    one's and the sum, MB."""
    peaks = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) != session:
                continue
            for line in Path(f"/proc/{entry}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peaks.append(int(line.split()[1]) / 1024)
        except OSError:
            continue
    return (max(peaks, default=0.0), sum(peaks))


def run_import(web: Server, url: str, token: str, other: str, args, due: str) -> dict:
    port = web.port
    stop = multiprocessing.Event()
    receive, send = multiprocessing.Pipe(duplex=False)
    probe = multiprocessing.Process(
        target=beside, args=(port, other, args.beside_rate, stop, send), daemon=True
    )
    probe.start()
    time.sleep(1.0)  # the other actor's creates run before, during and after
    latencies: list[float] = []
    lock = threading.Lock()
    bodies = batch_bodies(args.payments, args.batch_size, due, f"import-{uuid.uuid4().hex[:6]}")

    def one(item):
        n, body = item
        elapsed = send_batch(port, token, n, body)
        with lock:
            latencies.append(elapsed * 1000)

    started = time.perf_counter()
    web_cpu, postgres_cpu = web.cpu(), postgres_cpu_seconds(url)
    with ThreadPoolExecutor(args.connections) as pool:
        # at most 2 x connections bodies made ahead: memory of a few batches
        pending = []
        for item in bodies:
            pending.append(pool.submit(one, item))
            if len(pending) >= 2 * args.connections:
                pending.pop(0).result()
        for future in pending:
            future.result()
    seconds = time.perf_counter() - started
    web_cpu, postgres_cpu = web.cpu() - web_cpu, postgres_cpu_seconds(url) - postgres_cpu
    time.sleep(1.0)
    stop.set()
    beside_latencies, beside_errors = receive.recv()
    probe.join(10)
    return {
        "seconds": seconds,
        "rate": args.payments / seconds,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "batches": len(latencies),
        "beside": beside_latencies,
        "beside_errors": beside_errors,
        "rss": peak_rss_mb(web.proc.pid),
        "web_cpu": web_cpu / args.payments,
        "postgres_cpu": postgres_cpu / args.payments,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payments", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=1, help="batches in flight")
    parser.add_argument("--single-seconds", type=float, default=20.0)
    parser.add_argument("--single-connections", type=int, default=32)
    parser.add_argument("--copy-rows", type=int, default=200_000)
    parser.add_argument("--beside-rate", type=float, default=20.0, help="other actor's creates/s")
    parser.add_argument("--smoke", action="store_true", help="a few seconds, tiny N")
    args = parser.parse_args()
    if args.smoke:
        args.payments, args.batch_size, args.copy_rows = 3000, 500, 2000
        args.single_seconds, args.single_connections = 2.0, 8
        os.environ.update(SMOKE_ENV)  # a month of partitions, not a year's
    workdir = Path(tempfile.mkdtemp(prefix="paycron-batch-bench-"))
    namespace = f"paycron-bench-{uuid.uuid4().hex[:8]}"
    instant = (datetime.now(UTC) + timedelta(days=2)).replace(hour=0, minute=0, second=0)
    instant = instant.replace(microsecond=0)
    load_before = os.getloadavg()
    with private_database() as url:
        with connect(Config(database_url=url)) as conn:
            token, _ = create_api_key(conn, "billing")
            other, _ = create_api_key(conn, "another-actor")
        env = {
            "DATABASE_URL": url,
            "REDIS_URL": REDIS_URL,
            "REDIS_NAMESPACE": namespace,
            "GATEWAY_URL": "http://127.0.0.1:9",
            "SENTRY_DSN": "",
            **UNLIMITED_API,
        }
        floor, floor_client_cpu, floor_postgres_cpu = copy_floor(
            url, args.copy_rows, args.batch_size, instant - timedelta(hours=1)
        )
        web = Server("web", "web:create_app()", env, workers=5, threads=4, logdir=workdir)
        server_args = web.args
        try:
            wrk = Wrk(token, workdir)
            wrk.run(web.url, seconds=min(3.0, args.single_seconds), connections=8)  # warm-up
            single = wrk.run(
                web.url, seconds=args.single_seconds, connections=args.single_connections
            )
            imported = run_import(web, url, token, other, args, instant.isoformat())
        finally:
            web.stop()
            import redis

            client = redis.Redis.from_url(REDIS_URL)
            for key in client.scan_iter(match=f"{namespace}*", count=1000):
                client.delete(key)
        with connect(Config(database_url=url)) as conn:
            stored = conn.execute(
                "SELECT count(*) AS n FROM payments WHERE payer = 'billing' AND due_at = %s",
                (instant,),
            ).fetchone()["n"]
    shutil.rmtree(workdir, ignore_errors=True)
    if stored != args.payments:
        raise SystemExit(f"FAILED: {stored} payments stored for {args.payments} sent")
    rate = imported["rate"]
    beside_ms = imported["beside"]
    print(
        f"machine: {os.cpu_count()} cores, load average {load_before[0]:.1f} before the run, "
        f"{os.getloadavg()[0]:.1f} after (shared with other work: figures vary with it)"
    )
    print(f"server: the Procfile's web: {' '.join(server_args)}")
    print(
        f"COPY floor (one client, no HTTP)    : {floor:8.0f} payments/s  ({args.copy_rows} "
        f"payments + keys + events, {args.batch_size} per transaction)"
    )
    print(
        f"single creates at saturation        : {single.rate:8.0f} payments/s  (wrk, "
        f"{args.single_connections} connections, {args.single_seconds:g} s; p99 "
        f"{single.p99_ms:.1f} ms; non-201/errors {single.errors})"
    )
    print(
        f"batch import                        : {rate:8.0f} payments/s  ({args.payments} "
        f"payments due at {instant.isoformat()} in {imported['seconds']:.1f} s; "
        f"{imported['batches']} batches of {args.batch_size}, {args.connections} in flight)"
    )
    print(
        f"per batch                           : p50 {imported['p50']:.0f} ms, p99 "
        f"{imported['p99']:.0f} ms"
    )
    print(
        f"CPU per 1,000 payments              : import: web {1e6 * imported['web_cpu']:.0f} ms + "
        f"Postgres {1e6 * imported['postgres_cpu']:.0f} ms; COPY floor: client "
        f"{1e6 * floor_client_cpu:.0f} ms + Postgres {1e6 * floor_postgres_cpu:.0f} ms"
    )
    print(f"batch / single                      : {rate / single.rate:8.1f} x  (target >= 12)")
    ratio = rate / floor
    print(
        f"batch / COPY floor                  : {ratio:8.2f}    (target >= 0.4: "
        f"{'met' if ratio >= 0.4 else 'MISSED'})"
    )
    print(f"target >= 10,000 payments/s         : {'met' if rate >= 10_000 else 'MISSED'}")
    peak, total = imported["rss"]
    print(
        f"web peak RSS                        : {peak:.0f} MB the largest process, "
        f"{total:.0f} MB all of gunicorn's"
    )
    print(
        f"another actor's single creates      : {len(beside_ms)} at {args.beside_rate:g}/s "
        f"during the import: p50 {percentile(beside_ms, 50):.1f} ms, p99 "
        f"{percentile(beside_ms, 99):.1f} ms, max {max(beside_ms, default=0):.1f} ms, "
        f"errors {imported['beside_errors']}  (target p99 < 50 ms: "
        f"{'met' if percentile(beside_ms, 99) < 50 else 'MISSED'})"
    )
    print(f"every item 201, {stored} payments stored: passed")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
