"""What every benchmark needs: a private database, the system as real
processes (the Procfile's commands), and figures read back from Postgres
and the gateway's ledger."""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from devtools import stats
from devtools.fake_gateway import GatewayHandle, charges_per_key
from devtools.procs import (
    ProcessGroup,
    free_port,
    gateway_args,
    scheduler_args,
    wait_http,
    worker_args,
)
from paycron.config import Config
from paycron.store.db import connect
from paycron.store.migrate import migrate
from paycron.store.partitions import ensure_partitions

ADMIN_DSN = os.environ.get(
    "PAYCRON_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("PAYCRON_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
#: A benchmark that drives the API hard measures the API, not the per-actor
#: rate limiter (one bench client would meet API_RATE_LIMIT at once): its web
#: processes get this in their environment.
UNLIMITED_API = {"API_RATE_LIMIT": "1000000000", "API_RATE_BURST": "1000000000"}
#: "Since" for whole-run figures: every row (a benchmark's database is its own).
ALL_TIME = datetime(1970, 1, 1, tzinfo=UTC)


def parse_args(parser: argparse.ArgumentParser, **smoke) -> argparse.Namespace:
    """The command's arguments, with ``--smoke`` added: the form CI runs
    (tests/processes/test_bench_smoke.py), seconds long with a tiny N, so a
    benchmark that can no longer run fails CI. ``smoke`` gives the defaults
    that form uses; flags given explicitly still win. Its figures mean
    nothing; it proves the command runs end to end."""
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the CI form: seconds, tiny N; proves the command runs, its figures mean nothing",
    )
    known, _ = parser.parse_known_args()
    if known.smoke:
        parser.set_defaults(**smoke)
        # A few day partitions, not a year's: creating ~380 of them (here
        # and in every process that keeps them) would be most of the run.
        os.environ.update(SMOKE_ENV)
    return parser.parse_args()


#: What ``--smoke`` puts in the environment (inherited by every process a
#: benchmark starts).
SMOKE_ENV = {"HORIZON_DAYS": "31"}  # bench.list_filter spreads over 30 days


def horizon_days() -> int:
    """The horizon partitions are created for: HORIZON_DAYS if set (a smoke
    run sets it), else paycron's default."""
    return int(os.environ.get("HORIZON_DAYS", Config().horizon_days))


@contextlib.contextmanager
def private_database(prefix: str = "paycron_bench") -> Iterator[str]:
    """A fresh, migrated database, dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = psycopg.conninfo.make_conninfo(ADMIN_DSN, dbname=name)
    try:
        config = Config(database_url=url, horizon_days=horizon_days())
        with connect(config) as conn:
            migrate(conn)
            ensure_partitions(conn, config)
        yield url
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class System:
    """Gateway, scheduler(s) and workers running against one database."""

    database_url: str
    settings: dict[str, str] = field(default_factory=dict)
    schedulers: int = 1
    #: None: the Procfile's own counts.
    worker_processes: int | None = 2
    worker_threads: int | None = 16

    def __post_init__(self):
        self.logdir = Path(tempfile.mkdtemp(prefix="paycron-bench-"))
        self.namespace = f"paycron-bench-{uuid.uuid4().hex[:8]}"
        self.gateway_url = f"http://127.0.0.1:{free_port()}"
        self.env = {
            "DATABASE_URL": self.database_url,
            "REDIS_URL": REDIS_URL,
            "REDIS_NAMESPACE": self.namespace,
            "GATEWAY_URL": self.gateway_url,
            **UNLIMITED_API,
            **self.settings,
        }
        self.procs = ProcessGroup(self.logdir, self.env)
        self.gateway = GatewayHandle(self.gateway_url, timeout=30)

    def start_gateway(self, **faults) -> None:
        port = int(self.gateway_url.rsplit(":", 1)[1])
        wait_http(f"{self.gateway_url}/healthz", self.procs.start("gateway", gateway_args(port)))
        if faults:
            self.gateway.faults(**faults)

    def start_engine(self) -> None:
        for n in range(self.schedulers):
            self.procs.start(f"scheduler-{n}", scheduler_args())
        self.procs.start("worker", worker_args(self.worker_processes, self.worker_threads))

    def stop(self) -> None:
        self.procs.stop()
        self.gateway.close()
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(match=f"{self.namespace}*", count=1000):
            client.delete(key)

    def config(self) -> Config:
        return Config.from_env(self.env)

    def ledger(self) -> list[dict]:
        return self.gateway.ledger()

    def gateway_stats(self) -> dict:
        return self.gateway.stats()


@contextlib.contextmanager
def procfile_system(database_url: str, *, ceiling: int, **faults) -> Iterator[System]:
    """The engine as the Procfile ships it, with only GATEWAY_RATE_LIMIT set,
    beside a fake gateway whose own ceiling is the same and whose faults
    (e.g. a latency) are given; stopped afterwards."""
    system = System(
        database_url,
        {"GATEWAY_RATE_LIMIT": str(ceiling)},
        worker_processes=None,
        worker_threads=None,
    )
    try:
        system.start_gateway(rate_limit_per_s=ceiling, **faults)
        system.start_engine()
        yield system
    finally:
        system.stop()


def due_in(seconds: float) -> datetime:
    """A whole second this far ahead: when a benchmark's spike falls due."""
    return (datetime.now(UTC) + timedelta(seconds=seconds)).replace(microsecond=0)


def wait_until_settled(
    conn, total: int, *, timeout: float, tick: float = 0.5, until: datetime | None = None
) -> float:
    """Seconds until ``total`` payments due before ``until`` are terminal."""
    until = until or datetime.now(UTC) + timedelta(days=1)
    started = time.monotonic()
    while True:
        open_rows = stats.open_payments(conn, until=until)
        if open_rows == 0:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{open_rows} of {total} payments still open after {timeout}s")
        time.sleep(tick)


def max_charges_per_key(ledger: list[dict]) -> int:
    return max(charges_per_key(ledger).values(), default=0)


def settled_counts(conn, until: datetime | None = None) -> dict:
    """{completed, lease_expired} among payments due before ``until``."""
    return stats.settled_counts(conn, until=until or datetime.now(UTC) + timedelta(days=1))


def cpu_seconds(procs) -> float:
    """User + system CPU of every live process in these children's sessions
    (each child starts a session of its own, which its forks share)."""
    sessions = {proc.pid for proc in procs if proc.poll() is None}
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        # after the command: state ppid pgrp session ... utime(12) stime(13)
        if int(fields[3]) in sessions:
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def postgres_cpu_seconds(database_url: str) -> float:
    """User + system CPU of the Postgres backends now serving this database
    (a backend's process title names its database); one that has exited is
    no longer counted, so take both readings while the system runs."""
    needle = f" {psycopg.conninfo.conninfo_to_dict(database_url)['dbname']} ".encode()
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            title = (proc / "cmdline").read_bytes()
            if not title.startswith(b"postgres: ") or needle not in title:
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile, or not ours to read
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def quiet_load(max_load: float = 1.5, *, timeout: float = 600.0) -> float:
    """Wait until the machine's 1-minute load is at most ``max_load`` (other
    work, or the previous phase of this benchmark, has calmed down), at most
    ``timeout`` seconds; the load then, for the report."""
    deadline = time.monotonic() + timeout
    while os.getloadavg()[0] > max_load and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def sustained_rate(conn, since: datetime) -> float:
    """Payments per second between the first and the last outcome written at
    or after ``since`` (a drain's pace, without the wait for its first call)."""
    row = conn.execute(
        "SELECT count(*) AS n, extract(epoch FROM max(finished_at) - min(finished_at)) AS span"
        " FROM attempts WHERE finished_at >= %s",
        (since,),
    ).fetchone()
    return (row["n"] - 1) / float(row["span"]) if row["n"] > 1 and row["span"] else 0.0


def in_flight(conn, since: datetime = ALL_TIME) -> dict:
    """Gateway calls in flight over the run (calls started at or after
    ``since``), from the attempt rows' start and finish times: the most at
    once, and the mean while any was."""
    rows = conn.execute(
        "SELECT started_at, finished_at FROM attempts WHERE finished_at IS NOT NULL"
        " AND started_at >= %s"
        " AND outcome NOT IN ('RECONCILED', 'FOUND_BY_LOOKUP', 'NOT_SENT')",
        (since,),
    ).fetchall()
    if not rows:
        return {"max": 0, "mean": 0.0}
    edges = sorted([(r["started_at"], 1) for r in rows] + [(r["finished_at"], -1) for r in rows])
    current = peak = 0
    for _, step in edges:
        current += step
        peak = max(peak, current)
    busy = (edges[-1][0] - edges[0][0]).total_seconds() or 1.0
    held = sum((r["finished_at"] - r["started_at"]).total_seconds() for r in rows)
    return {"max": peak, "mean": held / busy}
