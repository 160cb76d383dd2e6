"""The event loop's charge keeps its own connections to the processor
(paycron/processors/card/aio.py): reused only after a whole answer that
allows it, never more than ``max_connections``, and what reached the
processor told apart from what never left. Over real HTTP, from servers on
loopback; the answers both clients read alike are in test_gateway_answers.py
and test_bounded_answers.py."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer

import pytest

from paycron.domain.enums import Outcome
from paycron.domain.processing import CallResult, ChargeRequest
from paycron.processors.card import aio
from paycron.processors.card.aio import AsyncCardProcessor
from tests.processors.conftest import blocking_charge, loop_charge
from tests.support import QuietHandler, serve_on_loopback

CHARGED = (201, {"Content-Type": "application/json"}, b'{"id": "ch_1", "status": "succeeded"}')

#: Every case on each loop a worker may run the client on.
pytestmark = pytest.mark.usefixtures("any_loop")


class Processor:
    """A processor on loopback speaking HTTP/1.1 with keep-alive. ``answer``
    (request body -> status, headers, body) answers each charge; it may
    block, or return None to close the connection without answering.
    Counts connections, requests and connections open at once."""

    def __init__(
        self, answer: Callable[[dict], tuple[int, dict, bytes] | None] = lambda b: CHARGED
    ):
        self.answer = answer
        self.connections = 0
        self.requests: list[dict] = []
        self.open_now = 0
        self.open_max = 0
        self.closed_by_client = 0
        self._lock = threading.Lock()
        processor = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                with processor._lock:
                    processor.connections += 1
                    processor.open_now += 1
                    processor.open_max = max(processor.open_max, processor.open_now)

            def finish(self):
                with processor._lock:
                    processor.open_now -= 1
                super().finish()

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with processor._lock:
                    processor.requests.append({"body": body, "headers": dict(self.headers)})
                answered = processor.answer(body)
                if answered is None:
                    self.close_connection = True
                    return
                status, headers, payload = answered
                self.answer(status, payload, headers)

        self.server = serve_on_loopback(Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def processor():
    made: list[Processor] = []

    def make(answer=lambda body: CHARGED) -> Processor:
        made.append(Processor(answer))
        return made[-1]

    yield make
    for server in made:
        server.close()


def request(n: int = 1) -> ChargeRequest:
    return ChargeRequest(reference=f"p{n}", idempotency_key=f"p{n}", amount=100, currency="USD")


def charges(url: str, plan, *, max_connections: int = 64, timeout: float = 2.0) -> list:
    """Run ``plan(client)`` (a coroutine function) on a new loop with one
    client, closed after."""

    async def run():
        client = AsyncCardProcessor(url, timeout=timeout, max_connections=max_connections)
        try:
            return await plan(client)
        finally:
            await client.close()

    return asyncio.run(run())


def in_turn(count: int, *, pause: float = 0.0):
    async def plan(client: AsyncCardProcessor) -> list[CallResult]:
        results = []
        for n in range(count):
            results.append(await client.charge(request(n)))
            await asyncio.sleep(pause)
        return results

    return plan


def at_once(count: int, *, timeout: float | None = None):
    async def plan(client: AsyncCardProcessor) -> list[CallResult]:
        return list(
            await asyncio.gather(
                *(client.charge(request(n), timeout=timeout) for n in range(count))
            )
        )

    return plan


def test_one_connection_carries_charge_after_charge(processor):
    server = processor()
    results = charges(server.url, in_turn(5))
    assert [r.outcome for r in results] == [Outcome.SUCCEEDED] * 5
    assert server.connections == 1
    assert [r["headers"]["Idempotency-Key"] for r in server.requests] == [f"p{n}" for n in range(5)]
    assert server.requests[0]["body"] == {"amount": 100, "currency": "USD", "reference": "p0"}


def test_calls_at_once_never_open_more_sockets_than_allowed(processor):
    def slow(body):
        time.sleep(0.2)
        return CHARGED

    server = processor(slow)
    results = charges(server.url, at_once(9), max_connections=3)
    assert [r.outcome for r in results] == [Outcome.SUCCEEDED] * 9
    assert server.open_max <= 3
    assert server.connections == 3


def test_a_call_that_finds_no_socket_free_by_its_deadline_never_left(processor):
    release = threading.Event()

    def held(body):
        release.wait(5)
        return CHARGED

    server = processor(held)

    async def plan(client):
        first = asyncio.ensure_future(client.charge(request(1), timeout=3.0))
        await asyncio.sleep(0.2)  # the one socket is the first call's
        second = await client.charge(request(2), timeout=0.3)
        release.set()
        return [await first, second]

    first, second = charges(server.url, plan, max_connections=1)
    assert first.outcome is Outcome.SUCCEEDED
    assert (second.outcome, second.error_code, second.in_doubt) == (
        Outcome.RETRYABLE_ERROR,
        aio.NO_SOCKET_FREE,
        False,
    )
    assert [r["body"]["reference"] for r in server.requests] == ["p1"]


def test_a_refused_connection_never_left():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    [result] = charges(f"http://127.0.0.1:{port}", in_turn(1))
    assert (result.outcome, result.error_code, result.in_doubt) == (
        Outcome.RETRYABLE_ERROR,
        aio.CONNECT_FAILED,
        False,
    )


def test_a_connection_dropped_after_the_request_is_in_doubt(processor):
    server = processor(lambda body: None)
    [result] = charges(server.url, in_turn(1))
    assert (result.outcome, result.in_doubt) == (Outcome.AMBIGUOUS, True)
    assert len(server.requests) == 1


def test_a_call_cut_by_its_deadline_leaves_its_connection_closed(processor):
    """The late answer must never be read as the next call's."""
    first_call = threading.Event()

    def late_then_quick(body):
        if not first_call.is_set():
            first_call.set()
            time.sleep(1.0)
            return (201, {}, b'{"id": "ch_late"}')
        return (201, {}, b'{"id": "ch_next"}')

    server = processor(late_then_quick)

    async def plan(client):
        cut = await client.charge(request(1), timeout=0.3)
        # Before the late answer comes: on the same connection it would be
        # read as this call's.
        await asyncio.sleep(0.1)
        return [cut, await client.charge(request(2))]

    cut, following = charges(server.url, plan)
    assert (cut.outcome, cut.error_code, cut.in_doubt) == (
        Outcome.AMBIGUOUS,
        "DeadlineExceeded",
        True,
    )
    assert (following.outcome, following.gateway_ref) == (Outcome.SUCCEEDED, "ch_next")
    assert server.connections == 2


def test_a_connection_the_processor_closed_while_idle_is_not_used():
    class Closing(QuietHandler):
        """Answers as if it kept the connection, then closes it."""

        protocol_version = "HTTP/1.1"
        requests = 0

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            Closing.requests += 1
            self.answer(201, b'{"id": "ch_1"}', {"Content-Type": "application/json"})
            self.close_connection = True

    server = serve_on_loopback(Closing)
    try:
        results = charges(f"http://127.0.0.1:{server.server_port}", in_turn(3, pause=0.2))
    finally:
        server.shutdown()
        server.server_close()
    assert [(r.outcome, r.in_doubt) for r in results] == [(Outcome.SUCCEEDED, False)] * 3
    assert Closing.requests == 3


def test_an_answer_that_says_close_is_not_followed_on_its_connection(processor):
    server = processor(lambda body: (201, {"Connection": "close"}, b'{"id": "ch_1"}'))
    results = charges(server.url, in_turn(3))
    assert [r.outcome for r in results] == [Outcome.SUCCEEDED] * 3
    assert server.connections == 3


def test_a_connection_idle_too_long_is_not_used(processor, monkeypatch):
    server = processor()
    monkeypatch.setattr(aio, "IDLE_SECONDS", 0.1)
    results = charges(server.url, in_turn(3, pause=0.2))
    assert [r.outcome for r in results] == [Outcome.SUCCEEDED] * 3
    assert server.connections == 3


def test_bytes_after_an_answer_end_its_connection():
    class Chatty(QuietHandler):
        protocol_version = "HTTP/1.1"
        count = 0

        def setup(self):
            super().setup()
            Chatty.count += 1

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.answer(201, b'{"id": "ch_1"}', {})
            # A second answer nobody asked for, right behind the first.
            self.answer(201, b'{"id": "ch_forged"}', {})

    server = serve_on_loopback(Chatty)
    try:
        results = charges(f"http://127.0.0.1:{server.server_port}", in_turn(2, pause=0.2))
    finally:
        server.shutdown()
        server.server_close()
    assert [r.gateway_ref for r in results] == ["ch_1", "ch_1"]
    assert Chatty.count == 2


def test_an_oversized_head_is_not_read_whole(processor):
    server = processor(lambda body: (201, {"X-Pad": "x" * (aio.MAX_HEAD_BYTES + 10)}, b"{}"))
    [result] = charges(server.url, in_turn(1))
    assert (result.outcome, result.error_code, result.in_doubt) == (
        Outcome.AMBIGUOUS,
        "oversized_answer",
        True,
    )


@pytest.mark.parametrize(
    "status, headers, body, expected",
    [
        (201, {}, b'{"id": "ch_1"}', (Outcome.SUCCEEDED, None, False, False)),
        (
            402,
            {},
            b'{"error": {"code": "card_declined"}}',
            (Outcome.DECLINED, "card_declined", False, False),
        ),
        (409, {}, b"{}", (Outcome.KEY_IN_USE, "idempotency_key_in_use", True, False)),
        (
            503,
            {"idempotent-replayed": "true"},
            b"{}",
            (Outcome.RETRYABLE_ERROR, "http_503", True, True),
        ),
        (503, {}, b"{}", (Outcome.RETRYABLE_ERROR, "http_503", True, False)),
        (400, {}, b"{}", (Outcome.RETRYABLE_ERROR, "http_400", False, False)),
        (202, {}, b'{"id": "ch_1"}', (Outcome.AMBIGUOUS, "http_202", True, False)),
    ],
)
def test_both_clients_read_each_status_alike(processor, status, headers, body, expected):
    server = processor(lambda b: (status, headers, body))
    for charge in (blocking_charge, loop_charge):
        result = charge(server.url, request())
        assert (result.outcome, result.error_code, result.in_doubt, result.replayed) == expected


def _tls_server(tmp_path, monkeypatch, *, stalled: bool = False):
    """The processor over HTTPS with a self-signed certificate for
    processor.test, which the client trusts (SSL_CERT_FILE); ``stalled``:
    it reads each request and never answers."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=processor.test", "-addext",
            "subjectAltName=DNS:processor.test,IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            if stalled:
                time.sleep(5)
                return
            status, headers, body = CHARGED
            self.answer(status, body, headers)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def tls_processor(tmp_path, monkeypatch):
    server = _tls_server(tmp_path, monkeypatch)
    yield server.server_port
    server.shutdown()
    server.server_close()


@pytest.fixture
def tls_processor_stalled(tmp_path, monkeypatch):
    server = _tls_server(tmp_path, monkeypatch, stalled=True)
    yield server.server_port
    server.shutdown()
    server.server_close()


def test_charges_go_over_tls_to_a_processor_whose_certificate_is_trusted(tls_processor):
    results = charges(f"https://127.0.0.1:{tls_processor}", in_turn(2))
    assert [(r.outcome, r.gateway_ref) for r in results] == [(Outcome.SUCCEEDED, "ch_1")] * 2


def test_a_certificate_that_does_not_name_the_processor_is_refused_before_sending(
    tls_processor,
):
    [result] = charges(f"https://localhost:{tls_processor}", in_turn(1))
    assert (result.outcome, result.error_code, result.in_doubt) == (
        Outcome.RETRYABLE_ERROR,
        aio.CONNECT_FAILED,
        False,
    )


class Interim(QuietHandler):
    """Answers each charge with an interim 103 first, its final 201 (a
    charge id naming the request's reference) a moment later."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.wfile.write(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
        self.wfile.flush()
        time.sleep(0.2)
        self.answer(201, json.dumps({"id": f"ch_for_{body['reference']}"}).encode(), {})


def test_an_interim_answer_is_never_read_as_a_charges_answer():
    """Neither client takes the 103 for the charge's answer while the 201
    waits on the connection for the next request to read as its own."""
    server = serve_on_loopback(Interim)
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        from paycron.processors.card.client import CardProcessor

        blocking = CardProcessor(url, timeout=2)
        try:
            in_blocking = [blocking.charge(request(n)) for n in range(3)]
        finally:
            blocking.close()
        on_the_loop = charges(url, in_turn(3))
    finally:
        server.shutdown()
        server.server_close()
    for n, result in enumerate(in_blocking):
        # http.client skips only a 100: the 103 is in doubt, never a refusal.
        assert (result.outcome, result.error_code, result.in_doubt) == (
            Outcome.AMBIGUOUS,
            "http_103",
            True,
        ), n
    assert [(r.outcome, r.gateway_ref) for r in on_the_loop] == [
        (Outcome.SUCCEEDED, f"ch_for_p{n}") for n in range(3)
    ]


def test_an_answer_that_switches_protocols_is_in_doubt(processor):
    class Switching(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n")

    server = serve_on_loopback(Switching)
    try:
        [result] = charges(f"http://127.0.0.1:{server.server_port}", in_turn(1))
    finally:
        server.shutdown()
        server.server_close()
    assert (result.outcome, result.in_doubt) == (Outcome.AMBIGUOUS, True)


def test_one_endless_header_is_cut_at_the_bound():
    class Endless(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.wfile.write(b"HTTP/1.1 201 Created\r\nX-Pad: ")
            try:
                for _ in range(64):  # 4 MiB of one header, never ended
                    self.wfile.write(b"x" * (64 << 10))
            except OSError:
                pass  # the client cut it

    server = serve_on_loopback(Endless)
    try:
        [result] = charges(f"http://127.0.0.1:{server.server_port}", in_turn(1))
    finally:
        server.shutdown()
        server.server_close()
    assert (result.outcome, result.error_code, result.in_doubt) == (
        Outcome.AMBIGUOUS,
        "oversized_answer",
        True,
    )


def test_an_answer_ended_by_the_connection_is_in_doubt():
    """No length and no chunks: its end is the connection's, which httptools
    cannot tell from a drop. In doubt (looked up), never guessed."""

    class Unframed(QuietHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.wfile.write(b'HTTP/1.0 201 Created\r\n\r\n{"id": "ch_1"}')
            self.close_connection = True

    server = serve_on_loopback(Unframed)
    try:
        [result] = charges(f"http://127.0.0.1:{server.server_port}", in_turn(1))
    finally:
        server.shutdown()
        server.server_close()
    assert (result.outcome, result.in_doubt) == (Outcome.AMBIGUOUS, True)


def test_a_chunked_answers_trailers_never_replace_its_headers(processor):
    class Trailing(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.wfile.write(
                b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\n"
                b"Transfer-Encoding: chunked\r\nTrailer: Retry-After\r\n\r\n"
                b"2\r\n{}\r\n0\r\nRetry-After: 3600\r\n\r\n"
            )

    server = serve_on_loopback(Trailing)
    try:
        [result] = charges(f"http://127.0.0.1:{server.server_port}", in_turn(1))
    finally:
        server.shutdown()
        server.server_close()
    assert (result.outcome, result.retry_after) == (Outcome.RATE_LIMITED, 7.0)


def _sockets_to(port: int) -> int:
    """This process's open TCP sockets connected to ``port`` on loopback."""
    import os

    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            ours.add(target[8:-1])
    count = 0
    with open("/proc/self/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            remote_port = int(fields[2].split(":")[1], 16)
            if remote_port == port and fields[9] in ours:
                count += 1
    return count


def test_connections_cut_over_tls_are_closed_at_once(tls_processor_stalled):
    """A graceful TLS close waits (30 s) for a stalled processor's reply with
    its socket open: cut connections would pile up past ``max_connections``."""

    async def plan(client):
        results = [await client.charge(request(n), timeout=0.3) for n in range(4)]
        await asyncio.sleep(0.2)
        return results, _sockets_to(tls_processor_stalled)

    results, still_open = charges(
        f"https://127.0.0.1:{tls_processor_stalled}", plan, max_connections=1
    )
    assert [(r.outcome, r.in_doubt) for r in results] == [(Outcome.AMBIGUOUS, True)] * 4
    assert still_open == 0
