"""No payer, payee, customer or payment method in any field of a Sentry
event (docs/design.md): not in the formatted log message, not in breadcrumbs made
from earlier log lines, not in exception values (Postgres puts the failing
row in its DETAIL, and a refused value in its message); and no customer or
payment method in a log line (docs/api.md)."""

from __future__ import annotations

import logging
import re
import uuid

import psycopg
import pytest
import sentry_sdk

from paycron.observability.sentry import redact_postgres_message, redact_tokens
from paycron.store import transitions
from tests.conftest import future, iso
from tests.factories import insert_payment
from tests.support import CapturingTransport, refusing_writes_of
from web import close_app

# Made at run time: a literal would also appear in the source context Sentry
# sends for the test's own frames.
PAYER = f"payer-{uuid.uuid4().hex}"
PAYEE = f"payee-{uuid.uuid4().hex}"
CUSTOMER = f"cus_{uuid.uuid4().hex}"
PAYMENT_METHOD = f"pm_{uuid.uuid4().hex}"
#: What Postgres says of the value refusing_writes_of makes it refuse.
REFUSED = 'invalid input syntax for type uuid: "[scrubbed]"'


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
    for secret in (PAYER, PAYEE, CUSTOMER, PAYMENT_METHOD):
        assert secret not in text
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
    assert exc["type"] == "CheckViolation"
    # the constraint it names stays: an identifier, not data
    assert re.fullmatch(
        r'new row for relation "payments_p\d{8}" violates check constraint '
        r'"payments_check\d*"',
        exc["value"],
    ), exc["value"]
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
        close_app(app)
    assert response.status_code == 500
    text = assert_no_ids(captured)
    assert "violates check constraint" in text and "transition payment=%s" in text


def test_a_failing_create_naming_a_customer_sends_and_prints_none_of_it(
    config, conn, captured, caplog, make_key
):
    """The create's insert is refused with the payer, payee, customer and
    payment method in Postgres's message: a 500, whose event and log lines
    say what failed without any of them."""
    from web import create_app

    app = create_app(config)
    headers = {"Authorization": f"Bearer {make_key(PAYER)}", "Idempotency-Key": "k"}
    body = {
        "payee": PAYEE,
        "amount": 2500,
        "dueAt": iso(future()),
        "paymentMethod": PAYMENT_METHOD,
        "customer": CUSTOMER,
    }
    try:
        with refusing_writes_of(conn, CUSTOMER):
            response = app.test_client().post("/v1/scheduled-payments", json=body, headers=headers)
    finally:
        close_app(app)
    assert response.status_code == 500
    assert_no_ids(captured)
    exceptions = [
        exc for event in captured.events() for exc in event.get("exception", {}).get("values", [])
    ]
    assert any(exc["value"] == REFUSED for exc in exceptions), exceptions
    assert REFUSED in caplog.text  # the traceback was printed, redacted
    assert CUSTOMER not in caplog.text and PAYMENT_METHOD not in caplog.text
    assert conn.execute("SELECT count(*) AS n FROM customers").fetchone()["n"] == 0


def test_a_logged_error_and_its_arguments_print_and_send_no_token(conn, captured, caplog):
    payment = insert_payment(
        conn, payer=PAYER, payee=PAYEE, customer=CUSTOMER, payment_method=PAYMENT_METHOD
    )
    log = logging.getLogger("paycron.execution")
    with refusing_writes_of(conn, CUSTOMER):
        try:
            transitions.cancel(conn, payment["id"], actor=PAYER)
        except psycopg.errors.InvalidTextRepresentation as exc:
            log.exception("cancel failed for customer %s: %s", CUSTOMER, exc)

    assert_no_ids(captured)
    [event] = captured.events()
    assert event["logentry"]["message"] == "cancel failed for customer %s: %s"
    assert [exc["value"] for exc in event["exception"]["values"]] == [REFUSED]
    [line] = [r for r in caplog.records if r.name == "paycron.execution"]
    assert line.getMessage() == f"cancel failed for customer cus_[scrubbed]: {REFUSED}"
    assert CUSTOMER not in caplog.text and PAYMENT_METHOD not in caplog.text
    assert PAYER not in caplog.text.split("Traceback")[1]  # nor in the printed traceback


@pytest.mark.parametrize(
    "text, redacted",
    [
        ("No such customer: 'cus_NffrFeUfNV2Hib'", "No such customer: 'cus_[scrubbed]'"),
        ("pm_card_visa declined", "pm_[scrubbed] declined"),
        ("card_1MvoiELkdIwHu7ixOeFGbN9D", "card_[scrubbed]"),
        ("card_declined: insufficient_funds", "card_declined: insufficient_funds"),  # codes stay
        ("a pm_ in a word: npm_modules", "a pm_ in a word: npm_modules"),
    ],
)
def test_processor_tokens_are_blanked_and_codes_are_not(text, redacted):
    assert redact_tokens(text) == redacted


def test_a_postgres_message_keeps_its_identifiers_and_loses_its_values(conn):
    with pytest.raises(psycopg.errors.InvalidTextRepresentation) as raised:
        conn.execute("SELECT %s::uuid", (CUSTOMER,))
    assert redact_postgres_message(str(raised.value), raised.value) == REFUSED
    # without the exception (no SQLSTATE, no identifiers known), every quote goes
    assert (
        redact_postgres_message('relation "x" violates "y"\nDETAIL: z')
        == 'relation "[scrubbed]" violates "[scrubbed]"'
    )
