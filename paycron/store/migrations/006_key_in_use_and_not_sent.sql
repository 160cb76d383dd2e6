-- Execution at a real processor's latency (docs/design.md).
--
-- KEY_IN_USE: the processor answered 409 "idempotency key in use": an
-- earlier call with this key is still running there. Not a failure: no
-- budget, in doubt, asked again with backoff; after 10 in a row the payment
-- is looked up by reference.
-- NOT_SENT: the worker found its lease too short to send the call (it checks
-- just before sending, on a monotonic clock): a definitive non-charge.
ALTER TABLE attempts DROP CONSTRAINT attempts_outcome_check;
ALTER TABLE attempts ADD CONSTRAINT attempts_outcome_check CHECK (outcome IN (
    'IN_FLIGHT', 'SUCCEEDED', 'DECLINED', 'RETRYABLE_ERROR', 'AMBIGUOUS', 'RATE_LIMITED',
    'LEASE_EXPIRED', 'RECONCILED', 'FOUND_BY_LOOKUP', 'KEY_IN_USE', 'NOT_SENT'));

ALTER TABLE payments ADD COLUMN key_in_use integer NOT NULL DEFAULT 0 CHECK (key_in_use >= 0);
COMMENT ON COLUMN payments.key_in_use IS
    '409 "key in use" answers in a row (reset by any other answer): at 10 the payment is looked up.';
