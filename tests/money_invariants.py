"""The money invariants: what must hold of every payment after every step,
whatever happened. The state-machine model (tests/engine/test_state_machine.py)
and the crash-anywhere harness (tests/engine/test_crash_anywhere.py) both
check them against the rows in Postgres and the processors' ledgers
(:class:`tests.model_processor.ModelProcessor`).

Each broken invariant raises its own :class:`Violation` subclass, so a test
that expects one known hole (``pytest.mark.xfail(raises=...)``) still fails
on any other.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from tests.model_processor import ModelProcessor


class Violation(AssertionError):
    """A money invariant does not hold."""


class DoubleCharge(Violation):
    """More than one charge for one payment, across every key and processor."""


class ChargedButCancelled(Violation):
    """The processor holds a charge for a CANCELLED payment."""


class ChargedButFailed(Violation):
    """The processor holds a charge for a payment FAILED without doubt, or a
    success recorded on an attempt sits under a FAILED or CANCELLED payment."""


class ChargedButDismissed(Violation):
    """The processor holds a charge for a FAILED payment whose dead letter an
    operator dismissed as the console told them to: nothing will record it."""


class DoubtWithoutLookup(Violation):
    """A payment became FAILED in doubt without a lookup, and its event does
    not say that the outcome is unknown."""


class StatusWithoutEvent(Violation):
    """A status changed without its event."""


class CounterDecreased(Violation):
    """An attempt counter or a key generation went down."""


class LeftProcessing(Violation):
    """A payment stayed PROCESSING past its lease after the reaper ran."""


class ParkedNeverSent(Violation):
    """A payment whose call was never made was parked for lease expiries."""


class EngineCrashed(Violation):
    """An engine part raised where it must answer (a bug lost a group)."""


#: Attempt outcomes that record money taken.
RECORDED_CHARGE = {"SUCCEEDED", "FOUND_BY_LOOKUP", "RECONCILED"}

#: Every payment with what the invariants look at, in one round trip.
STATE = """
SELECT p.id, p.status, p.in_doubt, p.attempt, p.key_generation, p.failure_reason,
       p.processor, p.lease_until, p.lease_until < now() AS lease_passed,
       p.run_at > now() AS waiting,
       p.in_doubt AND p.calls_land_by IS NOT NULL AS bounded_doubt,
       (SELECT coalesce(array_agg(a.outcome ORDER BY a.attempt), '{}') FROM attempts a
        WHERE a.payment_id = p.id) AS outcomes,
       (SELECT count(*) FROM payment_events e
        WHERE e.payment_id = p.id AND e.status <> 'UNCHANGED') AS status_events,
       (SELECT jsonb_build_object('status', e.status, 'data', e.data) FROM payment_events e
        WHERE e.payment_id = p.id AND e.status <> 'UNCHANGED'
        ORDER BY e.id DESC LIMIT 1) AS last_event,
       (SELECT d.resolution FROM dead_letters d WHERE d.payment_id = p.id
        ORDER BY d.id DESC LIMIT 1) AS letter
FROM payments p
WHERE p.id = ANY(%(ids)s) AND p.due_at BETWEEN %(due_from)s AND %(due_to)s
"""

#: Every payment a test makes is due within a day of its start: statements
#: name that range, so Postgres plans one partition, not several hundred.
DUE_WINDOW = (timedelta(days=2), timedelta(hours=1))


def due_bounds() -> dict:
    """The ``due_from``/``due_to`` parameters for payments due around now."""
    now = datetime.now(UTC)
    return {"due_from": now - DUE_WINDOW[0], "due_to": now + DUE_WINDOW[1]}


@dataclass
class Seen:
    """What the checker saw of a payment at the previous step."""

    status: str
    attempt: int
    key_generation: int
    status_events: int


class MoneyChecker:
    """Checks the invariants after each step, remembering the last step's rows."""

    def __init__(self, processors: Mapping[str, ModelProcessor]):
        self.processors = processors
        self.seen: dict[uuid.UUID, Seen] = {}
        self.due = due_bounds()
        self.dismissed_on_advice: set[uuid.UUID] = set()

    def rows(self, conn, ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, dict]:
        return {r["id"]: r for r in conn.execute(STATE, {"ids": list(ids), **self.due})}

    def charges(self, payment_id: uuid.UUID) -> list:
        ref = str(payment_id)
        return [i for p in self.processors.values() for i in p.charged(ref)]

    def check(self, conn, ids: Iterable[uuid.UUID], *, step: str = "") -> dict[uuid.UUID, dict]:
        """Every invariant, for every payment in ``ids``; the rows read."""
        looked_up = set().union(*(p.asked for p in self.processors.values()))
        rows = self.rows(conn, ids)
        for pid, row in rows.items():
            self._check_one(pid, row, looked_up, step)
        for p in self.processors.values():
            p.asked.clear()
        return rows

    def _check_one(self, pid: uuid.UUID, row: dict, looked_up: set[str], step: str) -> None:
        where = f"payment {pid} after {step}: {row['status']} in_doubt={row['in_doubt']}"
        charges = self.charges(pid)
        if len(charges) > 1:
            raise DoubleCharge(f"{where}: {len(charges)} charges {[c.id for c in charges]}")
        status = row["status"]
        if charges and status == "CANCELLED":
            raise ChargedButCancelled(f"{where}: charge {charges[0].id}")
        if charges and status == "FAILED" and not row["in_doubt"]:
            raise ChargedButFailed(f"{where}: charge {charges[0].id}, FAILED without doubt")
        if status in ("FAILED", "CANCELLED") and RECORDED_CHARGE & set(row["outcomes"]):
            raise ChargedButFailed(f"{where}: attempts {row['outcomes']} record a charge")
        if charges and status == "FAILED" and pid in self.dismissed_on_advice:
            raise ChargedButDismissed(f"{where}: charge {charges[0].id}, its letter dismissed")
        before = self.seen.get(pid)
        last = row["last_event"] or {}
        changed = before is not None and before.status != status
        if changed and (row["status_events"] <= before.status_events or last["status"] != status):
            raise StatusWithoutEvent(f"{where}: from {before.status}, last event {last}")
        if before is None and status != "PENDING" and last.get("status") != status:
            raise StatusWithoutEvent(f"{where}: last event {last}")
        if status == "FAILED" and row["in_doubt"] and (before is None or changed):
            data = last.get("data") or {}
            if str(pid) not in looked_up and data.get("outcomeUnknown") is not True:
                raise DoubtWithoutLookup(f"{where}: no lookup, event {data}")
        if before is not None and (
            row["attempt"] < before.attempt or row["key_generation"] < before.key_generation
        ):
            raise CounterDecreased(f"{where}: attempt {before.attempt}->{row['attempt']}")
        if row["failure_reason"] == "LEASE_EXPIRED_REPEATEDLY" and not row["outcomes"]:
            raise ParkedNeverSent(f"{where}: parked with no attempt ever made")
        self.seen[pid] = Seen(status, row["attempt"], row["key_generation"], row["status_events"])

    def check_reaped(self, conn, ids: Iterable[uuid.UUID]) -> None:
        """Right after the reaper ran: no payment PROCESSING past its lease."""
        for pid, row in self.rows(conn, ids).items():
            if row["status"] == "PROCESSING" and row["lease_passed"]:
                raise LeftProcessing(f"payment {pid}: PROCESSING, lease {row['lease_until']}")
