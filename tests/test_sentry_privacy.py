"""No payer or payee in any field of a Sentry event (SPEC §14): not in the
formatted log message, not in breadcrumbs made from earlier log lines, not in
exception values (Postgres puts the failing row in its DETAIL)."""

from __future__ import annotations

import logging
import uuid

import psycopg
import pytest
import sentry_sdk

from paycron import transitions
from tests.factories import insert_payment
from tests.support import CapturingTransport

# Made at run time: a literal would also appear in the source context Sentry
# sends for the test's own frames.
PAYER = f"payer-{uuid.uuid4().hex}"
PAYEE = f"payee-{uuid.uuid4().hex}"


@pytest.fixture
def captured(sentry, caplog):
    """A capturing Sentry client, and paycron's INFO lines logged (they are
    the breadcrumbs, as in the processes, which log at INFO)."""
    caplog.set_level(logging.INFO, logger="paycron")
    return sentry


def _row_the_database_refuses(conn) -> None:
    """An insert that fails with the payer and payee in the error's DETAIL."""
    insert_payment(conn, payer=PAYER, payee=PAYEE, status="FAILED", failure_reason=None)


def assert_no_ids(transport: CapturingTransport) -> str:
    sentry_sdk.flush()
    assert transport.events(), "the error reached Sentry"
    text = transport.text()
    assert PAYER not in text and PAYEE not in text
    return text


def test_a_logged_error_and_the_breadcrumbs_before_it_carry_no_ids(conn, captured):
    payment = insert_payment(conn, payer=PAYER, payee=PAYEE)
    transitions.cancel(conn, payment["id"], actor=PAYER)  # logs "transition ... by=<payer>"
    log = logging.getLogger("paycron.execution")
    try:
        _row_the_database_refuses(conn)
    except psycopg.errors.CheckViolation:
        log.exception("recording failed payer=%s payee=%s", PAYER, PAYEE)

    text = assert_no_ids(captured)
    [event] = captured.events()
    assert event["logentry"]["message"] == "recording failed payer=%s payee=%s"
    [crumb] = [c for c in event["breadcrumbs"]["values"] if c["category"] == "paycron.transitions"]
    assert crumb["message"] == "transition payment=%s from=%s to=%s%s"  # the template
    [exc] = event["exception"]["values"]
    assert exc["type"] == "CheckViolation" and "violates check constraint" in exc["value"]
    assert "CheckViolation" in text


def test_a_failing_request_after_a_cancel_carries_no_ids(config, conn, captured):
    from web import create_app

    app = create_app(config)
    payment = insert_payment(conn, payer=PAYER, payee=PAYEE)

    @app.post("/v1/boom")
    def boom():
        with app.extensions["paycron.pool"].connection() as db:
            transitions.cancel(db, payment["id"], actor=PAYER)
            _row_the_database_refuses(db)  # unhandled: a 500 and a Sentry event

    try:
        response = app.test_client().post("/v1/boom")
    finally:
        app.extensions["paycron.pool"].close()
    assert response.status_code == 500
    text = assert_no_ids(captured)
    assert "violates check constraint" in text and "transition payment=%s" in text
