"""Paging on a mismatch: one structured ERROR line and one Sentry error event.

The line's logger is ignored by Sentry's logging integration, so each
mismatch is exactly one Sentry event: the explicit one, grouped by kind.
Without ``SENTRY_DSN`` the capture is a no-op.
"""

from __future__ import annotations

import json
import logging
from datetime import date

import sentry_sdk
from sentry_sdk.integrations.logging import ignore_logger

from reconciliation.diff import Item

LOGGER_NAME = "reconciliation.page"
log = logging.getLogger(LOGGER_NAME)
ignore_logger(LOGGER_NAME)


def page(item: Item, *, day: date, run_id: int) -> None:
    """Raise the alarm for one mismatch (already stored under ``run_id``)."""
    detail = json.dumps(item.detail, sort_keys=True, default=str)
    log.error(
        "reconciliation mismatch kind=%s day=%s run=%d payment=%s charge=%s detail=%s",
        item.kind.value,
        day.isoformat(),
        run_id,
        item.payment_id or "-",
        item.charge_id or "-",
        detail,
    )
    with sentry_sdk.new_scope() as scope:
        scope.set_tag("component", "reconciliation")
        scope.set_tag("reconciliation.kind", item.kind.value)
        scope.set_tag("reconciliation.day", day.isoformat())
        scope.set_context(
            "reconciliation",
            {
                "run": run_id,
                "kind": item.kind.value,
                "day": day.isoformat(),
                "payment_id": str(item.payment_id) if item.payment_id else None,
                "charge_id": item.charge_id,
                "detail": detail,
            },
        )
        # One Sentry issue per kind; each mismatch is its own event in it.
        scope.fingerprint = ["reconciliation", item.kind.value]
        sentry_sdk.capture_message(
            f"reconciliation mismatch {item.kind.value} on {day}", level="error"
        )
