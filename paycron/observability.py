"""Sentry and logging set-up shared by every process."""

from __future__ import annotations

import logging

from paycron.config import Config

#: Exception types whose message quotes data: Postgres errors carry the
#: failing row or key in a DETAIL line (payer, payee, amounts).
_DATA_QUOTING_MODULES = ("psycopg",)

#: Keys whose values never leave the process in a Sentry event.
_SCRUBBED_KEYS = {"payer", "payee", "actor", "authorization", "idempotency-key", "claims",
                  "args", "kwargs", "data", "body"}


def scrub_breadcrumb(crumb: dict, hint: dict | None = None) -> dict | None:
    """A breadcrumb without data: a log line's crumb keeps its template
    (``transition payment=%s ... by=%s``), never the formatted line, whose
    values include payers; other crumbs (HTTP calls) lose their URL and data."""
    if str(crumb.get("category", "")).startswith("dramatiq"):
        return None  # its lines print messages with their arguments
    record = (hint or {}).get("log_record")
    crumb.pop("data", None)
    if isinstance(record, logging.LogRecord):
        crumb["message"] = str(record.msg)
    elif crumb.get("type") == "log":
        crumb.pop("message", None)  # formatted, and no template to fall back on
    return crumb


def _scrub_exception_value(exc: dict) -> None:
    if str(exc.get("module") or "").startswith(_DATA_QUOTING_MODULES) \
            and isinstance(exc.get("value"), str):
        exc["value"] = exc["value"].split("\n", 1)[0]  # the primary message, not DETAIL


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
        crumbs["values"] = [c for c in crumbs["values"]
                            if isinstance(c, dict)
                            and not str(c.get("category", "")).startswith("dramatiq")]
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
        headers = request.get("headers")
        if isinstance(headers, dict):
            for name in list(headers):
                if name.lower() in _SCRUBBED_KEYS:
                    headers[name] = "[scrubbed]"
    extra = event.get("extra")
    if isinstance(extra, dict):
        for name in list(extra):
            if name.lower() in _SCRUBBED_KEYS or name.startswith("dramatiq"):
                extra.pop(name)
    contexts = event.get("contexts")
    if isinstance(contexts, dict):
        contexts.pop("dramatiq", None)
    for exc in (event.get("exception") or {}).get("values", []):
        _scrub_exception_value(exc)
        for frame in (exc.get("stacktrace") or {}).get("frames", []):
            frame.pop("vars", None)  # locals carry payer ids and amounts
    event.pop("user", None)
    return event


def init_sentry(config: Config, *, component: str, transport=None) -> bool:
    """Initialise Sentry when SENTRY_DSN is set. Must run before the Dramatiq
    broker is created (its integration patches the broker's constructor).
    ``transport`` is for tests."""
    if not config.sentry_dsn:
        return False
    import sentry_sdk
    from sentry_sdk.integrations.dramatiq import DramatiqIntegration

    integrations = [DramatiqIntegration()] if component == "worker" else []
    sentry_sdk.init(dsn=config.sentry_dsn, before_send=scrub,
                    before_breadcrumb=scrub_breadcrumb, send_default_pii=False,
                    include_local_variables=False, server_name=component,
                    integrations=integrations, transport=transport,
                    max_request_body_size="never")
    sentry_sdk.set_tag("component", component)
    return True


def configure_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
