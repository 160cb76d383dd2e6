"""Crash soak: the whole system as real processes, broken on purpose.

A private Postgres and a private Redis (started here, killed here — never
the machine's shared ones), the fake gateway mixing declines, 5xx, timeouts,
429s and charge-then-drop, a gunicorn API, two schedulers and several
Dramatiq worker processes. Payments are created through the API, due over a
window; while they fall due the harness SIGKILLs workers (calls in flight)
and schedulers, restarts Redis empty, restarts Postgres with an immediate
shutdown, and cancels payments close to their due time. Throughout, the
schedulers reach Redis through a relay that loses the reply of some enqueues
(the message was queued, the sweeper's enqueue raises), a harness thread
delivers copies of some messages a second time, and an operator re-drives
the open dead letters from a process configured for the other processor
(bench/soak_faults.py). Then it lets the system drain, re-drives once more
from that process, runs the reconciliation, and checks the promises against
the gateway's ledger and the database. Exit status 1 on any violation.

    python -m bench.soak --short        # CI: a few hundred payments, a handful of each fault
    python -m bench.soak                # full: 5,000 payments, 100+ kills, 3 Redis losses,
                                        #       2 Postgres restarts
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from bench.harness import UNLIMITED_API, parse_args
from bench.servers import PrivatePostgres, PrivateRedis
from bench.soak_faults import LossyRedisRelay, MessageDuplicator
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
    stop,
    wait_http,
    web_args,
    worker_args,
)
from paycron.config import Config
from paycron.sql import parse_blocks
from paycron.store.apikeys import create_api_key
from paycron.store.db import connect
from paycron.store.migrate import migrate
from paycron.store.partitions import ensure_partitions

CHECKS = parse_blocks((Path(__file__).parent / "soak.sql").read_text())

#: Short engine timings so every path (retry, reap, park) happens within minutes.
ENGINE = {
    "LEASE_SECONDS": "9",
    "GATEWAY_TIMEOUT_SECONDS": "2",
    "RETRY_DELAYS": "1s,1s,2s,2s,3s",
    "SWEEP_INTERVAL_SECONDS": "0.5",
    "GATEWAY_RATE_LIMIT": "200",
    "CLAIM_BATCH": "100",
    "CIRCUIT_OPEN_SECONDS": "3",
    "CIRCUIT_MIN_CALLS": "40",
    "CIRCUIT_FAILURE_RATIO": "0.6",
    "MAX_LEASE_EXPIRIES": "5",
    "MESSAGE_GROUP_SIZE": "4",
    "DB_POOL_MAX": "8",
    # The fake settles within seconds: a lookup's "none" is conclusive 16 s
    # after a payment's last call, so a parked payment's letter can be
    # re-driven (and a re-drive that asked the wrong processor would act).
    "GATEWAY_SETTLE_MARGIN_SECONDS": "5",
    # Payments fall due within the window: a week of day partitions, not a
    # year's (375 of them were seconds of DDL, and WAL each restart replays).
    "HORIZON_DAYS": "7",
}
FAULTS = {
    "decline_rate": 0.03,
    "error_rate": 0.05,
    "timeout_rate": 0.02,
    "timeout_sleep_ms": 2500,
    "charge_then_drop_rate": 0.03,
    "rate_limit_per_s": 250,
    "latency_ms": 5,
}
DECLINE_AMOUNT, ALWAYS_503_AMOUNT = 40002, 50003
#: With --gateway stripe: Stripe's 500 stored after charging, replayed for the key.
STRIPE_FAULTS = {**FAULTS, "error_after_charge_rate": 0.02}
#: With --gateway stripe: the engine polls waiting debits soon (GATEWAY_POLL_SECONDS),
#: the stub settles them after a couple of seconds and loses, duplicates and
#: reorders their signed events.
STRIPE_ENGINE = {
    "GATEWAY": "stripe",
    "STRIPE_API_KEY": STRIPE_API_KEY,
    "STRIPE_WEBHOOK_SECRET": STRIPE_WEBHOOK_SECRET,
    "GATEWAY_POLL_SECONDS": "3",
}
STRIPE_EVENTS = {
    "webhook_loss_rate": 0.25,
    "webhook_duplicate_rate": 0.25,
    "webhook_reorder_ms": 1500,
    "webhook_retry_ms": 500,
    "enabled_events": ["payment_intent.succeeded", "payment_intent.payment_failed"],
}
STRIPE_SETTLE_SECONDS = 2.0
#: The schedulers' enqueues whose reply the relay loses after Redis ran them:
#: about eight of a short run's ~270 (each failed sweep hands its batch back).
ENQUEUE_LOSS_RATE = 0.03
#: The messages seen in the queue that are delivered a second time: a couple
#: of dozen in a short run.
DUPLICATE_RATE = 0.1
#: The actor of the admin key the other processor's process re-drives with.
OTHER_ACTOR = "soak-other-processor"


@dataclass
class Plan:
    payments: int
    window: float  # seconds over which the payments fall due
    workers: int
    worker_kills: int
    scheduler_kills: int
    redis_losses: int
    postgres_restarts: int
    cancels: int
    rate_limit_bursts: int
    other_redrives: int  # rounds of re-drives from the other processor's process


SHORT = Plan(
    payments=300,
    window=45,
    workers=2,
    worker_kills=8,
    scheduler_kills=3,
    redis_losses=1,
    postgres_restarts=1,
    cancels=15,
    rate_limit_bursts=2,
    other_redrives=4,
)
FULL = Plan(
    payments=5000,
    window=200,
    workers=3,
    worker_kills=90,
    scheduler_kills=20,
    redis_losses=3,
    postgres_restarts=2,
    cancels=100,
    rate_limit_bursts=5,
    other_redrives=12,
)


def drain_deadline(plan: Plan) -> float:
    """Seconds after the chaos ends by which every payment must be terminal:
    the whole retry schedule (with +20% jitter and a call timeout per try),
    every lease expiry a payment may suffer before it parks, a few breaker
    openings, and the backlog at the gateway rate."""
    delays = sum(float(d.rstrip("s")) for d in ENGINE["RETRY_DELAYS"].split(","))
    calls = len(ENGINE["RETRY_DELAYS"].split(",")) + 1
    retry_path = delays * 1.2 + calls * float(ENGINE["GATEWAY_TIMEOUT_SECONDS"])
    lease_path = int(ENGINE["MAX_LEASE_EXPIRIES"]) * float(ENGINE["LEASE_SECONDS"]) * 1.5
    breaker = 3 * float(ENGINE["CIRCUIT_OPEN_SECONDS"])
    backlog = plan.payments / float(ENGINE["GATEWAY_RATE_LIMIT"])
    return retry_path + lease_path + breaker + backlog + 30


class Soak:
    def __init__(self, plan: Plan, seed: int, *, gateway: str = "fake"):
        self.plan = plan
        self.stripe = gateway == "stripe"
        self.rng = random.Random(seed)
        self.logdir = Path(tempfile.mkdtemp(prefix="paycron-soak-"))
        self.pg = PrivatePostgres()
        self.redis = PrivateRedis()
        self.seed = seed
        self.gateway_port, self.web_port, self.other_port = free_port(), free_port(), free_port()
        self.other_answers: dict[str, int] = {}  # the other processor's re-drive answers
        self.cli_redrive: threading.Thread | None = None
        self.counts = {
            "worker_kills": 0,
            "scheduler_kills": 0,
            "redis_losses": 0,
            "postgres_restarts": 0,
            "cancels": 0,
            "cancelled": 0,
            "rate_limit_bursts": 0,
            "api_errors": 0,
            "enqueue_replies_lost": 0,
            "messages_duplicated": 0,
            "other_processor_redrives": 0,
        }

    # -------------------------------------------------------------- set-up

    def start(self) -> None:
        self.pg.start()
        self.redis.start()
        self.config = Config(
            database_url=self.pg.url,
            redis_url=self.redis.url,
            horizon_days=int(ENGINE["HORIZON_DAYS"]),
        )
        with connect(self.config) as conn:
            migrate(conn)
            ensure_partitions(conn, self.config)
            self.key, _ = create_api_key(conn, "soak")
            other_key, _ = create_api_key(conn, OTHER_ACTOR, admin=True)
        gateway_url = f"http://127.0.0.1:{self.gateway_port}"
        env = {
            **ENGINE,
            **UNLIMITED_API,
            "DATABASE_URL": self.pg.url,
            "REDIS_URL": self.redis.url,
            "GATEWAY_URL": gateway_url,
        }
        args = [*gateway_args(self.gateway_port), "--seed", "11"]
        if self.stripe:
            env.update(STRIPE_ENGINE, STRIPE_API_BASE=f"{gateway_url}/stripe")
            args += stripe_args(
                settle_seconds=STRIPE_SETTLE_SECONDS,
                webhook_urls=(f"http://127.0.0.1:{self.web_port}/v1/gateway-events/stripe",),
            )
        self.procs = ProcessGroup(self.logdir, env)
        # The schedulers' Redis, through the relay that loses enqueue replies.
        self.relay = LossyRedisRelay(self.redis.url, rate=ENQUEUE_LOSS_RATE, seed=self.seed)
        self.relay.start()
        gateway = self.procs.start("gateway", args)
        wait_http(f"{gateway_url}/healthz", gateway)
        self.gateway = GatewayHandle(gateway_url, timeout=30)
        self.gateway.faults(**(STRIPE_FAULTS if self.stripe else FAULTS))
        if self.stripe:
            self.gateway.stripe(**STRIPE_EVENTS)
        web = self.procs.start("web", web_args(self.web_port, workers=2, threads=4))
        # The settings of an API process configured for the other processor,
        # for an operator's re-drives.
        if self.stripe:
            other_env = {"GATEWAY": "fake"}
        else:
            other_env = {**STRIPE_ENGINE, "STRIPE_API_BASE": f"{gateway_url}/stripe"}
        self.schedulers = [self._start_scheduler(n) for n in range(2)]
        self.workers = [
            self.procs.start(f"worker-{n}", worker_args(1, 8)) for n in range(self.plan.workers)
        ]
        self.duplicator = MessageDuplicator(
            self.redis.url,
            namespace=f"{self.config.redis_namespace}-dramatiq",
            queue=self.config.queue_name,
            rate=DUPLICATE_RATE,
            seed=self.seed,
        )
        self.duplicator.start()
        wait_http(f"http://127.0.0.1:{self.web_port}/healthz", web)
        self.api = httpx.Client(
            base_url=f"http://127.0.0.1:{self.web_port}",
            timeout=30,
            headers={"Authorization": f"Bearer {self.key}"},
        )
        self.other_api = httpx.Client(
            base_url=f"http://127.0.0.1:{self.other_port}",
            timeout=30,
            headers={"Authorization": f"Bearer {other_key}"},
        )
        self.other_env = other_env
        self.other: subprocess.Popen | None = None  # started with the chaos

    def _other_ready(self) -> bool:
        """The other processor's API process, started when first needed (its
        boot then overlaps the chaos window, not the set-up)."""
        if self.other is None:
            self.other = self.procs.start(
                "web-other", web_args(self.other_port, workers=1), self.other_env
            )
        try:
            return self.other_api.get("/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def _start_scheduler(self, n: int):
        return self.procs.start(f"scheduler-{n}", scheduler_args(), {"REDIS_URL": self.relay.url})

    def stop(self) -> None:
        if hasattr(self, "duplicator"):
            self.duplicator.stop()
        # Our keep-alive connections closed first: gunicorn's graceful stop
        # would wait for them.
        for client in ("api", "other_api"):
            if hasattr(self, client):
                getattr(self, client).close()
        self.procs.stop()
        if hasattr(self, "relay"):
            self.relay.close()
        self.redis.destroy()
        self.pg.destroy()

    # -------------------------------------------------------------- load

    def create_payments(self) -> list[dict]:
        """All payments through the API, due over the window starting soon."""
        seconds_to_create = self.plan.payments / 150
        self.first_due = datetime.now(UTC) + timedelta(seconds=seconds_to_create + 5)

        def create(n: int) -> dict:
            amount = self.rng.randint(100, 90_000)
            if n % 40 == 3:
                amount = DECLINE_AMOUNT
            elif n % 97 == 5:
                amount = ALWAYS_503_AMOUNT
            due = self.first_due + timedelta(seconds=self.plan.window * n / self.plan.payments)
            body = {"payee": f"merchant-{n % 13}", "amount": amount, "dueAt": due.isoformat()}
            if self.stripe:  # declines come from Stripe's test methods; 50003 is always a 503
                body.update(
                    amount=self.rng.randint(100, 90_000),
                    customer=f"cus_soak_{n % 40}",
                    paymentMethod=stripe_test_method(n),
                )
                if n % 89 == 11:  # parked RETRIES_EXHAUSTED: dead letters to re-drive
                    body.update(amount=ALWAYS_503_AMOUNT, paymentMethod="pm_card_visa")
            for _ in range(5):  # an idempotent retry lands once
                try:
                    response = self.api.post(
                        "/v1/scheduled-payments",
                        json=body,
                        headers={"Idempotency-Key": f"soak-{n}"},
                    )
                    if response.status_code == 201:
                        return response.json()
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            raise RuntimeError(f"could not create payment {n}")

        with ThreadPoolExecutor(8) as pool:
            created = list(pool.map(create, range(self.plan.payments)))
        print(
            f"created {len(created)} payments through the API, due over "
            f"{self.plan.window:.0f}s from {self.first_due:%H:%M:%S}"
        )
        return created

    # -------------------------------------------------------------- chaos

    def chaos(self, created: list[dict]) -> None:
        """Faults at random moments while the payments fall due."""
        plan, start = self.plan, time.monotonic()
        self._other_ready()
        lead = max(0.0, (self.first_due - datetime.now(UTC)).total_seconds())
        span = lead + plan.window + 5
        events = (
            ["worker"] * plan.worker_kills
            + ["scheduler"] * plan.scheduler_kills
            + ["cancel"] * plan.cancels
            + ["burst"] * plan.rate_limit_bursts
            + ["redrive"] * plan.other_redrives
        )
        self.rng.shuffle(events)
        # Redis losses and Postgres restarts at spread-out moments of the window.
        timed = [
            (lead + plan.window * (i + 1) / (plan.redis_losses + 1), "redis")
            for i in range(plan.redis_losses)
        ]
        timed += [
            (lead + plan.window * (i + 0.5) / plan.postgres_restarts, "postgres")
            for i in range(plan.postgres_restarts)
        ]
        timed += [(lead + span * (i + 1) / (len(events) + 1), e) for i, e in enumerate(events)]
        for at, event in sorted(timed):
            time.sleep(max(0.0, start + at - time.monotonic()))
            getattr(self, f"_{event}")(created)

    def _worker(self, _created) -> None:
        i = self.rng.randrange(len(self.workers))
        stop(self.workers[i], sig=signal.SIGKILL)
        self.workers[i] = self.procs.start(f"worker-{i}", worker_args(1, 8))
        self.counts["worker_kills"] += 1

    def _scheduler(self, _created) -> None:
        i = self.rng.randrange(len(self.schedulers))
        stop(self.schedulers[i], sig=signal.SIGKILL)
        self.schedulers[i] = self._start_scheduler(i)
        self.counts["scheduler_kills"] += 1

    def _redis(self, _created) -> None:
        self.redis.restart_empty()
        self.counts["redis_losses"] += 1
        print(f"  redis restarted empty at +{self._since_first_due():.0f}s")

    def _postgres(self, _created) -> None:
        self.pg.restart_immediate()
        self.counts["postgres_restarts"] += 1
        print(f"  postgres restarted (immediate) at +{self._since_first_due():.0f}s")

    def _burst(self, _created) -> None:
        """A few seconds under a low gateway ceiling: 429s for sure."""
        self.gateway.faults(rate_limit_per_s=20)
        time.sleep(2)
        self.gateway.faults(rate_limit_per_s=FAULTS["rate_limit_per_s"])
        self.counts["rate_limit_bursts"] += 1

    def _cancel(self, created) -> None:
        """Cancel a payment falling due within the next couple of seconds."""
        now = datetime.now(UTC)
        near = [
            p
            for p in created
            if 0 <= (datetime.fromisoformat(p["dueAt"]) - now).total_seconds() < 2
        ]
        if not near:
            return
        target = self.rng.choice(near)
        try:
            response = self.api.delete(f"/v1/scheduled-payments/{target['id']}")
        except httpx.TransportError:
            self.counts["api_errors"] += 1
            return
        self.counts["cancels"] += 1
        self.counts["cancelled"] += response.status_code == 200

    def _redrive(self, _created) -> None:
        """An operator re-drives every open dead letter through the admin API
        of a process configured for the other processor: each must be
        refused (the payment is looked up at its own processor or not at all).
        The first round with open letters also starts one through the CLI."""
        deadline = time.monotonic() + 30
        while not self._other_ready():
            if time.monotonic() > deadline:
                raise RuntimeError("the other processor's API process did not come up")
            time.sleep(0.2)
        try:
            letters = self.other_api.get("/v1/admin/dead-letters").json()["data"]
        except (httpx.TransportError, ValueError, KeyError):
            self.counts["api_errors"] += 1
            return
        if letters and self.cli_redrive is None:
            self.cli_redrive = threading.Thread(target=self._redrive_by_cli, daemon=True)
            self.cli_redrive.start()
        for letter in letters:
            try:
                response = self.other_api.post(
                    f"/v1/admin/dead-letters/{letter['paymentId']}/redrive"
                )
            except httpx.TransportError:
                self.counts["api_errors"] += 1
                continue
            self._answered(f"api {response.status_code}", response.text)

    def _redrive_by_cli(self) -> None:
        """The oldest open letter re-driven with ``paycron dlq redrive`` run
        with the other processor's settings (in the background: a process
        start costs seconds)."""
        try:
            with connect(self.config) as conn:
                first = conn.execute(CHECKS["soak_oldest_letter"]).fetchone()
        except Exception:  # Postgres restarting
            self.counts["api_errors"] += 1
            return
        if first is None:
            return
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "paycron.cli",
                "dlq",
                "redrive",
                str(first["payment_id"]),
                "--by",
                OTHER_ACTOR,
            ],
            env={**self.procs.env, **self.other_env},
            text=True,
            capture_output=True,
        )
        self._answered(f"cli exit {result.returncode}", result.stdout + result.stderr)

    def _answered(self, how: str, text: str) -> None:
        """Count one re-drive's answer: refused for the processor, or what else."""
        self.counts["other_processor_redrives"] += 1
        if "this process is configured for" in text:
            how += " refused: called at another processor"
        elif "already resolved" in text:
            how += " refused: resolved meanwhile"
        self.other_answers[how] = self.other_answers.get(how, 0) + 1

    def redrive_after_drain(self) -> None:
        """Once every call is past its in-flight bound: every open letter again
        through the other processor's API, and the CLI's re-drive waited for."""
        self._redrive(None)
        if self.cli_redrive is not None:
            self.cli_redrive.join()

    def _since_first_due(self) -> float:
        return (datetime.now(UTC) - self.first_due).total_seconds()

    # -------------------------------------------------------------- drain and check

    def drain(self, deadline: float) -> bool:
        started = time.monotonic()
        while time.monotonic() - started < deadline:
            try:
                with connect(self.config) as conn:
                    row = conn.execute(CHECKS["soak_open"], {"until": self._until()}).fetchone()
                if row["n"] == 0:
                    print(
                        f"drained {time.monotonic() - started:.0f}s after the chaos "
                        f"(deadline {deadline:.0f}s)"
                    )
                    return True
            except Exception as exc:  # Postgres may still be recovering
                print(f"  drain check failed: {exc}")
            time.sleep(1)
        return False

    def _until(self) -> datetime:
        return self.first_due + timedelta(seconds=self.plan.window + 60)

    def reconcile(self) -> int:
        if self.stripe:
            days = sorted(
                {
                    datetime.fromtimestamp(c["created"], UTC).date().isoformat()
                    for c in self.gateway.stripe_ledger()["charges"]
                }
            )
        else:
            days = sorted({c["created_at"][:10] for c in self.gateway.ledger()})
        code = 0
        for day in days:
            result = subprocess.run(
                [sys.executable, "-m", "paycron.cli", "reconcile", "--date", day],
                env={**self.procs.env},
                text=True,
                capture_output=True,
            )
            print(f"reconcile {day}: exit {result.returncode}")
            print("  " + result.stdout.strip().replace("\n", "\n  "))
            code = max(code, result.returncode)
        return code

    def _charges(self) -> tuple[list[dict], dict[str, int]]:
        """The processor's charges (reference, amount, status) and the
        charges per payment id: the oracle."""
        if self.stripe:
            intents = self.gateway.stripe_ledger()["payment_intents"]
            ledger = [
                {"reference": i["paycron_payment_id"], "amount": i["amount"], "status": i["status"]}
                for i in intents
            ]
            return ledger, self.gateway.succeeded_per_payment_id()
        ledger = self.gateway.ledger()
        per_key = charges_per_key(ledger)
        return ledger, per_key

    def check(self, drained: bool) -> list[tuple[str, int, bool]]:
        ledger, per_key = self._charges()
        stats = self.gateway.stats()
        succeeded = [c for c in ledger if c["status"] == "succeeded"]
        with connect(self.config) as conn:
            rows = {
                str(r["id"]): r
                for r in conn.execute(CHECKS["soak_payments"], {"until": self._until()})
            }
            db = conn.execute(CHECKS["soak_counts"], {"until": self._until()}).fetchone()
            faults = conn.execute(CHECKS["soak_message_faults"], {"actor": OTHER_ACTOR}).fetchone()
        self.counts["enqueue_replies_lost"] = self.relay.lost
        self.counts["messages_duplicated"] = self.duplicator.duplicated
        completed_sum = sum(r["amount_minor"] for r in rows.values() if r["status"] == "COMPLETED")
        outcomes: dict[str, int] = {}
        for r in rows.values():
            name = r["status"] + (f" {r['failure_reason']}" if r["failure_reason"] else "")
            outcomes[name] = outcomes.get(name, 0) + 1
        print("final states: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
        if self.stripe:
            with connect(self.config) as conn:
                waits = conn.execute(CHECKS["soak_settlements"]).fetchone()
            fates: dict[str, int] = {}
            for event in self.gateway.stripe_events():
                for delivery in event["deliveries"]:
                    fates[delivery["status"]] = fates.get(delivery["status"], 0) + 1
            print(
                f"bank debits: {waits['waited']} waited for Stripe; settled by a signed event "
                f"{waits['by_event']}, by the poller {waits['by_poll']}; events stored "
                f"{waits['events_stored']} (pending {waits['events_pending']}); deliveries "
                + ", ".join(f"{k} {v}" for k, v in sorted(fates.items()))
            )
        print(
            f"lost enqueue replies: {self.relay.lost} of {self.relay.enqueues} enqueues; "
            f"claims handed back after a failed enqueue {faults['released_enqueue_failed']}; "
            f"duplicated messages: {self.duplicator.duplicated}; re-drives from the other "
            "processor's process: "
            + (", ".join(f"{k} {v}" for k, v in sorted(self.other_answers.items())) or "none")
        )
        print(
            f"gateway: {stats['charge_requests']} charge requests, {len(succeeded)} charges, "
            f"{stats.get('rate_limited', 0)} 429s, {stats.get('dropped', 0)} dropped after "
            f"charging, {stats.get('timeouts', 0)} timeouts, {stats.get('errors', 0)} 5xx"
        )
        charged_not_completed = [
            c for c in succeeded if rows.get(c["reference"], {}).get("status") != "COMPLETED"
        ]
        other_accepted = sum(
            n for k, n in self.other_answers.items() if k.startswith(("api 2", "cli exit 0"))
        )
        cancelled_charged = [
            c for c in ledger if rows.get(c["reference"], {}).get("status") == "CANCELLED"
        ]
        return [
            ("payments created", len(rows), len(rows) == self.plan.payments),
            ("every payment terminal by the deadline", db["open"], drained and db["open"] == 0),
            (
                "max charges per payment id"
                if self.stripe
                else "max charges per idempotency key (<= 1)",
                max(per_key.values(), default=0),
                max(per_key.values(), default=0) <= 1,
            ),
            (
                "charges for a payment not COMPLETED",
                len(charged_not_completed),
                not charged_not_completed,
            ),
            ("CANCELLED payments charged", len(cancelled_charged), not cancelled_charged),
            (
                "FAILED parked without a dead letter",
                db["parked_without_letter"],
                db["parked_without_letter"] == 0,
            ),
            (
                "FAILED without a reason",
                db["failed_without_reason"],
                db["failed_without_reason"] == 0,
            ),
            # A call cut off by a kill has its row marked LEASE_EXPIRED, not an outcome.
            (
                "gateway calls without an attempt row",
                max(0, stats["charge_requests"] - db["call_rows"] - db["lease_expired_rows"]),
                db["call_rows"] + db["lease_expired_rows"] >= stats["charge_requests"],
            ),
            (
                "attempt rows marked LEASE_EXPIRED (call cut off or never made)",
                db["lease_expired_rows"],
                True,
            ),
            ("attempt rows left IN_FLIGHT (unmarked)", db["in_flight"], db["in_flight"] == 0),
            (
                "sum charged - sum COMPLETED (minor units)",
                sum(c["amount"] for c in succeeded) - completed_sum,
                sum(c["amount"] for c in succeeded) == completed_sum,
            ),
            (
                "terminal payments whose status has no event",
                db["missing_events"],
                db["missing_events"] == 0,
            ),
            (
                "claims handed back after a worker started them",
                faults["released_started"],
                faults["released_started"] == 0,
            ),
            (
                "re-drives from the other processor's process not refused",
                other_accepted,
                other_accepted == 0,
            ),
            (
                "payments the other processor's process changed",
                faults["changed_by_other"],
                faults["changed_by_other"] == 0,
            ),
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="the CI form")
    parser.add_argument("--payments", type=int)
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument(
        "--gateway",
        choices=("fake", "stripe"),
        default="fake",
        help="charge through the fake's card API, or through the Stripe SDK "
        "against the fake's Stripe surface (bank debits, signed events)",
    )
    args = parse_args(parser)
    args.short = args.short or args.smoke
    plan = SHORT if args.short else FULL
    if args.payments:
        plan.payments = args.payments
    soak = Soak(plan, args.seed, gateway=args.gateway)
    print(f"soak plan: {plan} gateway={args.gateway}")
    print(f"logs: {soak.logdir}")
    started = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = time.monotonic() - started - sum(phases.values())

    try:
        soak.start()
        phase("start")
        created = soak.create_payments()
        phase("create")
        soak.chaos(created)
        phase("chaos")
        drained = soak.drain(drain_deadline(plan))
        phase("drain")
        soak.redrive_after_drain()
        phase("redrive")
        reconcile_code = soak.reconcile()
        results = soak.check(drained)
        phase("check")
    finally:
        soak.stop()
        phase("stop")
    print("phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    print("faults injected: " + ", ".join(f"{k} {v}" for k, v in soak.counts.items()))
    failed = False
    for name, count, ok in results:
        print(f"  [{'ok' if ok else 'FAIL'}] {name}: {count}")
        failed |= not ok
    print(f"reconciliation exit code: {reconcile_code} (1 = mismatches paged)")
    print(f"soak took {time.monotonic() - started:.0f}s: {'FAILED' if failed else 'passed'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
