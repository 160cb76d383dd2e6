"""Reconciliation's exception root, translated to an exit code by the CLI."""

from __future__ import annotations

from paycron.errors import PaycronError


class ReconciliationError(PaycronError):
    """The run could not be made (report unreadable, gateway unreachable):
    nothing was compared, so nothing can be said about the day."""

    code = "RECONCILIATION_FAILED"
