"""Sentry and logging set-up shared by every process."""

from __future__ import annotations

import logging

from paycron.config import Config

#: Keys whose values never leave the process in a Sentry event.
_SCRUBBED_KEYS = {"payer", "payee", "actor", "authorization", "idempotency-key", "claims",
                  "args", "kwargs", "data", "body"}


def scrub(event: dict, hint: dict | None = None) -> dict | None:
    """Drop request bodies, actor arguments and payer/payee ids from an event.

    Dramatiq's own log lines print a failed message with its arguments, so
    events from its loggers are dropped whole (the Dramatiq integration
    reports the exception itself) and its breadcrumbs are removed.
    """
    if str(event.get("logger", "")).startswith("dramatiq"):
        return None
    crumbs = event.get("breadcrumbs")
    if isinstance(crumbs, dict) and isinstance(crumbs.get("values"), list):
        crumbs["values"] = [c for c in crumbs["values"]
                            if not str(c.get("category", "")).startswith("dramatiq")]
    logentry = event.get("logentry")
    if isinstance(logentry, dict):
        logentry.pop("params", None)  # the message template stays; values may be PII
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
    sentry_sdk.init(dsn=config.sentry_dsn, before_send=scrub, send_default_pii=False,
                    include_local_variables=False, server_name=component,
                    integrations=integrations, transport=transport,
                    max_request_body_size="never")
    sentry_sdk.set_tag("component", component)
    return True


def configure_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
