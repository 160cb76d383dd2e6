"""Slow clients against the web process: the threaded worker the Procfile
ran before (gunicorn gthread, 5 workers x 4 threads, no keep-alive) beside
the one it runs now (gunicorn's gevent worker with a header deadline and
``web/intake.py``'s body deadline), each on a private database.

For each server, in one run:

1. usual latency: ``--probes`` sequential ``GET /healthz`` and creates
   (``POST /v1/scheduled-payments``), each on a new connection, p50/p99;
2. create throughput at saturation: ``wrk``, ``--connections`` connections,
   ``--seconds`` after a warm-up (bench.api_saturation's script: a new
   Idempotency-Key per request);
3. ``--slow`` slow-header connections (one header line every 2 s, never
   finishing) and ``--slow`` slow-body connections (a create announcing
   10,000 bytes, sending one every 2 s) are opened and *held*: a socket the
   server closes is reopened at once, as an attacker would. While they are
   held, 1 and 2 again.

A probe waits at most 2 s (counted as failed beyond), a probe phase at most
``--probe-seconds`` or 0.1 s a probe (the longer), wrk 10 s; every phase
is bounded in time; everything is on 127.0.0.1. The figures compare within
the run only: the machine is shared, so absolute numbers move between runs.

    python -m bench.slowloris [--slow 200] [--seconds 10] [--probes 200]
        [--connections 32] [--probe-seconds 10] [--only gevent]
    python -m bench.slowloris --smoke    # 20 + 20 slow connections, 2 s phases, 4 s probes
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import selectors
import shutil
import socket
import statistics
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.api_saturation import Wrk
from bench.harness import REDIS_URL, SMOKE_ENV, UNLIMITED_API, private_database
from devtools.procs import ProcessGroup, free_port, threaded_web_args, wait_http, web_args
from paycron.config import Config
from paycron.store.apikeys import create_api_key
from paycron.store.db import connect

PROBE_TIMEOUT = 2.0
SEND_EVERY = 2.0


class SlowClients:
    """``count`` slow-header and ``count`` slow-body connections to
    127.0.0.1:``port``, held open (reopened when the server closes one) by
    one thread until :meth:`stop`."""

    def __init__(self, port: int, count: int):
        self.port, self.count = port, count
        self.reopened = {"header": 0, "body": 0}
        self.answers: dict[str, int] = {}
        self._stop = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, kind: str) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.connect_ex(("127.0.0.1", self.port))
        except OSError:
            sock.close()
            return
        if kind == "header":
            pending = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
        else:
            pending = (
                b"POST /v1/scheduled-payments HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 10000\r\n\r\n"
            )
        state = {"kind": kind, "first": pending, "next": time.monotonic() + SEND_EVERY}
        self._selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, state)

    def _close(self, sock: socket.socket, reopen: bool) -> None:
        kind = self._selector.get_key(sock).data["kind"]
        self._selector.unregister(sock)
        sock.close()
        if reopen and not self._stop.is_set():
            self.reopened[kind] += 1
            self._open(kind)

    def _run(self) -> None:
        for _ in range(self.count):
            self._open("header")
            self._open("body")
        while not self._stop.is_set():
            now = time.monotonic()
            for key, mask in self._selector.select(timeout=0.2):
                sock, state = key.fileobj, key.data
                if mask & selectors.EVENT_READ:
                    try:
                        data = sock.recv(4096)
                    except OSError:
                        data = b""
                    if data[:9].startswith(b"HTTP/1."):
                        status = data[9:12].decode(errors="replace")
                        self.answers[status] = self.answers.get(status, 0) + 1
                    self._close(sock, reopen=True)
                    continue
                if mask & selectors.EVENT_WRITE and state["first"]:
                    try:
                        sock.send(state["first"])
                    except OSError:
                        self._close(sock, reopen=True)
                        continue
                    state["first"] = b""
                    self._selector.modify(sock, selectors.EVENT_READ, state)
            for key in list(self._selector.get_map().values()):
                state = key.data
                if not state["first"] and state["next"] <= now:
                    state["next"] = now + SEND_EVERY
                    line = b"X-a: b\r\n" if state["kind"] == "header" else b"1"
                    try:
                        key.fileobj.send(line)
                    except OSError:
                        self._close(key.fileobj, reopen=True)

    def start(self) -> None:
        self._thread.start()
        time.sleep(1.0)  # let them connect and start sending

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()
        self._selector.close()


@dataclass
class Probes:
    latencies_ms: list[float] = field(default_factory=list)
    failed: int = 0

    def p(self, q: int) -> str:
        if not self.latencies_ms:
            return "—"
        ordered = sorted(self.latencies_ms)
        return f"{ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]:.1f}"

    def describe(self) -> str:
        n = len(self.latencies_ms) + self.failed
        median = f"{statistics.median(self.latencies_ms):.1f}" if self.latencies_ms else "—"
        return f"p50 {median} ms, p99 {self.p(99)} ms, failed {self.failed}/{n}"


def probe(port: int, token: str, count: int, *, create: bool, budget: float) -> Probes:
    """``count`` sequential requests on new connections, at most ``budget`` seconds."""
    result = Probes()
    due = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    stop_at = time.monotonic() + budget
    for n in range(count):
        if time.monotonic() > stop_at:
            result.failed += count - n
            break
        started = time.monotonic()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT)
            if create:
                body = json.dumps({"payee": "shop", "amount": 100 + n, "dueAt": due})
                conn.request(
                    "POST",
                    "/v1/scheduled-payments",
                    body,
                    {
                        "Authorization": f"Bearer {token}",
                        "Content-Type": "application/json",
                        "Idempotency-Key": f"probe-{uuid.uuid4().hex}",
                    },
                )
            else:
                conn.request("GET", "/healthz")
            status = conn.getresponse().status
            conn.close()
        except (OSError, http.client.HTTPException):
            result.failed += 1
            continue
        if status in (200, 201):
            result.latencies_ms.append(1000 * (time.monotonic() - started))
        else:
            result.failed += 1
    return result


@dataclass
class Figures:
    name: str
    command: str
    healthz: Probes
    create: Probes
    rate: float
    errors: int
    healthz_slow: Probes
    create_slow: Probes
    rate_slow: float
    errors_slow: int
    reopened: dict
    slow_answers: dict


def measure(name: str, args_of, env: dict, token: str, args, workdir: Path) -> Figures:
    port = free_port()
    group = ProcessGroup(workdir, env)
    server_args = args_of(port)
    proc = group.start(name, server_args)
    wrk = Wrk(token, workdir)
    url = f"http://127.0.0.1:{port}"
    budget = max(args.probe_seconds, args.probes * 0.1)
    try:
        wait_http(f"{url}/healthz", proc, timeout=120)
        wrk.run(url, seconds=2, connections=args.connections)  # warm-up
        healthz = probe(port, token, args.probes, create=False, budget=budget)
        create = probe(port, token, args.probes, create=True, budget=budget)
        sat = wrk.run(url, seconds=args.seconds, connections=args.connections)
        slow = SlowClients(port, args.slow)
        slow.start()
        try:
            healthz_slow = probe(port, token, args.probes, create=False, budget=budget)
            create_slow = probe(port, token, args.probes, create=True, budget=budget)
            sat_slow = wrk.run(url, seconds=args.seconds, connections=args.connections)
        finally:
            slow.stop()
    finally:
        group.stop()
    command = " ".join(["gunicorn", *server_args[2:]])
    return Figures(
        name,
        command,
        healthz,
        create,
        sat.rate,
        sat.errors,
        healthz_slow,
        create_slow,
        sat_slow.rate,
        sat_slow.errors,
        slow.reopened,
        slow.answers,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=200, help="slow connections of each kind")
    parser.add_argument("--seconds", type=float, default=10.0, help="each saturation phase")
    parser.add_argument("--probes", type=int, default=200, help="requests per latency probe")
    parser.add_argument("--connections", type=int, default=32, help="wrk's connections")
    parser.add_argument(
        "--probe-seconds", type=float, default=10.0, help="the least a probe phase may take"
    )
    parser.add_argument("--only", choices=("gthread", "gevent"), default=None)
    parser.add_argument("--smoke", action="store_true", help="a short run for CI")
    args = parser.parse_args()
    if args.smoke:
        args.slow, args.seconds, args.probes, args.connections = 20, 2.0, 20, 8
        args.probe_seconds = 4.0  # a held server's probes each wait 2 s
        os.environ.update(SMOKE_ENV)  # a month of partitions, not a year's
    args.slow = min(args.slow, 1000)  # bounded: at most 2,000 sockets
    servers = [
        ("gthread", "before: gthread 5 x 4, no keep-alive", threaded_web_args),
        ("gevent", "after: the Procfile (gevent)", web_args),
    ]
    if args.only:
        servers = [s for s in servers if s[0] == args.only]
    workdir = Path(tempfile.mkdtemp(prefix="paycron-slowloris-"))
    namespace = f"paycron-bench-{uuid.uuid4().hex[:8]}"
    results: list[Figures] = []
    with private_database() as url:
        with connect(Config(database_url=url)) as conn:
            token, _ = create_api_key(conn, "bench-client")
        env = {
            "DATABASE_URL": url,
            "REDIS_URL": REDIS_URL,
            "REDIS_NAMESPACE": namespace,
            "GATEWAY_URL": "http://127.0.0.1:9",
            "SENTRY_DSN": "",
            **UNLIMITED_API,
        }
        try:
            for _, label, args_of in servers:
                results.append(measure(label, args_of, env, token, args, workdir))
        finally:
            import redis

            client = redis.Redis.from_url(REDIS_URL)
            for key in client.scan_iter(match=f"{namespace}*", count=1000):
                client.delete(key)
    shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"slowloris: {args.slow} slow-header + {args.slow} slow-body connections held "
        f"(one byte or header line every {SEND_EVERY:g} s, reopened when closed); probes: "
        f"{args.probes} sequential requests, new connection each, {PROBE_TIMEOUT:g} s timeout; "
        f"saturation: wrk {args.connections} connections, {args.seconds:g} s; "
        f"{os.cpu_count()} cores, shared machine"
    )
    for r in results:
        print(f"\n== {r.name}\n   {r.command}")
        print(f"   /healthz           usual: {r.healthz.describe()}")
        print(f"   /healthz   slow held: {r.healthz_slow.describe()}")
        print(f"   create             usual: {r.create.describe()}")
        print(f"   create     slow held: {r.create_slow.describe()}")
        drop = 1 - r.rate_slow / r.rate if r.rate else 1.0
        print(
            f"   creates/s at saturation: {r.rate:.0f} (errors {r.errors}) -> "
            f"{r.rate_slow:.0f} with slow clients held (errors {r.errors_slow}); drop {drop:.0%}"
        )
        print(
            f"   slow sockets the server closed (then reopened): {r.reopened['header']} "
            f"slow-header, {r.reopened['body']} slow-body; answers read before the close: "
            f"{r.slow_answers or 'none'}"
        )
    if len(results) == 2:
        before, after = results
        held = (
            f"{after.rate_slow / before.rate_slow:.2f}"
            if before.rate_slow
            else f"{after.rate_slow:.0f}/s against none"
        )
        print(
            f"\ncreates/s at saturation, after / before (no slow clients): "
            f"{after.rate / before.rate:.2f}; with slow clients held: {held}"
        )


if __name__ == "__main__":
    main()
