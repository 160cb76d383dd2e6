"""Helpers several test files need: a clock the test moves by hand, a
Sentry transport that keeps what it would have sent, and a gateway that
answers as a test scripts it, over real HTTP."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from sentry_sdk.transport import Transport


class Clock:
    """Stands in for ``time.time`` where a part takes a clock
    (``CircuitBreaker(clock=...)``): time passes only when the test says."""

    def __init__(self, start: float | None = None):
        self.now = time.time() if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


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


#: One scripted answer: (HTTP status, headers, body bytes).
Answer = tuple[int, dict, bytes]


class ScriptedGateway:
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

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                gateway.requests.append(("POST", self.path, body))
                answer = gateway.answers[body["amount"]]
                self._answer(*(answer(body) if callable(answer) else answer))

            def do_GET(self):
                url = urlsplit(self.path)
                gateway.requests.append(("GET", url.path, None))
                reference = parse_qs(url.query).get("reference", [""])[0]
                payload = json.dumps({"data": gateway.charges.get(reference, [])}).encode()
                self._answer(200, {"Content-Type": "application/json"}, payload)

            def _answer(self, status: int, headers: dict, payload: bytes):
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def charge_requests(self) -> int:
        return sum(1 for method, _, _ in self.requests if method == "POST")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
