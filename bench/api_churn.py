"""The API under load and churn.

gunicorn on a private Postgres and Redis; a steady mix of create / get /
list / cancel for several minutes while the harness SIGKILLs one gunicorn
worker every 10 s, sends HUP (graceful reload) every 60 s and restarts Redis
once. Then /readyz is watched through a Postgres outage (503 while down,
200 after). Reports requests, failures (any 5xx or connection error) per
attempt and after the client's idempotent retry, p50/p99 latency, and
checks that every create landed exactly once.

    python -m bench.api_churn [--minutes 3] [--rate 60]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import urllib3

from bench.harness import UNLIMITED_API, horizon_days, parse_args
from bench.servers import PrivatePostgres, PrivateRedis
from devtools.procs import ProcessGroup, free_port, wait_http, web_args
from paycron.config import Config
from paycron.store.apikeys import create_api_key
from paycron.store.db import connect
from paycron.store.migrate import migrate
from paycron.store.partitions import ensure_partitions

#: The client retries a failed request this many times (creates with the same key).
CLIENT_RETRIES = 3


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: int = 0
    failed: int = 0  # per attempt: 5xx or connection error
    failed_after_retry: int = 0  # the operation failed even after the client's retries
    latencies: list[float] = field(default_factory=list)
    by_status: dict[str, int] = field(default_factory=dict)
    created: dict[str, str] = field(default_factory=dict)  # idempotency key -> payment id
    create_keys: list[str] = field(default_factory=list)

    def record(self, status: str, seconds: float, failed: bool) -> None:
        with self.lock:
            self.sent += 1
            self.failed += failed
            self.by_status[status] = self.by_status.get(status, 0) + 1
            if not failed:
                self.latencies.append(seconds)


class Load:
    def __init__(self, base: str, key: str, rate: float, seed: int):
        self.base, self.rate = base, rate
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self.http = urllib3.PoolManager(
            maxsize=32, retries=False, timeout=urllib3.Timeout(connect=2, read=10)
        )
        self.rng = random.Random(seed)
        self.tally = Tally()
        self.stop = threading.Event()

    def _call(
        self, method: str, path: str, body: dict | None = None, extra: dict | None = None
    ) -> tuple[int | None, dict | None]:
        started = time.perf_counter()
        try:
            response = self.http.request(
                method,
                self.base + path,
                body=json.dumps(body).encode() if body else None,
                headers={**self.headers, **(extra or {})},
            )
        except urllib3.exceptions.HTTPError as exc:
            self.tally.record(type(exc).__name__, time.perf_counter() - started, True)
            return None, None
        failed = response.status >= 500
        self.tally.record(str(response.status), time.perf_counter() - started, failed)
        try:
            return response.status, json.loads(response.data)
        except ValueError:
            return response.status, None

    def _with_retries(self, attempt) -> None:
        for _ in range(CLIENT_RETRIES + 1):
            status, _body = attempt()
            if status is not None and status < 500:
                return
            time.sleep(0.1)
        with self.tally.lock:
            self.tally.failed_after_retry += 1

    def create(self) -> None:
        key = f"churn-{self.rng.getrandbits(64):016x}"
        due = datetime.now(UTC) + timedelta(days=self.rng.randint(1, 300))
        body = {
            "payee": "merchant",
            "amount": self.rng.randint(100, 10_000),
            "dueAt": due.isoformat(),
        }
        with self.tally.lock:
            self.tally.create_keys.append(key)

        def attempt():
            status, answer = self._call(
                "POST", "/v1/scheduled-payments", body, {"Idempotency-Key": key}
            )
            if status == 201:
                with self.tally.lock:
                    known = self.tally.created.setdefault(key, answer["id"])
                assert known == answer["id"], "a retried create returned another payment"
            return status, answer

        self._with_retries(attempt)

    def _known_id(self) -> str | None:
        with self.tally.lock:
            ids = list(self.tally.created.values())
        return self.rng.choice(ids) if ids else None

    def get(self) -> None:
        payment_id = self._known_id()
        if payment_id:
            self._with_retries(lambda: self._call("GET", f"/v1/scheduled-payments/{payment_id}"))

    def list(self) -> None:
        self._with_retries(lambda: self._call("GET", "/v1/scheduled-payments?limit=20"))

    def cancel(self) -> None:
        payment_id = self._known_id()
        if payment_id:
            self._with_retries(lambda: self._call("DELETE", f"/v1/scheduled-payments/{payment_id}"))

    def run(self, threads: int) -> None:
        operations = [self.create] * 40 + [self.get] * 25 + [self.list] * 20 + [self.cancel] * 15
        interval = threads / self.rate

        def client(n: int) -> None:
            next_at = time.monotonic() + n * interval / threads
            while not self.stop.is_set():
                self.rng.choice(operations)()
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))

        workers = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(threads)]
        for w in workers:
            w.start()
        self.workers = workers


def gunicorn_workers(master_pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(master_pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def readyz_through_outage(base: str, pg: PrivatePostgres) -> tuple[bool, bool]:
    http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=2, read=8))

    def status() -> int | None:
        try:
            return http.request("GET", base + "/readyz").status
        except urllib3.exceptions.HTTPError:
            return None

    pg.stop("fast")
    down = any(status() == 503 or time.sleep(0.5) for _ in range(30))
    pg.start()
    up = any(status() == 200 or time.sleep(0.5) for _ in range(60))
    return down, up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--rate", type=float, default=60.0, help="requests per second")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--web-workers", type=int, default=5, help="gunicorn --workers (default: the Procfile's)"
    )
    parser.add_argument(
        "--web-threads", type=int, default=4, help="gunicorn --threads (default: the Procfile's)"
    )
    args = parse_args(parser, minutes=0.2, rate=20.0, threads=2, web_workers=1, web_threads=2)

    pg, redis_server = PrivatePostgres(), PrivateRedis()
    pg.start()
    redis_server.start()
    logdir = Path(tempfile.mkdtemp(prefix="paycron-churn-"))
    procs = None
    try:
        config = Config(
            database_url=pg.url, redis_url=redis_server.url, horizon_days=horizon_days()
        )
        with connect(config) as conn:
            migrate(conn)
            ensure_partitions(conn, config)
            key, _ = create_api_key(conn, "churn")
        port = free_port()
        procs = ProcessGroup(
            logdir, {"DATABASE_URL": pg.url, "REDIS_URL": redis_server.url, **UNLIMITED_API}
        )
        master = procs.start(
            "web", web_args(port, workers=args.web_workers, threads=args.web_threads)
        )
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/readyz", master)
        load = Load(base, key, args.rate, args.seed)
        load.run(args.threads)
        churn = {"worker_kills": 0, "reloads": 0, "redis_restarts": 0}
        started = time.monotonic()
        duration = args.minutes * 60
        redis_at = duration / 2
        while time.monotonic() - started < duration:
            time.sleep(10)
            elapsed = time.monotonic() - started
            victims = gunicorn_workers(master.pid)
            if victims:
                os.kill(random.choice(victims), signal.SIGKILL)
                churn["worker_kills"] += 1
            if int(elapsed) // 60 != int(elapsed - 10) // 60:
                os.kill(master.pid, signal.SIGHUP)
                churn["reloads"] += 1
            if redis_at and elapsed >= redis_at:
                redis_server.restart_empty()
                churn["redis_restarts"] += 1
                redis_at = 0
        load.stop.set()
        for w in load.workers:
            w.join(timeout=15)
        tally = load.tally
        with connect(config) as conn:
            rows = conn.execute(
                "SELECT key, payment_id::text AS id FROM idempotency_keys WHERE actor = 'churn'"
            ).fetchall()
        in_db = {r["key"]: r["id"] for r in rows}
        lost = [k for k, pid in tally.created.items() if in_db.get(k) != pid]
        created_unseen = [k for k in tally.create_keys if k in in_db and k not in tally.created]
        down, up = readyz_through_outage(base, pg)
    finally:
        if procs:
            procs.stop()
        redis_server.destroy()
        pg.destroy()

    latencies = sorted(tally.latencies)
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[int(len(latencies) * 0.99) - 1] * 1000
    print(
        f"ran {args.minutes:.1f} min at ~{args.rate:.0f} req/s with {args.threads} clients; "
        f"churn: {churn}"
    )
    print(f"requests sent                  : {tally.sent}")
    print(
        f"failed (5xx or connection)     : {tally.failed} "
        f"({tally.failed / max(1, tally.sent) * 10_000:.1f} per 10,000; target <= 5)"
    )
    print(f"failed after client retry      : {tally.failed_after_retry}")
    print(f"latency p50 / p99              : {p50:.1f} / {p99:.1f} ms")
    print(f"answers by status              : {dict(sorted(tally.by_status.items()))}")
    print(f"creates answered 201           : {len(tally.created)} of {len(tally.create_keys)}")
    print(f"201s missing or different in db: {len(lost)}")
    print(f"payments per idempotency key   : 1 (primary key); rows for our keys: {len(in_db)}")
    print(
        f"creates that landed unanswered : {len(created_unseen)} (their retries were "
        f"answered by replays)"
    )
    print(f"/readyz 503 while Postgres down: {down}; 200 after: {up}")


if __name__ == "__main__":
    main()
