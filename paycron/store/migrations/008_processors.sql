-- A real processor (docs/design.md, docs/api.md).
--
-- payment_method / customer: the processor's opaque tokens (Stripe pm_…,
-- cus_…), required at create when the configured processor needs them.
-- processor: the processor that saw the payment's first call; the payment is
-- only ever called and looked up there (NULL: never called yet).
-- key_generation: the idempotency key is <id> for generation 1 and <id>:<n>
-- after; it moves on only after a retryable decline or a conclusive lookup
-- that found nothing, never while in doubt.
-- calls_land_by: the in-flight bound: no call of this payment can land at
-- the processor later (lease end + call timeout + settle margin, over every
-- attempt). A lookup that finds nothing is conclusive only after it.
-- in_doubt_since: when the oldest unresolved call was made (key retention).
-- gateway_intent_id: the processor-side payment a retried decline confirms
-- again (Stripe: its PaymentIntent), later the one a waiting payment is
-- fenced on.
ALTER TABLE payments
    ADD COLUMN payment_method text CHECK (length(payment_method) BETWEEN 1 AND 255),
    ADD COLUMN customer text CHECK (length(customer) BETWEEN 1 AND 255),
    ADD COLUMN processor text CHECK (processor ~ '^[a-z][a-z0-9_]{0,31}$'),
    ADD COLUMN key_generation integer NOT NULL DEFAULT 1 CHECK (key_generation >= 1),
    ADD COLUMN calls_land_by timestamptz,
    ADD COLUMN in_doubt_since timestamptz,
    ADD COLUMN gateway_intent_id text CHECK (length(gateway_intent_id) BETWEEN 1 AND 255);

ALTER TABLE payments DROP CONSTRAINT payments_failure_reason_check;
ALTER TABLE payments ADD CONSTRAINT payments_failure_reason_check CHECK (failure_reason IN (
    'DECLINED', 'RETRIES_EXHAUSTED', 'LEASE_EXPIRED_REPEATEDLY', 'CUSTOMER_ACTION_REQUIRED',
    'INVALID_REQUEST', 'GATEWAY_REJECTED', 'LOOKUP_MISMATCH'));

-- REJECTED: the processor refused the request before executing it (Stripe
-- 400/404, or an idempotency_error). AUTH_FAILED: it refused our credentials
-- (401/403): our configuration, not the payment's.
ALTER TABLE attempts DROP CONSTRAINT attempts_outcome_check;
ALTER TABLE attempts ADD CONSTRAINT attempts_outcome_check CHECK (outcome IN (
    'IN_FLIGHT', 'SUCCEEDED', 'DECLINED', 'RETRYABLE_ERROR', 'AMBIGUOUS', 'RATE_LIMITED',
    'LEASE_EXPIRED', 'RECONCILED', 'FOUND_BY_LOOKUP', 'KEY_IN_USE', 'NOT_SENT', 'REJECTED',
    'AUTH_FAILED'));
ALTER TABLE attempts
    ADD COLUMN key_generation integer NOT NULL DEFAULT 1 CHECK (key_generation >= 1),
    ADD COLUMN processor text;

-- Each processor customer belongs to the first actor that names it (docs/design.md):
-- another actor naming it is refused at create.
CREATE TABLE customers (
    processor   text        NOT NULL,
    customer    text        NOT NULL,
    actor       text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (processor, customer)
);
COMMENT ON TABLE customers IS 'Processor customers, each bound to the first actor that used it.';

-- A mismatch found by lookup and a request the processor refused for changed
-- parameters are parked for a human too (neither is ever re-driven).
ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_reason_check;
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_reason_check CHECK (reason IN (
    'RETRIES_EXHAUSTED', 'LEASE_EXPIRED_REPEATEDLY', 'LOOKUP_MISMATCH', 'GATEWAY_REJECTED'));
