"""Database failover: the whole system on a primary with a standby, broken.

A private primary and a streaming standby (the system's PostgreSQL binaries,
as the ``postgres`` user; bench.servers.ReplicatedPostgres), the Procfile's
processes against ``DATABASE_URL`` naming both hosts with
``target_session_attrs=read-write``, and the fake gateway. A spike of
payments falls due while clients create more through the API, retrying each
failed create with its Idempotency-Key. Then the fault:

    python -m bench.failover --short          # CI: synchronous standby; the primary SIGKILLed
                                              #     during the spike, the standby promoted,
                                              #     the killed primary kept down
    python -m bench.failover                  # the same, bigger; the killed primary is
                                              #     rewound (pg_rewind) into the new standby
    python -m bench.failover --async          # asynchronous replication: what it loses
    python -m bench.failover --standby-loss   # the standby dies while the primary lives,
                                              #     and comes back

Before the kill the standby is made to trail by ``--lag`` seconds (default
1; its WAL sender is stopped, as a slow link or a busy standby would): a
synchronous primary's commits wait meanwhile, an asynchronous one's do not.
``--lag 0`` kills a primary whose standby is up to date.

It prints and checks: every create answered 201 exists afterwards (with
--async it prints what was lost instead), at most one charge per key, every
payment terminal by a deadline computed from the settings, the sum charged
equal to the sum completed, how long claims and creates paused (target:
under 15 s from the kill), the requests that failed meanwhile, and that each
retried create landed once. Exit status 1 on any violation.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from bench.harness import System
from bench.servers import ReplicatedPostgres
from devtools.fake_gateway import charges_per_key
from devtools.procs import free_port, wait_http, web_args
from paycron.config import Config
from paycron.sql import parse_blocks
from paycron.store.apikeys import create_api_key
from paycron.store.db import connect
from paycron.store.migrate import migrate
from paycron.store.partitions import ensure_partitions

QUERIES = parse_blocks((Path(__file__).parent / "failover.sql").read_text())

#: Short engine timings, so claims cut off by the kill come back within a run.
ENGINE = {
    "LEASE_SECONDS": "10",
    "GATEWAY_TIMEOUT_SECONDS": "2",
    "RETRY_DELAYS": "1s,1s,2s,2s,3s",
    "SWEEP_INTERVAL_SECONDS": "0.5",
    "GATEWAY_RATE_LIMIT": "100",
    "CLAIM_BATCH": "100",
    "MAX_LEASE_EXPIRIES": "5",
    "HORIZON_DAYS": "7",
}
#: The SPEC's bound on the pause of claims and creates, from the kill.
PAUSE_TARGET = 15.0


@dataclass
class Plan:
    spike: int  # payments due in one second
    rate: float  # API creates per second, from the spike to the end of the load
    fault_after: float  # seconds into the spike
    promote_after: float  # seconds from the kill to the promotion (a failover manager's)
    load_after: float  # seconds of API load after the fault
    standby_down: float  # --standby-loss: how long the standby stays dead
    rejoin: bool  # rewind the killed primary into the new standby
    lag: float = 1.0  # seconds the standby trails when the primary dies (its WAL sender stalled)


SHORT = Plan(
    spike=1200,
    rate=20,
    fault_after=4,
    promote_after=2,
    load_after=20,
    standby_down=10,
    rejoin=False,
)
FULL = Plan(
    spike=4000, rate=40, fault_after=8, promote_after=2, load_after=40, standby_down=20, rejoin=True
)


# -- the clients ------------------------------------------------------------------------


@dataclass
class Try:
    sent: datetime
    answered: datetime
    status: int | None  # None: no HTTP answer (connection refused, reset, timeout)
    code: str  # the problem's code, or the transport error's name, or "" for a 201

    @property
    def seconds(self) -> float:
        return (self.answered - self.sent).total_seconds()


@dataclass
class Create:
    key: str
    body: dict
    tries: list[Try] = field(default_factory=list)
    payment_id: str | None = None
    replayed: bool = False


class Clients:
    """API clients that create payments and retry each failed create with
    its Idempotency-Key until it answers 201 (at most ``give_up`` seconds)."""

    def __init__(self, base_url: str, api_key: str, seed: int, give_up: float = 60.0):
        self.base_url, self.api_key, self.give_up = base_url, api_key, give_up
        self.rng = random.Random(seed)
        self.local = threading.local()
        self.numbers = itertools.count()
        self.creates: list[Create] = []
        self.lock = threading.Lock()

    def _http(self) -> httpx.Client:
        if not hasattr(self.local, "http"):
            self.local.http = httpx.Client(
                base_url=self.base_url,
                timeout=30,
                headers={"Authorization": f"Bearer {self.api_key}"},
            )
        return self.local.http

    def new(self, due_at: datetime) -> Create:
        n = next(self.numbers)
        with self.lock:
            amount = self.rng.randint(100, 90_000)
        create = Create(
            key=f"fo-{n}",
            body={"payee": f"payee-fo-{n}", "amount": amount, "dueAt": due_at.isoformat()},
        )
        with self.lock:
            self.creates.append(create)
        return create

    def run(self, create: Create) -> Create:
        started = time.monotonic()
        while time.monotonic() - started < self.give_up:
            sent = datetime.now(UTC)
            try:
                response = self._http().post(
                    "/v1/scheduled-payments",
                    json=create.body,
                    headers={"Idempotency-Key": create.key},
                )
                status = response.status_code
                code = "" if status == 201 else (_problem_code(response) or str(status))
            except httpx.TransportError as exc:
                response, status, code = None, None, type(exc).__name__
            create.tries.append(Try(sent, datetime.now(UTC), status, code))
            if status == 201:
                create.payment_id = response.json()["id"]
                create.replayed = response.headers.get("Idempotent-Replayed") == "true"
                return create
            if status is not None and 400 <= status < 500 and status not in (409, 429):
                return create  # a final answer (e.g. dueAt passed while the spike was made)
            time.sleep(0.25)
        return create

    def spike(self, count: int, due_at: datetime, threads: int = 8) -> None:
        work = [self.new(due_at) for _ in range(count)]
        run_all(self.run, work, threads)

    def load(
        self, rate: float, due_ahead: float, stop: threading.Event, threads: int = 8
    ) -> list[threading.Thread]:
        """Creates at ``rate`` per second until ``stop``, each due ``due_ahead``
        seconds after it is made, on ``threads`` threads."""
        start = time.monotonic()
        ticket = itertools.count()

        def client() -> None:
            while not stop.is_set():
                at = start + next(ticket) / rate
                time.sleep(max(0.0, at - time.monotonic()))
                if stop.is_set():
                    return
                self.run(self.new(datetime.now(UTC) + timedelta(seconds=due_ahead)))

        workers = [threading.Thread(target=client, daemon=True) for _ in range(threads)]
        for worker in workers:
            worker.start()
        return workers


def _problem_code(response: httpx.Response) -> str | None:
    try:
        return response.json().get("code")
    except ValueError:
        return None


def run_all(call, items: list, threads: int) -> None:
    queue = list(reversed(items))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                item = queue.pop()
            call(item)

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


# -- the run ---------------------------------------------------------------------------


class Failover:
    def __init__(self, plan: Plan, mode: str, seed: int):
        self.plan, self.mode = plan, mode
        self.pair = self._make_servers()
        self.system: System | None = None
        self.seed = seed
        self.marks: dict[str, datetime] = {}
        self.pause_target = PAUSE_TARGET
        self.lead_rate = 150.0
        self.figures: dict[str, float] = {}

    def _make_servers(self):
        return ReplicatedPostgres(synchronous=self.mode != "async")

    @property
    def url(self) -> str:
        """The engine's DATABASE_URL: every server, read-write wanted."""
        return self.pair.url

    def start(self) -> None:
        self.pair.start()
        config = Config.from_env({**ENGINE, "DATABASE_URL": self.url})
        with connect(config) as conn:
            migrate(conn)
            ensure_partitions(conn, config)
            api_key, _ = create_api_key(conn, "failover")
        self.system = System(self.url, dict(ENGINE), worker_processes=None, worker_threads=None)
        ceiling = int(ENGINE["GATEWAY_RATE_LIMIT"])
        self.system.start_gateway(rate_limit_per_s=2 * ceiling, latency_ms=5)
        port = free_port()
        web = self.system.procs.start("web", web_args(port))
        self.system.start_engine()
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/readyz", web, timeout=60)
        self.clients = Clients(base, api_key, self.seed)
        print(f"DATABASE_URL={self.url}")
        print(f"logs: {self.system.logdir}")

    def stop(self) -> None:
        if self.system is not None:
            self.system.stop()
        self.pair.destroy()

    def run(self) -> None:
        plan = self.plan
        # Creating the spike through the API takes about this long (at 150/s;
        # a loaded machine is slower: --lead-rate).
        lead = plan.spike / self.lead_rate + 5
        spike_at = (datetime.now(UTC) + timedelta(seconds=lead)).replace(microsecond=0)
        self.clients.spike(plan.spike, spike_at)
        print(f"created {plan.spike} payments through the API, due at {spike_at:%H:%M:%S}")
        stop = threading.Event()
        # Due far enough ahead that a create retried through the pause is still
        # in the future when it lands (else its body would fail validation).
        due_ahead = self.due_ahead()
        loaders = self.clients.load(plan.rate, due_ahead, stop)
        self._sleep_until(spike_at + timedelta(seconds=plan.fault_after))
        if self.mode == "standby-loss":
            self._lose_standby()
        else:
            self._fail_over()
        time.sleep(plan.load_after)
        stop.set()
        for loader in loaders:
            loader.join()
        self.marks["load_end"] = datetime.now(UTC)
        self.last_due = max(datetime.fromisoformat(c.body["dueAt"]) for c in self.clients.creates)
        print(
            f"API load: {len(self.clients.creates) - plan.spike} creates at {plan.rate:.0f}/s"
            f" beside the spike, until {self.marks['load_end']:%H:%M:%S}"
        )

    def due_ahead(self) -> float:
        """How far ahead the load's creates are due: far enough that one
        retried through the whole pause is still in the future when it lands."""
        return 15.0 if self.mode != "standby-loss" else self.plan.standby_down + 20.0

    def _fail_over(self) -> None:
        if self.plan.lag > 0:
            self.marks["stall"] = datetime.now(UTC)
            self.pair.stall_sender()
            print(
                f"  {_hms(self.marks['stall'])} WAL sender stalled: the standby trails by "
                f"{self.plan.lag:.1f} s when the primary dies"
            )
            time.sleep(self.plan.lag)
        self.marks["kill"] = datetime.now(UTC)
        self.pair.kill_primary()
        # Anything stamped after this came from the new primary.
        self.marks["dead"] = datetime.now(UTC)
        print(f"  {_hms(self.marks['kill'])} primary SIGKILLed (port {self.pair.killed[-1].port})")
        time.sleep(self.plan.promote_after)
        self.marks["promote"] = datetime.now(UTC)
        took = self.pair.promote()
        print(
            f"  {_hms(self.marks['promote'])} standby promoted (port {self.pair.primary.port}) "
            f"in {took:.2f} s"
        )
        if self.plan.rejoin:
            time.sleep(5)
            started = time.monotonic()
            self.pair.rejoin_killed()
            self.marks["rejoin"] = datetime.now(UTC)
            print(
                f"  {_hms(self.marks['rejoin'])} killed primary rewound (pg_rewind) and "
                f"streaming as the new {'synchronous ' if self.pair.synchronous else ''}"
                f"standby, {time.monotonic() - started:.1f} s"
            )

    def _lose_standby(self) -> None:
        self.marks["kill"] = datetime.now(UTC)
        self.pair.stop_standby()
        self.marks["dead"] = datetime.now(UTC)
        print(f"  {_hms(self.marks['kill'])} standby SIGKILLed; the primary lives")
        time.sleep(self.plan.standby_down)
        self.marks["back"] = datetime.now(UTC)
        self.pair.start_standby()
        print(f"  {_hms(self.marks['back'])} standby started again, streaming")

    @staticmethod
    def _sleep_until(when: datetime) -> None:
        time.sleep(max(0.0, (when - datetime.now(UTC)).total_seconds()))

    # -------------------------------------------------------------- drain and check

    def deadline(self) -> datetime:
        """When every payment must be terminal: the last one's due time, plus
        the pause, a lease expiry for each claim the fault cut off (x1.5 for
        the reaper's pace), the retry schedule with jitter and a call timeout
        per try, and the whole run's payments at the gateway's ceiling."""
        lease = float(ENGINE["LEASE_SECONDS"])
        delays = [float(d.rstrip("s")) for d in ENGINE["RETRY_DELAYS"].split(",")]
        retry = sum(delays) * 1.2 + (len(delays) + 1) * float(ENGINE["GATEWAY_TIMEOUT_SECONDS"])
        backlog = len(self.clients.creates) / float(ENGINE["GATEWAY_RATE_LIMIT"])
        outage = self.plan.standby_down if self.mode == "standby-loss" else 0.0
        seconds = self.pause_target + outage + 2 * lease * 1.5 + retry + backlog + 30
        return max(self.last_due, self.marks["load_end"]) + timedelta(seconds=seconds)

    def drain(self) -> bool:
        deadline = self.deadline()
        until = self._until()
        while datetime.now(UTC) < deadline:
            try:
                with connect(Config(database_url=self.url)) as conn:
                    left = conn.execute(QUERIES["failover_open"], {"until": until}).fetchone()
                if left["n"] == 0:
                    print(f"all terminal at {_hms(datetime.now(UTC))} (deadline {_hms(deadline)})")
                    return True
            except Exception as exc:  # noqa: BLE001 - report and keep waiting
                print(f"  drain check failed: {exc}")
            time.sleep(1)
        return False

    def _until(self) -> datetime:
        return self.last_due + timedelta(seconds=60)

    def check(self, drained: bool) -> list[tuple[str, object, bool]]:
        assert self.system is not None
        ledger = self.system.ledger()
        with connect(Config(database_url=self.url)) as conn:
            rows = {
                str(r["id"]): r
                for r in conn.execute(QUERIES["failover_payments"], {"until": self._until()})
            }
            around = conn.execute(
                QUERIES["failover_claims_around"],
                {"before": self.marks["kill"], "after": self.marks.get("back", self.marks["dead"])},
            ).fetchone()
            counts = conn.execute(QUERIES["failover_counts"]).fetchone()
            completed_at = {
                str(r["payment_id"]): r["at"]
                for r in conn.execute(QUERIES["failover_completed_at"])
            }
        creates = self.clients.creates
        answered = [c for c in creates if c.payment_id]
        never = [c for c in creates if not c.payment_id]
        lost = [c for c in answered if c.payment_id not in rows]
        per_payee = Counter(r["payee"] for r in rows.values())
        duplicated = [c for c in answered if per_payee[c.body["payee"]] > 1]
        per_key = charges_per_key(ledger)
        succeeded = [c for c in ledger if c["status"] == "succeeded"]
        charged = sum(c["amount"] for c in succeeded)
        completed = sum(r["amount_minor"] for r in rows.values() if r["status"] == "COMPLETED")
        orphan_charges = [c for c in succeeded if c["reference"] not in rows]
        states = Counter(
            r["status"] + (f" {r['failure_reason']}" if r["failure_reason"] else "")
            for r in rows.values()
        )
        print("final states: " + ", ".join(f"{k} {v}" for k, v in sorted(states.items())))
        print(
            f"gateway: {len(succeeded)} charges; attempt rows {counts['attempts']}, "
            f"{counts['lease_expired_rows']} marked LEASE_EXPIRED (claims cut off by the fault)"
        )
        dead = self.marks["dead"]
        reasked = [
            c
            for c in succeeded
            if datetime.fromisoformat(c["created_at"]) < dead
            and completed_at.get(c["reference"], dead) > dead
        ]
        print(
            f"charges made before the fault and recorded after it (the next attempt asked "
            f"the gateway again with the same key, which answered with that charge): "
            f"{len(reasked)}"
        )
        pauses = self._pauses(around)
        self._report_requests()
        # A create retried through a pause longer than its lead time ends in a
        # 400 (its dueAt has passed): the key is looked up first, so that
        # answer means no payment was made, and none may exist.
        refused = [c for c in never if c.tries and c.tries[-1].status == 400]
        unanswered = [c for c in never if c not in refused]
        refused_but_made = [c for c in refused if per_payee[c.body["payee"]] > 0]
        results: list[tuple[str, object, bool]] = [
            ("creates with no final answer (60 s of retries)", len(unanswered), not unanswered),
            ("creates refused once their dueAt passed (shown)", len(refused), True),
            (
                "refused creates that exist anyway",
                len(refused_but_made),
                not refused_but_made,
            ),
        ]
        if self.mode == "async":
            print(
                f"LOST with asynchronous replication: {len(lost)} creates answered 201 and "
                f"missing after the failover"
                + (f" (e.g. {', '.join(c.key for c in lost[:5])})" if lost else "")
            )
            print(
                f"charges for a payment the new primary does not have (reconciliation "
                f"pages them): {len(orphan_charges)}"
            )
            results.append(
                (
                    "creates answered 201 and lost (asynchronous: shown, not a check)",
                    len(lost),
                    True,
                )
            )
        else:
            results.append(("creates answered 201 and missing afterwards", len(lost), not lost))
        results += [
            ("payments per retried create's key > 1", len(duplicated), not duplicated),
            (
                "max charges per idempotency key (<= 1)",
                max(per_key.values(), default=0),
                max(per_key.values(), default=0) <= 1,
            ),
            (
                "payments not terminal by the deadline",
                sum(1 for r in rows.values() if r["status"] in ("PENDING", "PROCESSING")),
                drained,
            ),
            ("attempt rows left IN_FLIGHT", counts["in_flight"], counts["in_flight"] == 0),
            (
                "sum charged - sum COMPLETED (minor units)",
                charged - completed,
                charged == completed or (self.mode == "async" and bool(orphan_charges)),
            ),
            ("answers that were 500", self._count_status(500), self._count_status(500) == 0),
        ]
        for name, seconds in pauses.items():
            results.append((name, f"{seconds:.1f} s", seconds < self.pause_target))
        results += self._fault_checks()
        return results

    def _fault_checks(self) -> list[tuple[str, object, bool]]:
        """What the fault itself must not cause: the killed primary back as a primary."""
        if self.mode == "standby-loss":
            return []
        killed_primary = any(server.is_primary() for server in self.pair.killed) or (
            "rejoin" in self.marks
            and self.pair.standby is not None
            and self.pair.standby.is_primary()
        )
        return [("the killed primary came back as a primary", killed_primary, not killed_primary)]

    def _pauses(self, around: dict) -> dict[str, float]:
        """Seconds from the fault (standby loss: from the standby's return)
        until claims, gateway calls and creates went on."""
        kill = self.marks["kill"]
        since = self.marks.get("back", kill)
        name = "from the standby's return" if "back" in self.marks else "from the kill"
        sent_after = self.marks.get("back", self.marks["dead"])
        first_create = min(
            (
                t.answered
                for c in self.clients.creates
                for t in c.tries
                if t.status == 201 and t.sent > sent_after
            ),
            default=None,
        )
        figures = {}
        for what, moment in (
            ("claims", around["first_claim_after"]),
            ("gateway calls", around["first_call_after"]),
            ("creates", first_create),
        ):
            if moment is None:
                print(f"{what}: none after the fault")
                figures[f"{what} paused, {name}"] = float("inf")
                continue
            paused = (moment - since).total_seconds()
            figures[f"{what} paused, {name}"] = paused
            extra = ""
            if "promote" in self.marks:
                extra = (
                    f" ({(moment - self.marks['promote']).total_seconds():.1f} s from the promotion"
                )
                if "stall" in self.marks:
                    extra += (
                        f", {(moment - self.marks['stall']).total_seconds():.1f} s from "
                        "the standby's stall"
                    )
                extra += ")"
            if "back" in self.marks:
                extra = f" ({(moment - kill).total_seconds():.1f} s from the standby's loss)"
            print(f"{what} went on {paused:.1f} s {name}{extra}")
        if around["last_claim_before"] is not None:
            before = (kill - around["last_claim_before"]).total_seconds()
            print(f"last claim before the fault: {before:.2f} s before it")
        return figures

    def _report_requests(self) -> None:
        kill = self.marks["kill"]
        end = self.marks.get("back", kill) + timedelta(seconds=self.pause_target * 2)
        failed = [
            t
            for c in self.clients.creates
            for t in c.tries
            if t.status != 201 and kill - timedelta(seconds=30) <= t.sent <= end
        ]
        kinds = Counter(f"{t.status or 'no answer'} {t.code}".strip() for t in failed)
        print(
            f"create requests that failed around the fault: {len(failed)}"
            + (
                " (" + ", ".join(f"{k}: {v}" for k, v in kinds.most_common()) + ")"
                if failed
                else ""
            )
        )
        if failed:
            slowest = max(failed, key=lambda t: t.seconds)
            print(
                f"  slowest failed request: {slowest.seconds:.1f} s ({slowest.status} "
                f"{slowest.code})"
            )
        retried = [c for c in self.clients.creates if len(c.tries) > 1 and c.payment_id]
        replayed = sum(c.replayed for c in retried)
        print(
            f"creates retried with their key: {len(retried)}; the retry found the first try's "
            f"payment (Idempotent-Replayed) for {replayed}, created it for "
            f"{len(retried) - replayed}"
        )
        slow_ok = [
            t.seconds
            for c in self.clients.creates
            for t in c.tries
            if t.status == 201 and kill <= t.answered <= end
        ]
        if slow_ok:
            print(f"slowest 201 around the fault: {max(slow_ok):.1f} s")

    def _count_status(self, status: int) -> int:
        return sum(1 for c in self.clients.creates for t in c.tries if t.status == status)


def _hms(when: datetime) -> str:
    return when.strftime("%H:%M:%S.%f")[:-3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="the CI form")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--async",
        dest="asynchronous",
        action="store_true",
        help="asynchronous replication: what a failover loses",
    )
    mode.add_argument(
        "--standby-loss", action="store_true", help="the standby dies while the primary lives"
    )
    parser.add_argument("--spike", type=int)
    parser.add_argument(
        "--promote-after", type=float, help="seconds from the kill to the promotion"
    )
    parser.add_argument(
        "--lag",
        type=float,
        help=(
            "stall the primary's WAL sender this many seconds before the kill, so the standby "
            "trails by that much (default 1; 0: a clean kill)"
        ),
    )
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument(
        "--lead-rate",
        type=float,
        default=150.0,
        help="creates/s the spike's lead time assumes (lower on a loaded machine)",
    )
    patroni = parser.add_argument_group("under Patroni (bench.failover_patroni)")
    patroni.add_argument("--patroni", action="store_true", help="Patroni and etcd decide")
    patroni.add_argument(
        "--fault",
        choices=("postmaster", "agent", "partition"),
        default="postmaster",
        help="what hits the leader",
    )
    patroni.add_argument(
        "--timing",
        choices=("default", "tuned"),
        default="tuned",
        help="Patroni's ttl/loop_wait/retry_timeout: 30/10/10 or 10/2/3",
    )
    patroni.add_argument("--strict", action="store_true", help="synchronous_mode_strict")
    patroni.add_argument("--members", type=int, default=2, help="PostgreSQL members (2 or 3)")
    patroni.add_argument(
        "--agent-down", type=float, help="--fault agent: seconds until the agent is started again"
    )
    args = parser.parse_args()
    plan = dataclasses.replace(SHORT if args.short else FULL)
    if args.spike:
        plan.spike = args.spike
    if args.promote_after is not None:
        plan.promote_after = args.promote_after
    if args.lag is not None:
        plan.lag = args.lag
    kind = "async" if args.asynchronous else "standby-loss" if args.standby_loss else "sync"
    if args.patroni:
        from bench.failover_patroni import PatroniFailover
        from bench.patroni import DEFAULT, TUNED

        kind = f"patroni {args.fault}"
        run: Failover = PatroniFailover(
            plan,
            args.fault,
            args.seed,
            timing=TUNED if args.timing == "tuned" else DEFAULT,
            strict=args.strict,
            members=args.members,
            agent_down=args.agent_down,
        )
    else:
        run = Failover(plan, kind, args.seed)
    run.lead_rate = args.lead_rate
    print(f"failover plan ({kind}): {plan}")
    started = time.monotonic()
    try:
        run.start()
        run.run()
        drained = run.drain()
        results = run.check(drained)
    finally:
        run.stop()
    failed = False
    for name, value, ok in results:
        print(f"  [{'ok' if ok else 'FAIL'}] {name}: {value}")
        failed |= not ok
    print(
        f"failover ({kind}) took {time.monotonic() - started:.0f}s: "
        f"{'FAILED' if failed else 'passed'}"
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop() still runs
    main()
