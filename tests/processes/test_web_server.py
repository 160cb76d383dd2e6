"""The web process as the Procfile runs it (gunicorn, gevent worker): slow
clients hold connections, not the server; a request's headers and body have
deadlines; the access log and the audit log reach the process's output."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

from devtools.procs import ProcessGroup, free_port, wait_http, web_args

#: A body must arrive within this in the test (the default is 10 s).
BODY_SECONDS = 2


@pytest.fixture
def web(config, tmp_path):
    port = free_port()
    group = ProcessGroup(
        tmp_path,
        {
            "DATABASE_URL": config.database_url,
            "REDIS_URL": config.redis_url,
            "REDIS_NAMESPACE": config.redis_namespace,
            "WEB_BODY_TIMEOUT_SECONDS": str(BODY_SECONDS),
            "SENTRY_DSN": "",
        },
    )
    proc = group.start("web", web_args(port, workers=1))
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/healthz", proc)
    yield port, url, tmp_path / "web.log"
    group.stop()


def _slow(port: int, first: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(first)
    return sock


def _closed_by_server(sock: socket.socket, within: float) -> bytes | None:
    """What the server answered before closing, or None if it kept the socket open."""
    sock.settimeout(within)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return received


def test_slow_clients_hold_no_worker_and_meet_their_deadlines(web):
    port, url, _ = web
    # One worker: with the threaded worker 4 of these took it down.
    headers = [_slow(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n") for _ in range(30)]
    bodies = [
        _slow(
            port,
            b"POST /v1/gateway-events/stripe HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
        )
        for _ in range(30)
    ]
    time.sleep(0.5)
    started = time.monotonic()
    with urllib.request.urlopen(f"{url}/healthz", timeout=5) as answer:
        assert answer.status == 200
    assert time.monotonic() - started < 2
    # the header deadline (--keep-alive) closes the slow-header sockets, without an answer
    assert all(_closed_by_server(s, within=8) is not None for s in headers)
    # the body deadline answers 408 (the Stripe endpoint is off here: the body is read first)
    answers = [_closed_by_server(s, within=BODY_SECONDS + 5) for s in bodies]
    assert all(a is not None and a.startswith(b"HTTP/1.1 408") for a in answers), answers[:2]
    for sock in headers + bodies:
        sock.close()


def test_a_chunked_body_over_the_limit_is_refused(web):
    port, _, _ = web
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        b"POST /v1/scheduled-payments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"x" * 8192
    try:
        for _ in range(10):  # 80 KiB > MAX_BODY_BYTES (64 KiB)
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the server may answer and close before the last chunk
    answer = _closed_by_server(sock, within=20)  # a busy CI boots workers slowly
    assert answer is not None and answer.startswith(b"HTTP/1.1 413"), answer


def test_the_access_log_and_the_audit_log_reach_the_output(web):
    _, url, log = web
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"{url}/v1/scheduled-payments?payer=acme-secret-ish", timeout=5)
    deadline = time.monotonic() + 20  # the access line follows the answer; CI is busy
    while time.monotonic() < deadline:
        text = log.read_text()
        # the access line itself: the audit line's "target" holds "GET /v1/…" too
        if '"event": "api.unauthorized"' in text and '"GET /v1/scheduled-payments HTTP' in text:
            break
        time.sleep(0.1)
    lines = log.read_text().splitlines()
    audit = [json.loads(line) for line in lines if line.startswith('{"time"')]
    assert any(a["event"] == "api.unauthorized" and a["remote_addr"] == "127.0.0.1" for a in audit)
    access = [line for line in lines if '"GET /v1/scheduled-payments HTTP/1.1" 401' in line]
    assert access, lines[-5:]
    assert "acme-secret-ish" not in log.read_text()  # no query string in either log
