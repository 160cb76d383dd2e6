"""API saturation: creates/s of paycron's API under gunicorn on this
machine, beside bare Flask apps under the same gunicorn settings, then
create latency at half paycron's saturation rate. Targets: paycron >= 0.8 x
the durable floor (bare Flask + the create statement), the median of rounds
that measure every app in turn; p99 < 20 ms at half rate.

The floors (bench/bare_app.py): a bare endpoint that parses the JSON body and
answers 201; the same plus paycron's create statement through a psycopg
pool (the durable floor), whose wait for Postgres blocks its whole gevent
worker; and that floor again with its wait cooperative, as paycron's must be
(a create waiting on a row lock stalls only itself).

Servers: the Procfile's web command, as devtools.procs.web_args reads it
(gevent workers, 2 x cores + 1 of them), the same for every app, paycron's
on a private database.
Load: ``wrk`` (C, event loop: a few % of one core here) with a Lua script
that sends every create with its own Idempotency-Key, a bearer key made
with paycron.store.apikeys.create_api_key, and a dueAt a day ahead. Saturation
is closed-loop with ``--connections`` connections. The half-rate phase
paces ``--paced-connections`` connections with exponential think times
(wrk has no constant-rate mode; wrk2 is not packaged), calibrated by a short
pilot run to land near the target rate; the achieved rate is printed.

CPU per request of the server processes (gunicorn master + workers) and of
the database backends serving them is read from /proc.

    python -m bench.api_saturation [--rounds 3] [--seconds 10] [--connections 32]
        [--workers 5] [--threads 4]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from bench.harness import REDIS_URL, UNLIMITED_API, parse_args, private_database
from devtools.procs import ProcessGroup, free_port, wait_http, web_args
from paycron.config import Config
from paycron.store.apikeys import create_api_key
from paycron.store.db import connect

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

LUA = r"""
token = "@TOKEN@"
due = "@DUE@"
prefix = "@PREFIX@"
counter = 0
mean_delay = 0
threads_started = 0

function setup(thread)
  threads_started = threads_started + 1
  thread:set("tid", threads_started)
end

function init(args)
  if args[1] then mean_delay = tonumber(args[1]) end
  math.randomseed(tid * 1000003 + os.time())
end

function request()
  counter = counter + 1
  local body = '{"payee":"shop","amount":' .. (100 + counter % 1000) ..
               ',"dueAt":"' .. due .. '"}'
  return wrk.format("POST", "/v1/scheduled-payments", {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. token,
    ["Idempotency-Key"] = prefix .. "-" .. tid .. "-" .. counter,
  }, body)
end

function delay()
  if mean_delay <= 0 then return 0 end
  return math.floor(-math.log(1 - math.random()) * mean_delay + 0.5)
end

function done(summary, latency, requests)
  io.write(string.format(
    "RESULT requests=%d duration_us=%d status=%d connect=%d read=%d write=%d timeout=%d " ..
    "p50=%d p90=%d p99=%d max=%d mean=%.1f\n",
    summary.requests, summary.duration, summary.errors.status, summary.errors.connect,
    summary.errors.read, summary.errors.write, summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    latency.mean))
end
"""


@dataclass
class Result:
    requests: int
    seconds: float
    errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    server_cpu_s: float = 0.0
    db_cpu_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def cpu_ms_per_request(self) -> str:
        n = max(1, self.requests)
        return (
            f"server {1000 * self.server_cpu_s / n:.2f} ms + database "
            f"{1000 * self.db_cpu_s / n:.2f} ms CPU per request"
        )


def _proc_cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def session_cpu(session: int) -> float:
    """CPU seconds of every live process in a session (gunicorn and its workers)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return total


def backend_cpu(admin_url: str, dbname: str) -> float:
    """CPU seconds of the Postgres backends connected to ``dbname`` (same host)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        pids = [
            r[0]
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            )
        ]
    return sum(_proc_cpu(pid) for pid in pids)


class Server:
    """One gunicorn (the Procfile's web command) serving ``app``."""

    def __init__(
        self,
        name: str,
        app: str,
        env: dict[str, str],
        *,
        workers: int,
        threads: int,
        logdir: Path,
        keep_alive: int | None = None,
        worker_class: str | None = None,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = web_args(self.port, workers=workers, threads=threads)
        args[-1] = app
        if keep_alive is not None:
            if "--keep-alive" in args:
                args[args.index("--keep-alive") + 1] = str(keep_alive)
            else:
                args[-1:-1] = ["--keep-alive", str(keep_alive)]
        if worker_class is not None:
            args[args.index("--worker-class") + 1] = worker_class
        self.args = args
        self.group = ProcessGroup(logdir, env)
        self.proc = self.group.start(name, args)
        wait_http(f"{self.url}/healthz", self.proc)

    def cpu(self) -> float:
        return session_cpu(self.proc.pid)

    def stop(self) -> None:
        self.group.stop()


class Wrk:
    def __init__(self, token: str, workdir: Path):
        if shutil.which("wrk") is None:
            raise SystemExit("wrk is not installed: apt-get install -y wrk")
        self.token = token
        self.workdir = workdir
        self.due = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0).isoformat()
        self.runs = 0

    def run(
        self,
        url: str,
        *,
        seconds: float,
        connections: int,
        threads: int = 2,
        mean_delay_ms: float = 0.0,
        cpu=None,
    ) -> Result:
        self.runs += 1
        script = self.workdir / f"create-{self.runs}.lua"
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        script.write_text(
            LUA.replace("@TOKEN@", self.token)
            .replace("@DUE@", self.due)
            .replace("@PREFIX@", prefix)
        )
        before = cpu() if cpu else (0.0, 0.0)
        out = subprocess.run(
            [
                "wrk",
                "-t",
                str(threads),
                "-c",
                str(connections),
                "-d",
                f"{seconds:g}s",
                "--timeout",
                "10s",
                "-s",
                str(script),
                url,
                "--",
                f"{mean_delay_ms:.3f}",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        after = cpu() if cpu else (0.0, 0.0)
        match = re.search(r"^RESULT (.*)$", out, re.M)
        if match is None:
            raise RuntimeError(f"wrk said:\n{out}")
        f = {k: float(v) for k, v in (p.split("=") for p in match.group(1).split())}
        errors = int(f["status"] + f["connect"] + f["read"] + f["write"] + f["timeout"])
        return Result(
            requests=int(f["requests"]),
            seconds=f["duration_us"] / 1e6,
            errors=errors,
            p50_ms=f["p50"] / 1000,
            p90_ms=f["p90"] / 1000,
            p99_ms=f["p99"] / 1000,
            max_ms=f["max"] / 1000,
            mean_ms=f["mean"] / 1000,
            server_cpu_s=after[0] - before[0],
            db_cpu_s=after[1] - before[1],
        )


def saturate(server: Server, wrk: Wrk, args, cpu=None) -> Result:
    """Closed-loop creates/s of one server after a warm-up; stops the server."""
    try:
        wrk.run(server.url, seconds=3, connections=args.connections)
        return wrk.run(
            server.url,
            seconds=args.seconds,
            connections=args.connections,
            cpu=lambda: (server.cpu(), cpu() if cpu else 0.0),
        )
    finally:
        server.stop()


def describe(r: Result) -> str:
    return (
        f"{r.rate:7.0f} creates/s ({r.requests} in {r.seconds:.1f} s, non-201/errors "
        f"{r.errors}); latency p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, max "
        f"{r.max_ms:.1f} ms; {r.cpu_ms_per_request()}"
    )


BARE, FLOOR, COOPERATIVE, PAYCRON = (
    "bare Flask (parse JSON, 201)",
    "bare Flask + the create SQL",
    "  its wait cooperative",
    "paycron create",
)
#: The apps measured each round, in order: (label, log name, gunicorn app,
#: whether its database CPU counts).
APPS = (
    (BARE, "bare", "bench.bare_app:create_app()", False),
    (FLOOR, "bare-insert", "bench.bare_app:create_app(insert=True)", True),
    (
        COOPERATIVE,
        "bare-insert-cooperative",
        "bench.bare_app:create_app(insert=True, cooperative=True)",
        True,
    ),
    (PAYCRON, "web", "web:create_app()", True),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="length of each saturation measurement"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of saturation, each measuring every app in turn (ratios are per round)",
    )
    parser.add_argument("--latency-seconds", type=float, default=30.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--paced-connections", type=int, default=8)
    parser.add_argument("--workers", type=int, default=5, help="gunicorn --workers")
    parser.add_argument("--threads", type=int, default=4, help="gunicorn --threads")
    parser.add_argument(
        "--keep-alive",
        type=int,
        default=None,
        help="override gunicorn --keep-alive (default: the Procfile's)",
    )
    parser.add_argument(
        "--worker-class",
        default=None,
        help="override gunicorn --worker-class (default: the Procfile's)",
    )
    args = parse_args(
        parser,
        seconds=1.0,
        rounds=1,
        latency_seconds=1.0,
        connections=4,
        paced_connections=2,
        workers=1,
        threads=2,
    )
    workdir = Path(tempfile.mkdtemp(prefix="paycron-api-bench-"))
    namespace = f"paycron-bench-{uuid.uuid4().hex[:8]}"
    rounds: list[dict[str, Result]] = []
    with private_database() as url:
        with connect(Config(database_url=url)) as conn:
            token, _ = create_api_key(conn, "bench-client")
        dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        admin_url = psycopg.conninfo.make_conninfo(url, dbname="postgres")
        env = {
            "DATABASE_URL": url,
            "REDIS_URL": REDIS_URL,
            "REDIS_NAMESPACE": namespace,
            "GATEWAY_URL": "http://127.0.0.1:9",
            "SENTRY_DSN": "",
            **UNLIMITED_API,
        }
        wrk = Wrk(token, workdir)
        shape = {
            "workers": args.workers,
            "threads": args.threads,
            "logdir": workdir,
            "keep_alive": args.keep_alive,
            "worker_class": args.worker_class,
        }
        for n in range(args.rounds):
            measured: dict[str, Result] = {}
            # Each round starts one app later, so no app is always measured
            # on the fullest table or right after the same neighbour.
            for label, name, app, database in APPS[n % len(APPS) :] + APPS[: n % len(APPS)]:
                measured[label] = saturate(
                    Server(name, app, env, **shape),
                    wrk,
                    args,
                    cpu=(lambda: backend_cpu(admin_url, dbname)) if database else None,
                )
                print(f"round {n + 1} {label:29s}: {describe(measured[label])}", flush=True)
            rounds.append(measured)
        web = Server("web", "web:create_app()", env, **shape)
        try:

            def cpu():
                return web.cpu(), backend_cpu(admin_url, dbname)

            wrk.run(web.url, seconds=3, connections=args.connections)  # warm-up
            target = statistics.median(r[PAYCRON].rate for r in rounds) / 2
            c = args.paced_connections
            p50 = statistics.median(r[PAYCRON].p50_ms for r in rounds)
            # Each paced connection sends one request per (think time + latency).
            delay = max(1.0, c * 1000 / target - p50 / 4)
            pilot = wrk.run(web.url, seconds=5, connections=c, mean_delay_ms=delay)
            cycle = c * 1000 / pilot.rate  # ms per request per connection, as measured
            delay = max(1.0, delay + (c * 1000 / target - cycle))
            half = wrk.run(
                web.url, seconds=args.latency_seconds, connections=c, mean_delay_ms=delay, cpu=cpu
            )
            with connect(Config(database_url=url)) as conn:
                created = conn.execute("SELECT count(*) AS n FROM payments").fetchone()["n"]
        finally:
            web.stop()
            import redis

            client = redis.Redis.from_url(REDIS_URL)
            for key in client.scan_iter(match=f"{namespace}*", count=1000):
                client.delete(key)
    shutil.rmtree(workdir, ignore_errors=True)
    command = " ".join(["gunicorn", *web.args[2:-3], repr(web.args[-1])])
    as_procfile = (args.workers, args.threads, args.keep_alive, args.worker_class) == (
        5,
        4,
        None,
        None,
    )
    print(
        f"server: {command} ({'the Procfile' if as_procfile else 'overridden'}), same for "
        f"every app; {os.cpu_count()} cores"
    )
    print(
        f"load: wrk, 2 threads, {args.connections} connections, {args.seconds:g} s after a "
        f"3 s warm-up, {args.rounds} round(s) of every app in turn; a new Idempotency-Key "
        "per request"
    )

    def ratios(label: str) -> list[float]:
        return [r[PAYCRON].rate / r[label].rate for r in rounds]

    def summary(values: list[float]) -> str:
        each = ", ".join(f"{v:.2f}" for v in values)
        return f"median {statistics.median(values):.2f} (rounds: {each})"

    floor = ratios(FLOOR)
    print(
        f"paycron / bare + the create SQL (the durable floor): {summary(floor)}   "
        f"(target >= 0.8: {'met' if statistics.median(floor) >= 0.8 else 'MISSED'})"
    )
    print(
        "paycron / that floor with its wait cooperative, as paycron's must be: "
        f"{summary(ratios(COOPERATIVE))}"
    )
    print(f"paycron / bare Flask without a database: {summary(ratios(BARE))}")
    print(
        f"paycron at half saturation   : target {target:.0f}/s, achieved {half.rate:.0f}/s "
        f"({c} connections, exponential think time {delay:.1f} ms mean, "
        f"{args.latency_seconds:g} s): p50 {half.p50_ms:.1f} ms, p90 {half.p90_ms:.1f} ms, "
        f"p99 {half.p99_ms:.1f} ms, max {half.max_ms:.1f} ms, non-201/errors {half.errors}  "
        f"(target p99 < 20 ms: {'met' if half.p99_ms < 20 else 'MISSED'})"
    )
    print(f"payments created in the private database: {created}", file=sys.stderr)


if __name__ == "__main__":
    main()
