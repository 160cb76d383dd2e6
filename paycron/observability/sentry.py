"""Sentry and logging set-up shared by every process.

Privacy (docs/design.md): no payer, payee, customer, payment method or key in
any Sentry event field, and no customer or payment method in a log line. Log lines
reach Sentry as their templates only; exceptions that quote data (Postgres
errors: the failing row, a refused value) keep their primary message with
the values taken out; and the processor's tokens (Stripe ``cus_…``, ``pm_…``)
are blanked wherever they appear, in an event or in a log line.
"""

from __future__ import annotations

import logging
import re
import sys
import traceback
from typing import Any, cast

from paycron.config import Config

#: Exception types whose message quotes data: Postgres errors carry the
#: failing row or key in a DETAIL line (payer, payee, customer, amounts) and
#: a refused value in the message itself (``invalid input syntax for type
#: uuid: "cus_…"``).
_DATA_QUOTING_MODULES = ("psycopg",)

#: Keys whose values never leave the process in a Sentry event.
_SCRUBBED_KEYS = {
    "payer",
    "payee",
    "actor",
    "authorization",
    "idempotency-key",
    "claims",
    "args",
    "kwargs",
    "data",
    "body",
    "customer",
    "payment_method",
    "paymentmethod",
    "payment-method",
}

#: A processor's customer or payment method as Stripe writes them: ``cus_…``,
#: ``pm_…`` (test ones too: ``pm_card_visa``), and the older payment-method
#: objects (cards, sources, bank accounts, tokens) by their long ids, so a
#: decline code such as ``card_declined`` stays.
_TOKEN = re.compile(r"\b(cus|pm)_[A-Za-z0-9_]+|\b(card|src|ba|tok)_[A-Za-z0-9]{14,}\b")
#: A quoted part of a Postgres message: an identifier, or a value.
_QUOTED = re.compile(r'"[^"]*"')
_BLANK = "[scrubbed]"


def redact_tokens(text: str) -> str:
    """``text`` with every processor token blanked (its prefix kept)."""
    return _TOKEN.sub(lambda m: f"{m.group(1) or m.group(2)}_{_BLANK}", text)


def _postgres_names(exc: BaseException) -> set[str]:
    """The identifiers a Postgres error names (never data): its constraint,
    table, column, schema and type."""
    diag = getattr(exc, "diag", None)
    names = (
        getattr(diag, attr, None)
        for attr in ("constraint_name", "table_name", "column_name", "schema_name", "datatype_name")
    )
    return {f'"{name}"' for name in names if name}


def redact_postgres_message(text: str, exc: BaseException | None = None) -> str:
    """A Postgres error's message as it may be shown: the primary message
    only (DETAIL quotes the row or key), its quoted parts blanked unless
    they are the error's own identifiers (``violates check constraint
    "payments_customer_check"`` stays; ``invalid input syntax for type uuid:
    "cus_…"`` loses the value). An error the client raised before reaching
    the server (no SQLSTATE: a refused connection) quotes no data."""
    primary = text.split("\n", 1)[0]
    if exc is not None and getattr(exc, "sqlstate", None) is None:
        return primary
    names = _postgres_names(exc) if exc is not None else set()
    return _QUOTED.sub(lambda m: m.group(0) if m.group(0) in names else f'"{_BLANK}"', primary)


def _quotes_data(exc_type: object) -> bool:
    return str(getattr(exc_type, "__module__", "") or "").startswith(_DATA_QUOTING_MODULES)


def scrub_breadcrumb(crumb: dict, hint: dict | None = None) -> dict | None:
    """A breadcrumb without data: a log line's crumb keeps its template
    (``transition payment=%s ... by=%s``), never the formatted line, whose
    values include payers; other crumbs (HTTP calls) lose their URL and data."""
    if str(crumb.get("category", "")).startswith("dramatiq"):
        return None  # its lines print messages with their arguments
    record = (hint or {}).get("log_record")
    crumb.pop("data", None)
    if isinstance(record, logging.LogRecord):
        crumb["message"] = redact_tokens(str(record.msg))
    elif crumb.get("type") == "log":
        crumb.pop("message", None)  # formatted, and no template to fall back on
    elif isinstance(crumb.get("message"), str):
        crumb["message"] = redact_tokens(crumb["message"])
    return crumb


def _chain(exc: BaseException | None) -> list[BaseException]:
    """An exception and those it was raised from or during, as Sentry lists them."""
    found: list[BaseException] = []
    while exc is not None and exc not in found:
        found.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return found


def _scrub_exception_value(exc: dict, raised: list[BaseException]) -> None:
    if str(exc.get("module") or "").startswith(_DATA_QUOTING_MODULES) and isinstance(
        exc.get("value"), str
    ):
        # the exception this entry describes, for its SQLSTATE and identifiers
        same = [e for e in raised if type(e).__name__ == exc.get("type")]
        exc["value"] = redact_postgres_message(exc["value"], same[0] if same else None)


def _redact_strings(value):
    """Every string in an event (messages, crumbs, exception values,
    contexts, tags, request) with processor tokens blanked."""
    if isinstance(value, str):
        return redact_tokens(value)
    if isinstance(value, dict):
        return {key: _redact_strings(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_redact_strings(item) for item in value]
    return value


def scrub(event: dict, hint: dict | None = None) -> dict | None:
    """Drop request bodies, actor arguments and payer/payee ids from an event.

    Log messages keep their template only (``logentry.message``), never the
    formatted text or its parameters. Dramatiq's own log lines print a
    failed message with its arguments, so events from its loggers are
    dropped whole (the Dramatiq integration reports the exception itself)
    and its breadcrumbs are removed.
    """
    if str(event.get("logger", "")).startswith("dramatiq"):
        return None
    crumbs = event.get("breadcrumbs")
    if isinstance(crumbs, dict) and isinstance(crumbs.get("values"), list):
        # Each crumb went through scrub_breadcrumb when it was recorded;
        # this drops whatever reached the scope another way.
        crumbs["values"] = [
            c
            for c in crumbs["values"]
            if isinstance(c, dict) and not str(c.get("category", "")).startswith("dramatiq")
        ]
        for crumb in crumbs["values"]:
            crumb.pop("data", None)
    logentry = event.get("logentry")
    if isinstance(logentry, dict):
        logentry.pop("params", None)  # values may be PII: the template stays
        logentry.pop("formatted", None)  # the template with those values in it
    request = event.get("request")
    if isinstance(request, dict):
        request.pop("data", None)
        request.pop("cookies", None)
        # a query string names payers (``?payer=…``): the path alone is kept
        request.pop("query_string", None)
        if isinstance(request.get("url"), str):
            request["url"] = request["url"].split("?", 1)[0]
        headers = request.get("headers")
        if isinstance(headers, dict):
            for name in list(headers):
                if name.lower() in _SCRUBBED_KEYS or name.lower() in ("cookie", "referer"):
                    headers[name] = "[scrubbed]"
    extra = event.get("extra")
    if isinstance(extra, dict):
        for name in list(extra):
            if name.lower() in _SCRUBBED_KEYS or name.startswith("dramatiq"):
                extra.pop(name)
    contexts = event.get("contexts")
    if isinstance(contexts, dict):
        contexts.pop("dramatiq", None)
    exc_info = (hint or {}).get("exc_info")
    raised = _chain(exc_info[1] if exc_info else None)
    for exc in (event.get("exception") or {}).get("values", []):
        _scrub_exception_value(exc, raised)
        for frame in (exc.get("stacktrace") or {}).get("frames", []):
            frame.pop("vars", None)  # locals carry payer ids and amounts
    event.pop("user", None)
    return _redact_strings(event)


class _RedactedRecord(logging.LogRecord):
    """A log record that prints no processor token and no data a Postgres
    error quotes (docs/api.md): string and exception arguments are redacted
    (the template stays, as Sentry's breadcrumbs need it), and the
    traceback a handler prints is made here, from redacted messages."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(self.args, tuple) and self.args:
            self.args = tuple(_redacted_argument(arg) for arg in self.args)
        elif isinstance(self.msg, str) and not self.args:
            # A message made whole before logging (the Stripe SDK's lines,
            # with the URL of a payment method it retrieves): no template to keep.
            self.msg = redact_tokens(self.msg)
        if self.exc_info and self.exc_info[1] is not None:
            self.exc_text = format_exception_redacted(self.exc_info[1])


def _redacted_argument(arg):
    if isinstance(arg, str):
        return redact_tokens(arg)
    if isinstance(arg, BaseException):
        return redact_tokens(
            redact_postgres_message(str(arg), arg) if _quotes_data(type(arg)) else str(arg)
        )
    return arg


def format_exception_redacted(exc: BaseException) -> str:
    """A traceback as logging prints one, with each exception's message
    redacted: a Postgres error's primary message without its values, and no
    processor token anywhere."""
    te = traceback.TracebackException.from_exception(exc)
    for part, raised in zip(_traceback_chain(te), _chain(exc), strict=False):
        if _quotes_data(part.exc_type) and isinstance(getattr(part, "_str", None), str):
            # ``_str`` is what format() prints: CPython's private field, hence the ignore.
            part._str = redact_postgres_message(part._str, raised)  # type: ignore[attr-defined]
    return redact_tokens("".join(te.format()).rstrip("\n"))


def _traceback_chain(te: traceback.TracebackException) -> list[traceback.TracebackException]:
    found: list[traceback.TracebackException] = []
    part: traceback.TracebackException | None = te
    while part is not None and part not in found:
        found.append(part)
        part = part.__cause__ or (None if part.__suppress_context__ else part.__context__)
    return found


def _print_redacted(exc_type, exc, tb) -> None:
    """``sys.excepthook``: a crash (the CLI's) prints its traceback redacted."""
    sys.stderr.write(format_exception_redacted(exc) + "\n")


def install_log_redaction() -> None:
    """Every log record of this process is a :class:`_RedactedRecord`, and
    an uncaught exception prints redacted. Idempotent; :func:`init_sentry`
    installs it (before Sentry wraps the excepthook), so every process has it."""
    logging.setLogRecordFactory(_RedactedRecord)
    if sys.excepthook is sys.__excepthook__:  # not yet wrapped (by Sentry) or replaced
        sys.excepthook = _print_redacted


def init_sentry(config: Config, *, component: str, transport=None) -> bool:
    """Initialise Sentry when SENTRY_DSN is set. Must run before the Dramatiq
    broker is created (its integration patches the broker's constructor).
    Every process calls it at start, so it installs the log redaction too,
    with or without a DSN. ``transport`` is for tests."""
    install_log_redaction()
    if not config.sentry_dsn:
        return False
    import sentry_sdk
    from sentry_sdk.integrations.dramatiq import DramatiqIntegration

    integrations = [DramatiqIntegration()] if component == "worker" else []
    sentry_sdk.init(
        dsn=config.sentry_dsn,
        # scrub takes the event as the plain dict it is; the SDK types it as
        # a TypedDict of its own.
        before_send=cast(Any, scrub),
        before_breadcrumb=scrub_breadcrumb,
        send_default_pii=False,
        include_local_variables=False,
        server_name=component,
        integrations=integrations,
        transport=transport,
        max_request_body_size="never",
    )
    sentry_sdk.set_tag("component", component)
    return True


def configure_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
