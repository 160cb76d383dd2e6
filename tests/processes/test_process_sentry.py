"""Each process reports to Sentry under its own name (docs/operations.md), and
none of them sends a payer, payee, customer or payment method (docs/design.md).

Every process is started as the Procfile starts it, with ``SENTRY_DSN``
pointing at a local receiver of Sentry envelopes, and made to fail; the
events that arrive say which process sent them, and the scheduler's carry
no Dramatiq integration (it once borrowed the worker's wiring and reported
as "worker"). Then each is made to fail on a payment whose data Postgres
quotes in its error, after the process read and logged that payment: no
field of any event (message, logentry, breadcrumbs, exception values,
contexts, request) and no line it printed holds its customer or payment
method, and no event its payer or payee.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import subprocess
import sys
import time
import uuid
import zlib
from pathlib import Path

import pytest
from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker

from devtools.procs import stop
from paycron.engine.messages import EXECUTE_ACTOR, execute_message
from paycron.store.transitions import Claim
from tests.factories import insert_payment, park
from tests.support import QuietHandler, refusing_writes_of, serve_on_loopback

REPO_ROOT = Path(__file__).resolve().parents[2]
#: A port nothing listens on: connections to it are refused at once.
DEAD_URL_PORT = 9


class SentryReceiver:
    """A Sentry ingest endpoint on loopback: stores each envelope's events."""

    def __init__(self):
        self.events: list[dict] = []
        self.envelopes: list[str] = []  # everything received, as text
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                elif encoding == "br":
                    import brotli

                    body = brotli.decompress(body)
                receiver._store(body)
                self.answer(200, b"{}")

        self.server = serve_on_loopback(Handler)
        self.dsn = f"http://public@127.0.0.1:{self.server.server_port}/1"

    def _store(self, envelope: bytes) -> None:
        self.envelopes.append(envelope.decode("utf-8", "replace"))
        lines = envelope.split(b"\n")
        # header, then (item header, payload) pairs
        for header, payload in zip(lines[1::2], lines[2::2], strict=False):
            if json.loads(header).get("type") == "event":
                self.events.append(json.loads(payload))

    def wait_for_event(self, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.events:
                return self.events[0]
            time.sleep(0.1)
        raise AssertionError("no Sentry event arrived")

    def wait_for_exception(self, value: str, timeout: float = 30.0) -> dict:
        """The first event reporting an exception whose value is ``value``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in list(self.events):
                if any(
                    exc.get("value") == value
                    for exc in (event.get("exception") or {}).get("values", [])
                ):
                    return event
            time.sleep(0.1)
        seen = [
            exc.get("value")
            for event in self.events
            for exc in (event.get("exception") or {}).get("values", [])
        ]
        raise AssertionError(f"no event reported {value!r}; exceptions reported: {seen}")

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def receiver():
    with contextlib.closing(SentryReceiver()) as made:
        yield made


def _start(args: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.Popen:
    log = (tmp_path / "proc.log").open("ab")
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _env(config, receiver, **extra) -> dict[str, str]:
    import os

    return {
        **os.environ,
        "SENTRY_DSN": receiver.dsn,
        "DATABASE_URL": config.database_url,
        "REDIS_URL": config.redis_url,
        "REDIS_NAMESPACE": config.redis_namespace,
        **extra,
    }


def _names(event: dict) -> tuple[str, str, set[str]]:
    return (
        event["tags"]["component"],
        event["server_name"],
        set(event["sdk"].get("integrations", [])),
    )


def test_the_scheduler_reports_as_scheduler(config, receiver, tmp_path):
    # Redis refuses connections: the scheduler stops at start with one line,
    # which it also sends to Sentry.
    env = _env(config, receiver, REDIS_URL=f"redis://127.0.0.1:{DEAD_URL_PORT}/0")
    proc = _start(["-m", "scheduler"], env, tmp_path)
    try:
        component, server, integrations = _names(receiver.wait_for_event())
    finally:
        stop(proc)
    assert (component, server) == ("scheduler", "scheduler")
    assert "dramatiq" not in integrations


def test_the_worker_reports_as_worker(config, receiver, tmp_path):
    proc = _start(
        ["-m", "dramatiq", "tasks", "--processes", "1", "--threads", "1"],
        _env(config, receiver),
        tmp_path,
    )
    broker = RedisBroker(url=config.redis_url, namespace=f"{config.redis_namespace}-dramatiq")
    try:
        # A message the actor cannot decode: it raises, Dramatiq's integration reports it.
        broker.enqueue(
            Message(
                queue_name=config.queue_name,
                actor_name=EXECUTE_ACTOR,
                args=([["not-a-uuid", "not-a-time", 1]], False),
                kwargs={},
                options={},
                message_id=str(uuid.uuid4()),
            )
        )
        component, server, integrations = _names(receiver.wait_for_event(timeout=60))
    finally:
        stop(proc)
        broker.close()
    assert (component, server) == ("worker", "worker")
    assert "dramatiq" in integrations


def test_the_cli_reports_as_cli(config, receiver, tmp_path):
    # A database that refuses connections: the command says so in one line
    # (exit status 2), and sends that line to Sentry.
    bad_db = f"postgresql://postgres@127.0.0.1:{DEAD_URL_PORT}/none?connect_timeout=2"
    proc = _start(
        ["-m", "paycron.cli", "dlq", "list"], _env(config, receiver, DATABASE_URL=bad_db), tmp_path
    )
    assert proc.wait(timeout=60) != 0
    component, server, _ = _names(receiver.wait_for_event(timeout=5))
    assert (component, server) == ("cli", "cli")


# -- No payment's data in what a process sends or prints (docs/design.md) ------------

# Made at run time, so no source line Sentry sends can hold them.
PAYER = f"payer-{uuid.uuid4().hex}"
PAYEE = f"payee-{uuid.uuid4().hex}"
CUSTOMER = f"cus_{uuid.uuid4().hex}"
PAYMENT_METHOD = f"pm_{uuid.uuid4().hex}"
#: What Postgres says, redacted, of the write refusing_writes_of refuses.
REFUSED = 'invalid input syntax for type uuid: "[scrubbed]"'


def _payment(conn, **columns) -> dict:
    return insert_payment(
        conn, payer=PAYER, payee=PAYEE, customer=CUSTOMER, payment_method=PAYMENT_METHOD, **columns
    )


def _assert_private(receiver: SentryReceiver, component: str, log: Path) -> None:
    event = receiver.wait_for_exception(REFUSED, timeout=60)
    assert event["tags"]["component"] == component
    sent = "\n".join(receiver.envelopes)
    for secret in (PAYER, PAYEE, CUSTOMER, PAYMENT_METHOD):
        assert secret not in sent
    printed = log.read_text(errors="replace")
    assert REFUSED in printed  # it printed the error, redacted
    assert CUSTOMER not in printed and PAYMENT_METHOD not in printed


def _stop(proc: subprocess.Popen) -> None:
    """The process and everything it started (Dramatiq's worker processes):
    its whole process group, never only the master."""
    stop(proc)


def test_the_scheduler_sends_and_prints_no_payments_data(config, conn, receiver, tmp_path):
    _payment(conn)  # due: the sweep claims it, and Postgres refuses the claim
    with refusing_writes_of(conn, CUSTOMER):
        proc = _start(
            ["-m", "scheduler"],
            _env(config, receiver, GATEWAY_URL=f"http://127.0.0.1:{DEAD_URL_PORT}"),
            tmp_path,
        )
        try:
            _assert_private(receiver, "scheduler", tmp_path / "proc.log")
        finally:
            _stop(proc)


def test_the_worker_sends_and_prints_no_payments_data(config, conn, receiver, tmp_path):
    row = _payment(conn, status="PROCESSING", attempt=1)  # claimed: the worker starts it
    broker = RedisBroker(url=config.redis_url, namespace=f"{config.redis_namespace}-dramatiq")
    with refusing_writes_of(conn, CUSTOMER):
        proc = _start(
            ["-m", "dramatiq", "tasks", "--processes", "1", "--threads", "1"],
            _env(config, receiver, GATEWAY_URL=f"http://127.0.0.1:{DEAD_URL_PORT}"),
            tmp_path,
        )
        try:
            broker.enqueue(
                execute_message(
                    [Claim(row["id"], row["due_at"], 1)], probe=False, queue_name=config.queue_name
                )
            )
            _assert_private(receiver, "worker", tmp_path / "proc.log")
        finally:
            _stop(proc)
            broker.close()


def test_the_cli_sends_and_prints_no_payments_data(config, conn, receiver, tmp_path):
    row = park(conn, payer=PAYER, payee=PAYEE, customer=CUSTOMER, payment_method=PAYMENT_METHOD)
    with refusing_writes_of(conn, CUSTOMER):
        proc = _start(
            ["-m", "paycron.cli", "dlq", "dismiss", str(row["id"]), "--by", "ops"],
            _env(config, receiver),
            tmp_path,
        )
        try:
            assert proc.wait(timeout=60) != 0
            _assert_private(receiver, "cli", tmp_path / "proc.log")
        finally:
            _stop(proc)
