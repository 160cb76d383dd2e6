"""Helpers several test files need: a clock the test moves by hand, a
Sentry transport that keeps what it would have sent, a webhook endpoint
that records what it receives, and a processor that answers as a test
scripts it, over real HTTP, and a wait until a payment event is where the
webhook relay and the events feed can read it."""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from psycopg import sql
from sentry_sdk.transport import Transport


class Clock:
    """The one clock tests hand to a part that takes one.

    ``clock()`` is seconds, for ``time.time``/``time.monotonic`` parameters
    (``CircuitBreaker(clock=...)``, ``PrincipalCache(monotonic=...)``);
    ``clock.utc`` is the same instant as an aware UTC datetime, for
    ``create_app(clock=clock.utc)``. Stopped (the default), time passes only
    when the test advances it; ``running=True``, it is real time plus what
    the test advanced (for a server a browser drives, whose sessions age
    while the test runs)."""

    def __init__(self, start: float | None = None, *, running: bool = False):
        self.running = running
        self.base = time.time() if start is None else start
        self.offset = 0.0

    def __call__(self) -> float:
        return (time.time() if self.running else self.base) + self.offset

    def utc(self) -> datetime:
        return datetime.fromtimestamp(self(), UTC)

    def advance(self, seconds: float = 0.0, **delta: float) -> None:
        """Move time on by ``seconds`` plus ``timedelta(**delta)`` (minutes=61)."""
        self.offset += seconds + timedelta(**delta).total_seconds()


class CapturingTransport(Transport):
    """Keeps every envelope Sentry would send."""

    def __init__(self, options=None):
        super().__init__(options)
        self.envelopes = []

    def capture_envelope(self, envelope):
        self.envelopes.append(envelope)

    def text(self) -> str:
        """Everything sent, as text: what must not contain a secret."""
        parts = []
        for envelope in self.envelopes:
            for item in envelope.items:
                parts.append(item.payload.get_bytes().decode(errors="replace"))
        return "\n".join(parts)

    def events(self) -> list[dict]:
        found = []
        for envelope in self.envelopes:
            for item in envelope.items:
                if item.type == "event":
                    found.append(json.loads(item.payload.get_bytes()))
        return found


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler of the test servers: no access log, and an answer
    in one call."""

    def answer(self, status: int, payload: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@dataclass(frozen=True)
class Delivery:
    """One POST a :class:`WebhookReceiver` received, and how it answered."""

    at: float  # time.monotonic() when it arrived
    path: str  # the request target: path and query
    headers: Message  # read case-insensitively, as HTTP names are
    body: bytes
    status: int
    verified: Any = None  # what the receiver's ``verify`` said of it, as it arrived

    def json(self) -> Any:
        return json.loads(self.body)


class WebhookReceiver:
    """The webhook endpoint of every test: a real HTTP/1.1 server (keep-alive,
    as real receivers are) in the test process that records each POST as a
    :class:`Delivery`.

    It answers the statuses in ``statuses`` in turn (a test may queue more at
    any time), then 200; ``hang_seconds`` holds every answer that long, or
    until :meth:`close`. ``verify(headers, body)``, when set, runs as each
    delivery arrives (a signature check with the secret of that moment).
    ``tls``: it serves HTTPS and records the server name each handshake asked
    for in ``server_names``. ``host``/``port``: where it listens (loopback)."""

    def __init__(
        self,
        *,
        statuses: Iterable[int] = (),
        hang_seconds: float = 0.0,
        path: str = "/hooks",
        tls: ssl.SSLContext | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        self.statuses = list(statuses)
        self.hang_seconds = hang_seconds
        self.path = path
        self.verify: Callable[[Message, bytes], Any] | None = None
        self.deliveries: list[Delivery] = []
        self.server_names: list[str | None] = []
        self._changed = threading.Condition()
        self._released = threading.Event()
        receiver = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = receiver._received(self.path, self.headers, body)
                if receiver.hang_seconds:
                    receiver._released.wait(receiver.hang_seconds)
                self.answer(status, b"ok")

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        if tls is not None:
            tls.sni_callback = lambda sock, name, context: self.server_names.append(name)
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self._base = f"{'https' if tls is not None else 'http'}://{host}"

    def _received(self, target: str, headers: Message, body: bytes) -> int:
        verified = self.verify(headers, body) if self.verify else None
        with self._changed:
            status = self.statuses.pop(0) if self.statuses else 200
            self.deliveries.append(
                Delivery(time.monotonic(), target, headers, body, status, verified)
            )
            self._changed.notify_all()
        return status

    @property
    def port(self) -> int:
        return self.server.server_port

    @property
    def url(self) -> str:
        return f"{self._base}:{self.port}{self.path}"

    def events(self, *, answered_ok: bool = False) -> list[Any]:
        """The bodies received, parsed, in arrival order (only those answered
        2xx when ``answered_ok``)."""
        with self._changed:
            return [d.json() for d in self.deliveries if not answered_ok or d.status < 300]

    def wait_for(self, count: int, timeout: float = 5.0) -> list[Delivery]:
        """The first ``count`` deliveries, once they have arrived."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.deliveries) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(self.deliveries)} deliveries, wanted {count}")
                self._changed.wait(left)
            return list(self.deliveries[:count])

    def close(self) -> None:
        self._released.set()
        self.server.shutdown()
        self.server.server_close()


def serve_on_loopback(
    handler: type[BaseHTTPRequestHandler], *, host: str = "127.0.0.1", port: int = 0
) -> ThreadingHTTPServer:
    """A threaded HTTP server on loopback, serving in a daemon thread; the
    caller shuts it down (``server.shutdown(); server.server_close()``)."""
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    server.block_on_close = False
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


#: One scripted answer: (HTTP status, headers, body bytes).
Answer = tuple[int, dict, bytes]


class ScriptedProcessor:
    """A gateway on loopback that answers each charge as the test says, by
    its amount: ``answers[amount]`` is an :data:`Answer` or a function of the
    request body returning one (it may block, to hold a call in flight).
    ``GET /v1/charges?reference=`` answers ``charges[reference]`` (default
    none). Every request is recorded in ``requests``."""

    def __init__(self):
        self.answers: dict[int, Answer | Callable[[dict], Answer]] = {}
        self.charges: dict[str, list[dict]] = {}
        self.requests: list[tuple[str, str, dict | None]] = []
        gateway = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                gateway.requests.append(("POST", self.path, body))
                answer = gateway.answers[body["amount"]]
                status, headers, payload = answer(body) if callable(answer) else answer
                self.answer(status, payload, headers)

            def do_GET(self):
                url = urlsplit(self.path)
                gateway.requests.append(("GET", url.path, None))
                reference = parse_qs(url.query).get("reference", [""])[0]
                payload = json.dumps({"data": gateway.charges.get(reference, [])}).encode()
                self.answer(200, payload, {"Content-Type": "application/json"})

        self.server = serve_on_loopback(Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def charge_requests(self) -> int:
        return sum(1 for method, _, _ in self.requests if method == "POST")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def refusing_writes_of(conn, customer: str) -> Iterator[None]:
    """While open, Postgres refuses every write of a payment naming
    ``customer`` (its insert or update, and an update of its dead letter)
    with an error quoting the payment's payer, payee, customer and payment
    method, the way Postgres quotes a value it refuses: ``invalid input
    syntax for type uuid: "<payer> <payee> <customer> <payment method>"``.
    For the privacy tests: data in an error's message must not leave."""
    name = sql.Identifier(f"refuse_{uuid.uuid4().hex[:12]}")
    literal = sql.Literal(customer)
    conn.execute(
        sql.SQL("""
        CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_TABLE_NAME = 'dead_letters' THEN
                PERFORM (p.payer || ' ' || p.payee || ' ' || p.customer || ' '
                         || p.payment_method)::uuid
                FROM payments p WHERE p.id = NEW.payment_id AND p.customer = {customer};
            ELSIF NEW.customer = {customer} THEN
                PERFORM (NEW.payer || ' ' || NEW.payee || ' ' || NEW.customer || ' '
                         || NEW.payment_method)::uuid;
            END IF;
            RETURN NEW;
        END $$""").format(name=name, customer=literal)
    )
    for table in ("payments", "dead_letters"):
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER {name} BEFORE INSERT OR UPDATE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION {name}()"
            ).format(name=name, table=sql.Identifier(table))
        )
    try:
        yield
    finally:
        for table in ("payments", "dead_letters"):
            conn.execute(
                sql.SQL("DROP TRIGGER {name} ON {table}").format(
                    name=name, table=sql.Identifier(table)
                )
            )
        conn.execute(sql.SQL("DROP FUNCTION {name}()").format(name=name))


class TricklingServer:
    """A real HTTP server on loopback that answers every request with
    ``status`` and ``payload`` one byte every ``interval`` seconds, status
    line and headers included (the slow-loris answer a socket read timeout
    never trips on). ``hung_up`` counts answers whose client left before the
    last byte; ``requests`` counts requests received."""

    def __init__(self, payload: bytes, *, status: int = 200, interval: float = 0.25):
        self.requests = 0
        self.hung_up = 0
        self._stop = threading.Event()
        server = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def _trickle(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                server.requests += 1
                head = (
                    f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
                ).encode()
                try:
                    for i in range(len(head + payload)):
                        self.wfile.write((head + payload)[i : i + 1])
                        self.wfile.flush()
                        if server._stop.wait(interval):
                            return
                except OSError:  # the client hung up: what a deadline does
                    server.hung_up += 1
                self.close_connection = True

            do_GET = do_POST = _trickle

        self.server = serve_on_loopback(Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()


#: How long a test waits for a payment event to become sendable. The relay
#: and the events feed read only events below the snapshot's xmin, and that
#: is the server's, not the database's: every write transaction anywhere on
#: the shared server that began before the event must end first (a
#: benchmark seeding its database or a DROP DATABASE holds it for seconds,
#: longer on a loaded machine). A wait on that condition, not a timing.
SENDABLE_WITHIN_SECONDS = 120.0


def wait_until_sendable(conn, event_id: int, timeout: float = SENDABLE_WITHIN_SECONDS) -> float:
    """Wait until payment event ``event_id`` is below the snapshot's xmin,
    where the relay and the feed can read it; the ``time.monotonic()`` at
    which it was seen so (a test times what follows from then on)."""
    deadline = time.monotonic() + timeout
    while not conn.execute(
        "SELECT txid < pg_snapshot_xmin(pg_current_snapshot()) AS sendable"
        " FROM payment_events WHERE id = %s",
        (event_id,),
    ).fetchone()["sendable"]:
        assert time.monotonic() < deadline, f"event {event_id} never became sendable"
        time.sleep(0.02)
    return time.monotonic()
