"""Statuses, attempt outcomes and failure reasons: the one place they are
named. The schema's CHECK constraints mirror these (a test compares them)."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    AWAITING_GATEWAY = "AWAITING_GATEWAY"  # accepted by the processor, settled later
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (Status.COMPLETED, Status.FAILED, Status.CANCELLED)


class Outcome(StrEnum):
    """What one gateway call (one ``attempts`` row) ended as."""

    IN_FLIGHT = "IN_FLIGHT"  # written before the call: the recovery point
    SUCCEEDED = "SUCCEEDED"
    DECLINED = "DECLINED"  # terminal decline
    RETRYABLE_ERROR = "RETRYABLE_ERROR"  # 5xx or refused connection
    AMBIGUOUS = "AMBIGUOUS"  # timeout / dropped after sending: may have charged
    RATE_LIMITED = "RATE_LIMITED"  # 429: definitive non-charge, costs no budget
    LEASE_EXPIRED = "LEASE_EXPIRED"  # marked by the reaper; the worker may still finish it
    RECONCILED = "RECONCILED"  # repaired from the settlement report
    FOUND_BY_LOOKUP = "FOUND_BY_LOOKUP"  # the charge was found by reference
    KEY_IN_USE = "KEY_IN_USE"  # 409: an earlier call with this key still runs there; in doubt
    NOT_SENT = "NOT_SENT"  # the lease was too short to send the call: nothing was sent
    REJECTED = "REJECTED"  # refused before executing (Stripe 400/404, idempotency_error)
    AUTH_FAILED = "AUTH_FAILED"  # our credentials were refused (401/403): our configuration
    SUBMITTED = "SUBMITTED"  # accepted, outcome later (a bank debit): AWAITING_GATEWAY


class FailureReason(StrEnum):
    DECLINED = "DECLINED"
    RETRIES_EXHAUSTED = "RETRIES_EXHAUSTED"
    LEASE_EXPIRED_REPEATEDLY = "LEASE_EXPIRED_REPEATEDLY"
    CUSTOMER_ACTION_REQUIRED = "CUSTOMER_ACTION_REQUIRED"  # the customer must authenticate
    INVALID_REQUEST = "INVALID_REQUEST"  # the processor refused the request (no charge)
    GATEWAY_REJECTED = "GATEWAY_REJECTED"  # our parameters changed under a live key
    LOOKUP_MISMATCH = "LOOKUP_MISMATCH"  # the processor holds another amount/currency/customer


class EventType(StrEnum):
    """``payment_events.type``: what a webhook or ``/v1/events`` entry reports.
    The webhook contract (README, "Event types"); a CHECK mirrors it."""

    CREATED = "payment.created"  # accepted by the API
    PROCESSING = "payment.processing"  # claimed: a call is about to be made
    PENDING = "payment.pending"  # back to waiting: a retry is scheduled, or re-driven
    COMPLETED = "payment.completed"  # charged (by a call, a lookup or reconciliation)
    FAILED = "payment.failed"  # declined, or parked for a human (see failureReason)
    CANCELLED = "payment.cancelled"  # cancelled by its payer
    RELEASED = "payment.released"  # handed back unspent (circuit open): no call was made
    REFUNDED = "payment.refunded"  # an operator refunded the charge
    ATTEMPT_FINISHED = "attempt.finished"  # a late call's outcome; the status did not change
    AWAITING_GATEWAY = "payment.awaiting_gateway"  # accepted by the processor, outcome later


class Resolution(StrEnum):
    """How a dead letter was closed."""

    REDRIVEN = "REDRIVEN"
    REFUNDED = "REFUNDED"
    DISMISSED = "DISMISSED"
    COMPLETED = "COMPLETED"  # the charge turned up (lookup or reconciliation)


class CancelOutcome(StrEnum):
    """What a cancel found: done (now or before), nothing of the caller's to
    cancel, or the stable code of why it is too late."""

    CANCELLED = "CANCELLED"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_PROCESSING = "ALREADY_PROCESSING"
    ALREADY_COMPLETED = "ALREADY_COMPLETED"
    ALREADY_FAILED = "ALREADY_FAILED"
    OUTCOME_IN_DOUBT = "OUTCOME_IN_DOUBT"  # a call may have charged (docs/design.md)
