"""No request body, actor argument or payer/payee id leaves in a Sentry event."""

from __future__ import annotations

import time
import uuid

import dramatiq
import sentry_sdk
from dramatiq.brokers.stub import StubBroker

from web import close_app

# Made at run time: a literal would also appear in the source context Sentry
# sends for the test's own frames.
SECRET_PAYER = f"payer-{uuid.uuid4().hex}"
SECRET_PAYEE = f"payee-{uuid.uuid4().hex}"
SECRET_KEY = f"idem-{uuid.uuid4().hex}"


def test_a_failing_request_leaks_no_body_or_ids(config, sentry, alice):
    from web import create_app

    app = create_app(config)

    @app.post("/v1/boom")
    def boom():
        raise RuntimeError("kaboom")

    try:
        response = app.test_client().post(
            "/v1/boom",
            json={"payer": SECRET_PAYER, "payee": SECRET_PAYEE, "amount": 1},
            headers={**alice, "Idempotency-Key": SECRET_KEY},
        )
    finally:
        close_app(app)
    assert response.status_code == 500
    sentry_sdk.flush()
    events = sentry.events()
    assert events, "the error reached Sentry"
    text = sentry.text()
    assert "kaboom" in text
    for secret in (SECRET_PAYER, SECRET_PAYEE, alice["Authorization"].split()[1], SECRET_KEY):
        assert secret not in text


def test_a_failing_request_leaks_no_query_string(config, sentry, alice):
    from web import create_app

    app = create_app(config)

    @app.get("/v1/boom")
    def boom():
        raise RuntimeError("kaboom")

    try:
        response = app.test_client().get(
            f"/v1/boom?payer={SECRET_PAYER}",
            headers={**alice, "Referer": f"http://x/console/payments?payer={SECRET_PAYER}"},
        )
    finally:
        close_app(app)
    assert response.status_code == 500
    sentry_sdk.flush()
    (event,) = sentry.events()
    assert event["request"]["url"].endswith("/v1/boom")
    assert "query_string" not in event["request"]
    assert SECRET_PAYER not in sentry.text()


def test_a_failing_actor_leaks_no_arguments(sentry):
    broker = StubBroker()  # created after init: the integration patched it
    broker.emit_after("process_boot")

    @dramatiq.actor(broker=broker, max_retries=0)
    def charge(payer, payee):
        raise RuntimeError("actor failed")

    worker = dramatiq.Worker(broker, worker_timeout=100)
    worker.start()
    try:
        charge.send(SECRET_PAYER, SECRET_PAYEE)
        broker.join(charge.queue_name, fail_fast=False)
        worker.join()
    finally:
        worker.stop()
    sentry_sdk.flush()
    deadline = time.monotonic() + 5
    while not sentry.events() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sentry.events(), "the actor's failure reached Sentry"
    text = sentry.text()
    assert "actor failed" in text
    assert SECRET_PAYER not in text and SECRET_PAYEE not in text
