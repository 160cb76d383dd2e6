"""The payment-method check in the web process as the Procfile runs it
(gunicorn's gevent worker) against the fake's Stripe surface: while Stripe
refuses (429) and the shared call window is full, creates answer within the
check's deadline (503 PROCESSOR_UNAVAILABLE, nothing written) and the worker
keeps answering /healthz (docs/customers.md)."""

from __future__ import annotations

import json
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
def web(config, gateway, tmp_path):
    port = free_port()
    group = ProcessGroup(
        tmp_path,
        {
            "DATABASE_URL": config.database_url,
            "REDIS_URL": config.redis_url,
            "REDIS_NAMESPACE": config.redis_namespace,
            "SENTRY_DSN": "",
            "GATEWAY": "stripe",
            "STRIPE_API_KEY": STRIPE_API_KEY,
            "STRIPE_API_BASE": gateway.stripe_url,
            "PAYMENT_METHOD_CHECK_SECONDS": str(CHECK_SECONDS),
            # one call a second in the window every process shares: the
            # creates' asks wait for tokens
            "GATEWAY_RATE_LIMIT": "1",
        },
    )
    proc = group.start("web", web_args(port, workers=1))
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/healthz", proc)
    yield url
    group.stop()


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


def test_creates_answer_within_the_deadline_while_stripe_refuses(web, gateway, make_key, conn):
    key = make_key("alice")
    gateway.faults(rate_limit_per_s=1)  # Stripe answers 429 past one call a second
    answers: list[tuple[int, str, float]] = []
    health: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(f"{web}/healthz", timeout=15) as answer:
                    answered = answer.status == 200
            except OSError:  # no answer in time: the worker is stuck
                answered = False
            health.append(time.monotonic() - started if answered else float("inf"))
            time.sleep(0.1)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    threads = [
        threading.Thread(target=lambda i=i: answers.append(_create(web, key, i)))
        for i in range(CREATES)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    time.sleep(2 * CHECK_SECONDS)  # and after: the asks left behind end too
    stop.set()
    prober.join(30)

    assert len(answers) == CREATES
    for status, text, seconds in answers:
        assert status in (201, 503), text
        if status == 503:
            assert json.loads(text)["code"] == "PROCESSOR_UNAVAILABLE"
        assert seconds < CHECK_SECONDS + MARGIN_SECONDS, (status, seconds)
    assert any(status == 503 for status, _, _ in answers)  # the window did run dry
    refused = sum(status == 503 for status, _, _ in answers)
    created = conn.execute("SELECT count(*) AS n FROM payments").fetchone()["n"]
    assert created == CREATES - refused  # a refused create wrote nothing
    assert health and max(health) < MARGIN_SECONDS, health
