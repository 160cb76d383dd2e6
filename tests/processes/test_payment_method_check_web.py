"""The payment-method check in the web process as the Procfile runs it
(gunicorn's gevent worker): while Stripe refuses (429, the fake's Stripe
surface) with the shared call window full, or never answers, creates answer
within the check's deadline (503 PROCESSOR_UNAVAILABLE, nothing written) and
the worker keeps answering /healthz (docs/customers.md)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from devtools.fake_gateway import STRIPE_API_KEY
from devtools.procs import ProcessGroup, free_port, wait_http, web_args
from tests.conftest import future, iso

CHECK_SECONDS = 1.0
#: Generous: a worker whose hub is blocked answers many seconds late.
MARGIN_SECONDS = 3.0
CREATES = 8


@pytest.fixture
def web_on(config, tmp_path):
    """Start the web (one gevent worker) asking the Stripe at ``stripe_url``."""
    group = ProcessGroup(tmp_path)

    def start(stripe_url: str, **env: str) -> str:
        port = free_port()
        proc = group.start(
            "web",
            web_args(port, workers=1),
            {
                "DATABASE_URL": config.database_url,
                "REDIS_URL": config.redis_url,
                "REDIS_NAMESPACE": config.redis_namespace,
                "SENTRY_DSN": "",
                "GATEWAY": "stripe",
                "STRIPE_API_KEY": STRIPE_API_KEY,
                "STRIPE_API_BASE": stripe_url,
                "PAYMENT_METHOD_CHECK_SECONDS": str(CHECK_SECONDS),
                **env,
            },
        )
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/healthz", proc)
        return url

    yield start
    group.stop()


@pytest.fixture
def hanging_stripe():
    """An address that takes the connection and the request, and never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as listener:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def _create(url: str, key: str, i: int) -> tuple[int, str, float]:
    body = {
        "payee": "acme",
        "amount": 2500,
        "dueAt": iso(future()),
        "customer": f"cus_hang{i:04d}",
        "paymentMethod": "pm_card_visa",
    }
    request = urllib.request.Request(
        f"{url}/v1/scheduled-payments",
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "Idempotency-Key": f"hang-{i}",
        },
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            status, text = answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        status, text = refused.code, refused.read().decode()
    return status, text, time.monotonic() - started


def _load(url: str, key: str) -> tuple[list[tuple[int, str, float]], list[float]]:
    """``CREATES`` creates at once, each naming a pair the web has not seen,
    while /healthz is asked every 0.1 s: the answers (status, body, seconds)
    and each health answer's seconds (inf: none in time)."""
    answers: list[tuple[int, str, float]] = []
    health: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=15) as answer:
                    answered = answer.status == 200
            except OSError:  # no answer in time: the worker is stuck
                answered = False
            health.append(time.monotonic() - started if answered else float("inf"))
            time.sleep(0.1)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    threads = [
        threading.Thread(target=lambda i=i: answers.append(_create(url, key, i)))
        for i in range(CREATES)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    time.sleep(2 * CHECK_SECONDS)  # and after: the asks left behind end too
    stop.set()
    prober.join(30)
    return answers, health


def _within_deadline(answers, health, conn) -> int:
    """Assert every create answered 201 or 503 PROCESSOR_UNAVAILABLE within
    the deadline and margin, a refused one wrote nothing, and /healthz was
    answered throughout; the number refused."""
    assert len(answers) == CREATES  # none lost to a stuck or killed worker
    for status, text, seconds in answers:
        assert status in (201, 503), text
        if status == 503:
            assert json.loads(text)["code"] == "PROCESSOR_UNAVAILABLE"
        assert seconds < CHECK_SECONDS + MARGIN_SECONDS, (status, seconds)
    refused = sum(status == 503 for status, _, _ in answers)
    created = conn.execute("SELECT count(*) AS n FROM payments").fetchone()["n"]
    assert created == CREATES - refused  # a refused create wrote nothing
    assert health and max(health) < MARGIN_SECONDS, health
    return refused


def test_creates_answer_within_the_deadline_while_stripe_refuses(web_on, gateway, make_key, conn):
    # one call a second in the window every process shares, so the asks
    # wait for tokens; and Stripe answers 429 past one call a second
    url = web_on(gateway.stripe_url, GATEWAY_RATE_LIMIT="1")
    gateway.faults(rate_limit_per_s=1)
    answers, health = _load(url, make_key("alice"))
    assert _within_deadline(answers, health, conn) > 0  # the window did run dry


def test_creates_answer_within_the_deadline_while_stripe_hangs(
    web_on, hanging_stripe, make_key, conn
):
    url = web_on(hanging_stripe)
    answers, health = _load(url, make_key("alice"))
    assert _within_deadline(answers, health, conn) == CREATES
