-- Outcomes that arrive days later (AWAITING_GATEWAY, asynchronous; docs/design.md:
-- outcomes): a bank debit the processor accepted and will settle later.
--
-- AWAITING_GATEWAY: not claimed, not reaped, not cancellable, not refundable
-- yet, not late; it ends by a CAS to COMPLETED or FAILED fenced on the
-- processor-side payment it waits for (payments.gateway_intent_id).
ALTER TABLE payments DROP CONSTRAINT payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check CHECK (status IN (
    'PENDING', 'PROCESSING', 'AWAITING_GATEWAY', 'COMPLETED', 'FAILED', 'CANCELLED'));
ALTER TABLE payments ADD CONSTRAINT payments_awaiting_has_intent CHECK (
    status <> 'AWAITING_GATEWAY' OR gateway_intent_id IS NOT NULL);

-- awaiting_since: when it started waiting (its age; 21 days pages).
-- next_poll_at / polls: the poller asks the processor with backing-off
-- intervals (5 min, 30 min, 2 h, then every 12 h) so a lost event never
-- strands a payment and 100,000 waiting debits do not flood the processor.
ALTER TABLE payments
    ADD COLUMN awaiting_since timestamptz,
    ADD COLUMN next_poll_at timestamptz,
    ADD COLUMN polls integer NOT NULL DEFAULT 0 CHECK (polls >= 0);
CREATE INDEX payments_poll_idx ON payments (next_poll_at) WHERE status = 'AWAITING_GATEWAY';

-- SUBMITTED: the processor accepted the call and answers later ("processing").
ALTER TABLE attempts DROP CONSTRAINT attempts_outcome_check;
ALTER TABLE attempts ADD CONSTRAINT attempts_outcome_check CHECK (outcome IN (
    'IN_FLIGHT', 'SUCCEEDED', 'DECLINED', 'RETRYABLE_ERROR', 'AMBIGUOUS', 'RATE_LIMITED',
    'LEASE_EXPIRED', 'RECONCILED', 'FOUND_BY_LOOKUP', 'KEY_IN_USE', 'NOT_SENT', 'REJECTED',
    'AUTH_FAILED', 'SUBMITTED'));

ALTER TABLE payment_events DROP CONSTRAINT payment_events_type_check;
ALTER TABLE payment_events ADD CONSTRAINT payment_events_type_check CHECK (type IN (
    'payment.created', 'payment.processing', 'payment.pending', 'payment.completed',
    'payment.failed', 'payment.cancelled', 'payment.released', 'payment.refunded',
    'attempt.finished', 'payment.awaiting_gateway'));

-- The processor's signed events, stored as received (idempotent on their id)
-- and applied by the scheduler's gateway-event service: the web answers 200
-- at once and never calls the processor. An event is a hint, never the
-- truth: the service retrieves the intent before any CAS.
CREATE TABLE gateway_events (
    id              text        NOT NULL,
    processor       text        NOT NULL,
    type            text        NOT NULL,
    intent_id       text,
    payment_id      uuid,
    payload         jsonb       NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    -- pending until applied (or found to need nothing); tried again after
    -- next_attempt_at while it cannot apply yet (the row is still PROCESSING)
    applied_at      timestamptz,
    result          text,
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (processor, id)
);
CREATE INDEX gateway_events_pending_idx ON gateway_events (next_attempt_at)
    WHERE applied_at IS NULL;
COMMENT ON TABLE gateway_events IS
    'Signed processor events as received: applied by the scheduler after retrieving the intent.';
