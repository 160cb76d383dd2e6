"""Every status transition of a payment: one conditional UPDATE each.

Losing a race is not an exception: each function returns a typed result
that says what happened. The SQL is in ``transitions.sql``.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Protocol

import psycopg

from paycron.domain.enums import CancelOutcome, Outcome, Status
from paycron.domain.ids import due_range
from paycron.domain.policy import Decision
from paycron.domain.processing import CallResult
from paycron.sql import q
from paycron.store.db import Connection, Pool, one_row
from paycron.store.partitions import live_bound
from paycron.store.payments import get_payment

log = logging.getLogger("paycron.transitions")


def log_transition(
    payment_id, before: str, after: str, *, level: int = logging.INFO, **fields
) -> None:
    """The one structured line every status change writes (logfmt). The
    engine's hot path (claims, call outcomes) writes it at DEBUG: each call's
    attempt line (paycron.execution) already says where the payment went,
    and three lines per payment were 7% of a worker's CPU."""
    if not log.isEnabledFor(level):
        return
    extra = "".join(f" {k}={v}" for k, v in fields.items() if v is not None)
    log.log(level, "transition payment=%s from=%s to=%s%s", payment_id, before, after, extra)


def worker_name() -> str:
    """Who made an attempt: host and pid (read at call time: workers fork)."""
    return f"{socket.gethostname()}:{os.getpid()}"


#: Why a cancel lost, by the status it found.
_CANCEL_REFUSALS = {
    Status.PROCESSING: CancelOutcome.ALREADY_PROCESSING,
    Status.AWAITING_GATEWAY: CancelOutcome.ALREADY_PROCESSING,
    Status.COMPLETED: CancelOutcome.ALREADY_COMPLETED,
    Status.FAILED: CancelOutcome.ALREADY_FAILED,
}
#: A lost CAS re-reads the row; a row seen back at PENDING (a retry) is tried again.
_CANCEL_TRIES = 3


@dataclass(frozen=True)
class Claim:
    """One claimed payment: the message a worker receives."""

    payment_id: uuid.UUID
    due_at: datetime
    attempt: int


def cancel(conn: Connection, payment_id: uuid.UUID, *, actor: str) -> CancelOutcome:
    """PENDING -> CANCELLED by CAS; idempotent when already cancelled.

    Losing is an answer, not an exception: the outcome says whether the
    payment is (now or already) cancelled, unknown to ``actor`` (also
    another payer's payment), or why it can no longer be cancelled.
    """
    due_from, due_to = due_range(payment_id)
    params = {"id": payment_id, "due_from": due_from, "due_to": due_to, "actor": actor}
    for _ in range(_CANCEL_TRIES):
        if conn.execute(q("cancel"), params).fetchone() is not None:
            log_transition(payment_id, Status.PENDING, Status.CANCELLED)
            return CancelOutcome.CANCELLED
        # Lost, or nothing to cancel: a fresh statement sees the winner's commit.
        row = get_payment(conn, payment_id, actor=actor, with_attempts=False)
        if row is None:
            return CancelOutcome.NOT_FOUND
        status = Status(row["status"])
        if status is Status.CANCELLED:
            return CancelOutcome.CANCELLED
        if status is Status.PENDING and row["in_doubt"]:
            return CancelOutcome.OUTCOME_IN_DOUBT
        if status is not Status.PENDING:
            return _CANCEL_REFUSALS[status]
    # Seen PENDING every time yet never won: claimed and retried in between.
    return CancelOutcome.ALREADY_PROCESSING


def claim_due(
    conn: Connection,
    *,
    limit: int,
    lease_seconds: float,
    processor: str = "fake",
    live_from: datetime | None = None,
) -> list[Claim]:
    """PENDING -> PROCESSING for up to ``limit`` due rows (lease, attempt + 1),
    shared across payers round-robin, oldest first within each payer; the
    claims come back in that order (the order they are enqueued in). Rows
    first called at another processor than ``processor`` are left alone.

    Two statements in one transaction: lock the rows fairly (SKIP LOCKED),
    then claim exactly those. The commit is the claim: a crash before it
    claims nothing; after it, the leases cover the rows.

    ``live_from``: the live bound (:func:`paycron.store.partitions.live_bound`)
    if the caller read it (a sweep reads it once per run); read here if not.
    A stale one only delays a row made live below it to the next read.
    """
    with conn.transaction():
        turns = conn.execute(
            q("lock_due_fairly"),
            {
                "limit": limit,
                "now": datetime.now(UTC),
                "processor": processor,
                "live_from": live_bound(conn) if live_from is None else live_from,
            },
            prepare=True,
        ).fetchall()
        if not turns:
            return []
        rows = conn.execute(
            q("claim_locked"),
            {
                "ids": [r["id"] for r in turns],
                "due_ats": [r["due_at"] for r in turns],
                "lease_seconds": lease_seconds,
            },
            prepare=True,
        ).fetchall()
    for r in rows:
        log_transition(
            r["id"], Status.PENDING, Status.PROCESSING, attempt=r["attempt"], level=logging.DEBUG
        )
    return [Claim(r["id"], r["due_at"], r["attempt"]) for r in rows]


def next_due_wait(conn: Connection, *, within: float, live_from: datetime) -> float | None:
    """Seconds until a PENDING row's run_at comes, if one comes within
    ``within`` seconds (by the database's clock); None otherwise."""
    until = datetime.now(UTC) + timedelta(seconds=within)
    row = one_row(
        conn.execute(q("next_due_wait"), {"until": until, "live_from": live_from}, prepare=True)
    )
    return row["seconds"]


def claim_within_room(
    conn: Connection,
    *,
    limit: int,
    claim_ahead: int,
    lease_seconds: float,
    processor: str = "fake",
    live_from: datetime | None = None,
) -> tuple[list[Claim], int]:
    """Up to ``limit`` claims, no more than the queue's room (``claim_ahead``
    less the claims queued), and that room: counted and claimed in one
    transaction under a lock every sweeper takes, so the room another sweep
    just filled is seen filled and two sweeps never each fill it."""
    with conn.transaction():
        conn.execute(q("lock_claim_room"))
        room = claim_ahead - count_queued(conn, live_from)
        claims = (
            claim_due(
                conn,
                limit=min(limit, room),
                lease_seconds=lease_seconds,
                processor=processor,
                live_from=live_from,
            )
            if room > 0
            else []
        )
    return claims, room


def count_queued(conn: Connection, live_from: datetime | None = None) -> int:
    """Claims waiting for their call: PROCESSING with no attempt row yet
    (``live_from``: as for :func:`claim_due`)."""
    params = {
        "now": datetime.now(UTC),
        "live_from": live_bound(conn) if live_from is None else live_from,
    }
    return one_row(conn.execute(q("count_queued"), params, prepare=True))["n"]


def _claim_params(claims: Sequence[Claim]) -> dict:
    return {
        "ids": [c.payment_id for c in claims],
        "due_ats": [c.due_at for c in claims],
        "attempts": [c.attempt for c in claims],
    }


#: Why claims are handed back (the released event's ``reason``).
CIRCUIT_OPEN, ENQUEUE_FAILED = "circuit_open", "enqueue_failed"


def release(pool: Pool, claims: Sequence[Claim], *, reason: str = CIRCUIT_OPEN) -> int:
    """Give claims back without a call (breaker open, or the broker refused
    the message): no budget, no attempt row. A claim a worker already
    started is left alone, so releasing after an enqueue that may have
    delivered its message is safe. Returns how many went back."""
    params = _claim_params(claims)
    with pool.connection() as conn, conn.transaction():
        conn.execute(q("lock_claims_to_release"), params)
        rows = conn.execute(q("release_claims"), {**params, "reason": reason}).fetchall()
    for r in rows:
        log_transition(r["id"], Status.PROCESSING, Status.PENDING, reason=reason)
    return len(rows)


def start(
    pool: Pool,
    claims: Sequence[Claim],
    *,
    lease_seconds: float,
    processor: str = "fake",
    worker: str | None = None,
) -> list[dict]:
    """Fence, renew the lease and write IN_FLIGHT, for every claim at once,
    stamping ``processor``. Returns the rows this worker now holds (stale,
    duplicate and other processors' claims drop)."""
    with pool.connection() as conn:
        return conn.execute(
            q("start_attempts"),
            start_params(claims, lease_seconds=lease_seconds, processor=processor, worker=worker),
            prepare=True,
        ).fetchall()


def start_params(
    claims: Sequence[Claim], *, lease_seconds: float, processor: str, worker: str | None
) -> dict:
    """The parameters of ``start_attempts`` (also the async executor's)."""
    return {
        **_claim_params(claims),
        "lease_seconds": lease_seconds,
        "processor": processor,
        "worker": worker or worker_name(),
    }


@dataclass(frozen=True)
class Finished:
    """One call's outcome and the payment's next state."""

    row: dict
    result: CallResult
    decision: Decision


#: What a gateway's text becomes when Postgres cannot store it (a NUL byte,
#: an unencodable character): the outcome is kept, the text is not.
UNWRITABLE = "unwritable_answer"


def finish(
    pool: Pool,
    done: Sequence[Finished],
    *,
    land_seconds: float = 0.0,
    poll_seconds: float = 300.0,
) -> list[dict]:
    """Record every outcome and CAS every payment, in one statement; a call
    that may still land moves the payment's in-flight bound to its start +
    ``land_seconds`` (lease + call timeout + settle margin).

    A value Postgres cannot store (a NUL byte, an unencodable character, a
    processor id longer than the schema allows) never loses the rest of the
    group: the group is written one by one, and an outcome that still fails
    is written without the processor's text (its status and decision are
    kept)."""
    try:
        return _finish_retrying_deadlocks(pool, done, land_seconds, poll_seconds)
    except _UNWRITABLE_ERRORS:
        if len(done) > 1:
            return [
                row
                for item in done
                for row in finish(
                    pool, [item], land_seconds=land_seconds, poll_seconds=poll_seconds
                )
            ]
        (item,) = done
        log.error(
            "unwritable gateway answer for payment %s: stored without its text", item.row["id"]
        )
        result = replace(
            item.result,
            error_code=item.result.error_code and UNWRITABLE,
            gateway_ref=item.result.gateway_ref and UNWRITABLE,
        )
        # the processor-side payment to confirm again is that text too: the
        # next call makes a new one under the next key instead
        decision = replace(item.decision, confirm=None)
        return _finish(pool, [Finished(item.row, result, decision)], land_seconds, poll_seconds)


#: What an answer Postgres refuses to store raises: a value it cannot hold
#: (DataError), a CHECK it breaks (CheckViolation, an IntegrityError), text
#: it cannot encode.
_UNWRITABLE_ERRORS = (psycopg.DataError, psycopg.IntegrityError, UnicodeEncodeError)


#: A finish that deadlocks with a reap of the same rows is rolled back whole
#: by Postgres: it is asked again (the reap has moved on by then).
_DEADLOCK_TRIES = 3


def _finish_retrying_deadlocks(
    pool: Pool, done: Sequence[Finished], land_seconds: float, poll_seconds: float
) -> list[dict]:
    for attempt in range(1, _DEADLOCK_TRIES + 1):
        try:
            return _finish(pool, done, land_seconds, poll_seconds)
        except psycopg.errors.DeadlockDetected:
            if attempt == _DEADLOCK_TRIES:
                raise
            log.warning("finish deadlocked with a reap; trying again")
    raise AssertionError("unreachable")


def _finish(
    pool: Pool, done: Sequence[Finished], land_seconds: float, poll_seconds: float
) -> list[dict]:
    if not done:
        return []
    params = finish_params(done, land_seconds, poll_seconds)
    with pool.connection() as conn:
        rows = conn.execute(q("finish_attempts"), params, prepare=True).fetchall()
        # A statement of its own (it must see a parking committed while the
        # one above waited): late successes of payments parked in doubt.
        late = late_successes(done, rows)
        if late:
            _complete_late(conn, late)
    log_finished(done, rows)
    return rows


def finish_params(done: Sequence[Finished], land_seconds: float, poll_seconds: float) -> dict:
    """The parameters of ``finish_attempts`` (also the async executor's)."""
    return {
        "ids": [d.row["id"] for d in done],
        "due_ats": [d.row["due_at"] for d in done],
        "attempts": [d.row["attempt"] for d in done],
        "payers": [d.row["payer"] for d in done],
        "outcomes": [d.result.outcome.value for d in done],
        "error_codes": [d.result.error_code for d in done],
        "gateway_refs": [d.result.gateway_ref for d in done],
        "statuses": [d.decision.status.value for d in done],
        "delays": [float(d.decision.delay) for d in done],
        "failures": [d.decision.failures for d in done],
        "in_doubts": [d.decision.in_doubt for d in done],
        "failure_reasons": [
            d.decision.failure_reason and d.decision.failure_reason.value for d in done
        ],
        "key_in_uses": [d.decision.key_in_use for d in done],
        "next_keys": [d.decision.next_key for d in done],
        "confirms": [d.decision.confirm for d in done],
        "may_lands": [d.result.may_land for d in done],
        "land_seconds": land_seconds,
        "poll_seconds": poll_seconds,
    }


def late_successes(done: Sequence[Finished], rows: Sequence[dict]) -> list[Finished]:
    """Successes recorded on their attempt rows that moved no payment (parked meanwhile)."""
    return [d for d, r in zip(done, _in_order(done, rows), strict=True) if _late(d, r)]


def log_finished(done: Sequence[Finished], rows: Sequence[dict]) -> None:
    by_id = {d.row["id"]: d for d in done}
    for r in rows:
        if r["moved"]:
            d = by_id[r["id"]]
            log_transition(
                r["id"],
                Status.PROCESSING,
                r["status"],
                attempt=d.row["attempt"],
                outcome=d.result.outcome.value,
                reason=d.decision.failure_reason,
                level=logging.DEBUG,
            )


def _in_order(done: Sequence[Finished], rows: Sequence[dict]) -> list[dict | None]:
    by_id = {r["id"]: r for r in rows}
    return [by_id.get(d.row["id"]) for d in done]


def _late(item: Finished, row: dict | None) -> bool:
    """A success recorded on its attempt row that moved no payment."""
    return (
        row is not None
        and row["recorded"]
        and not row["moved"]
        and item.result.outcome is Outcome.SUCCEEDED
    )


def _complete_late(conn: Connection, late: Sequence[Finished]) -> None:
    rows = conn.execute(q("complete_late_success"), late_params(late)).fetchall()
    log_late(rows)


def late_params(late: Sequence[Finished]) -> dict:
    return {
        "ids": [d.row["id"] for d in late],
        "due_ats": [d.row["due_at"] for d in late],
        "attempts": [d.row["attempt"] for d in late],
        "gateway_refs": [d.result.gateway_ref for d in late],
        "actor": worker_name(),
    }


def log_late(rows: Sequence[dict]) -> None:
    for r in rows:
        log_transition(r["id"], Status.FAILED, Status.COMPLETED, reason="late_success")


class LeaseExpiryRule(Protocol):
    """Where a PROCESSING row whose lease ran out goes: the caller's policy
    (:func:`paycron.domain.policy.after_lease_expiry` with its settings)."""

    def __call__(
        self, *, lease_expiries: int, failures: int, in_doubt: bool, call_in_flight: bool
    ) -> Decision: ...


def reap_expired(
    conn: Connection,
    *,
    limit: int,
    decide: LeaseExpiryRule,
    counts: Callable[[bool], bool],
    land_seconds: float,
) -> list[dict]:
    """PROCESSING rows past their lease -> the state ``decide`` gives each
    (PENDING, in doubt if a call was in flight; or FAILED
    ``LEASE_EXPIRED_REPEATEDLY``). Lock, decide, write: one transaction.
    ``counts(call_in_flight)``: whether the expiry counts toward parking;
    ``land_seconds``: a call in flight may land until this long from now."""
    with conn.transaction():
        locked = conn.execute(
            q("lock_expired"),
            {"limit": limit, "now": datetime.now(UTC), "live_from": live_bound(conn)},
            prepare=True,
        ).fetchall()
        if not locked:
            return []
        decisions = [
            decide(
                lease_expiries=r["lease_expiries"],
                failures=r["failures"],
                in_doubt=r["in_doubt"],
                call_in_flight=r["call_in_flight"],
            )
            for r in locked
        ]
        rows = conn.execute(
            q("reap_locked"),
            {
                "ids": [r["id"] for r in locked],
                "due_ats": [r["due_at"] for r in locked],
                "attempts": [r["attempt"] for r in locked],
                "statuses": [d.status.value for d in decisions],
                "failure_reasons": [d.failure_reason and d.failure_reason.value for d in decisions],
                "in_doubts": [d.in_doubt for d in decisions],
                "counteds": [counts(r["call_in_flight"]) for r in locked],
                "land_seconds": land_seconds,
            },
            prepare=True,
        ).fetchall()
    for r in rows:
        log_transition(
            r["id"], Status.PROCESSING, r["status"], reason="lease_expired", in_doubt=r["in_doubt"]
        )
    return rows


def complete_from_gateway(
    conn: Connection, payment_id: uuid.UUID, *, outcome: str, gateway_ref: str, actor: str
) -> bool:
    """FAILED/PENDING -> COMPLETED because the gateway holds the charge.
    False when the row was in neither state (e.g. PROCESSING: left to its worker)."""
    due_from, due_to = due_range(payment_id)
    row = conn.execute(
        q("complete_from_gateway"),
        {
            "id": payment_id,
            "due_from": due_from,
            "due_to": due_to,
            "outcome": outcome,
            "gateway_ref": gateway_ref,
            "actor": actor,
        },
    ).fetchone()
    if row is not None:
        log_transition(payment_id, "FAILED|PENDING", Status.COMPLETED, outcome=outcome, by=actor)
    return row is not None


def redrive(
    conn: Connection, payment_id: uuid.UUID, *, actor: str, processor: str | None = None
) -> bool:
    """A parked payment back to PENDING with a fresh budget and the next key
    generation (call only after a conclusive lookup found nothing, at
    ``processor``: a payment called at another processor is left alone)."""
    due_from, due_to = due_range(payment_id)
    row = conn.execute(
        q("redrive"),
        {
            "id": payment_id,
            "due_from": due_from,
            "due_to": due_to,
            "actor": actor,
            "processor": processor,
        },
    ).fetchone()
    if row is not None:
        log_transition(payment_id, Status.FAILED, Status.PENDING, reason="redriven", by=actor)
    return row is not None


def await_from_lookup(
    conn: Connection, payment_id: uuid.UUID, *, intent: str, actor: str, poll_seconds: float
) -> bool:
    """FAILED/PENDING -> AWAITING_GATEWAY: a lookup found the processor still
    processing ``intent`` for it. False when the row was in neither state."""
    due_from, due_to = due_range(payment_id)
    row = conn.execute(
        q("await_from_lookup"),
        {
            "id": payment_id,
            "due_from": due_from,
            "due_to": due_to,
            "intent": intent,
            "actor": actor,
            "poll_seconds": poll_seconds,
        },
    ).fetchone()
    if row is not None:
        log_transition(
            payment_id, "FAILED|PENDING", Status.AWAITING_GATEWAY, intent=intent, by=actor
        )
    return row is not None


def settle_awaiting(
    conn: Connection,
    payment_id: uuid.UUID,
    *,
    intent: str,
    status: Status,
    actor: str,
    error_code: str | None = None,
) -> bool:
    """AWAITING_GATEWAY -> COMPLETED/FAILED, fenced on ``intent``: False when
    the row does not wait on it (another intent, already settled)."""
    due_from, due_to = due_range(payment_id)
    row = conn.execute(
        q("settle_awaiting"),
        {
            "id": payment_id,
            "due_from": due_from,
            "due_to": due_to,
            "intent": intent,
            "status": status.value,
            "actor": actor,
            "error_code": error_code,
        },
    ).fetchone()
    if row is not None:
        log_transition(payment_id, Status.AWAITING_GATEWAY, status, intent=intent, by=actor)
    return row is not None


def listen_due(conn: Connection) -> None:
    """Subscribe ``conn`` to the notice a create sends when a payment falls
    due within the sweep interval (the scheduler's prompt start)."""
    conn.execute(q("listen_due"))
