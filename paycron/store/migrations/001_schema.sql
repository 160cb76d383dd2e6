-- paycron schema of record. The payments table IS the schedule: the sweep
-- reads it, every transition is a compare-and-swap on its status column.
-- Partitions of payments are created by `paycron partitions ensure`
-- (called by `paycron migrate` and by the scheduler's partition keeper).

CREATE TABLE payments (
    id              uuid        NOT NULL,
    due_at          timestamptz NOT NULL,
    payer           text        NOT NULL,
    payee           text        NOT NULL,
    amount_minor    bigint      NOT NULL CHECK (amount_minor > 0),
    currency        char(3)     NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    run_at          timestamptz NOT NULL,
    status          text        NOT NULL DEFAULT 'PENDING'
        CHECK (status IN ('PENDING', 'PROCESSING', 'COMPLETED', 'FAILED', 'CANCELLED')),
    attempt         integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    failures        integer     NOT NULL DEFAULT 0 CHECK (failures >= 0),
    lease_expiries  integer     NOT NULL DEFAULT 0 CHECK (lease_expiries >= 0),
    in_doubt        boolean     NOT NULL DEFAULT false,
    lease_until     timestamptz,
    failure_reason  text
        CHECK (failure_reason IN ('DECLINED', 'RETRIES_EXHAUSTED', 'LEASE_EXPIRED_REPEATEDLY')),
    last_error      text,
    refunded_at     timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, due_at),
    CHECK (run_at >= due_at),
    CHECK ((status = 'PROCESSING') = (lease_until IS NOT NULL)),
    CHECK ((status = 'FAILED') = (failure_reason IS NOT NULL))
) PARTITION BY RANGE (due_at);

COMMENT ON TABLE payments IS 'The schedule of record, one day partition per due day (UTC).';
COMMENT ON COLUMN payments.id IS 'UUIDv7-shaped, its timestamp bits are due_at in ms: a lookup by id prunes to one partition.';
COMMENT ON COLUMN payments.due_at IS 'What the client asked for. Never changes (it is the partition key).';
COMMENT ON COLUMN payments.run_at IS 'Next time the sweep may claim it: due_at + smear, later the retry time.';
COMMENT ON COLUMN payments.attempt IS 'Claims so far: the fence. Only the holder of attempt N may finish it.';
COMMENT ON COLUMN payments.failures IS 'Retryable gateway failures in the current budget (429s and unsent claims excluded).';
COMMENT ON COLUMN payments.in_doubt IS 'A call may have reached the gateway without a definitive answer; cancel is refused.';

-- The sweep reads only PENDING rows by run_at; the partial index stays tiny
-- however much terminal history a partition holds.
CREATE INDEX payments_sweep_idx ON payments (run_at) WHERE status = 'PENDING';
-- The reaper reads only PROCESSING rows by lease end.
CREATE INDEX payments_reap_idx ON payments (lease_until) WHERE status = 'PROCESSING';
-- No list index here: the payer's list view rides idempotency_keys_list_idx
-- (below). A query on payments that cannot name its due days plans and
-- locks every partition (1,878 locks with 375 days on PostgreSQL 15), and a
-- few of those at once exhaust the shared lock table for everyone.

-- due_at is the partition key: updating it would move the row between
-- partitions, and a concurrent FOR UPDATE on a moved row errors.
CREATE FUNCTION payments_due_at_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'payments.due_at is immutable' USING ERRCODE = 'check_violation';
END $$;
CREATE TRIGGER payments_due_at_immutable BEFORE UPDATE OF due_at ON payments
    FOR EACH ROW WHEN (OLD.due_at IS DISTINCT FROM NEW.due_at)
    EXECUTE FUNCTION payments_due_at_immutable();

-- Unpartitioned, so (actor, key) is unique across every day. Kept at least
-- until the payment's partition is detached.
CREATE TABLE idempotency_keys (
    actor         text        NOT NULL,
    key           text        NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    request_hash  bytea       NOT NULL,
    payment_id    uuid        NOT NULL,
    due_at        timestamptz NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (actor, key)
);
-- One row per payment, unpartitioned: the payer's list view, newest first,
-- keyset on (created_at, payment_id).
CREATE INDEX idempotency_keys_list_idx ON idempotency_keys (actor, created_at, payment_id);
COMMENT ON TABLE idempotency_keys IS 'Create requests by (actor, Idempotency-Key): a replay returns the first payment.';
COMMENT ON COLUMN idempotency_keys.request_hash IS 'sha256 of the canonical JSON body: the same key with another body is refused.';

-- One row per gateway call, written IN_FLIGHT before the call (the recovery
-- point) and completed after it. Its insert is the exclusive token for
-- attempt N: a duplicated message conflicts on the key and never calls.
CREATE TABLE attempts (
    payment_id    uuid        NOT NULL,
    attempt       integer     NOT NULL CHECK (attempt >= 1),
    gateway_key   text        NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    outcome       text        NOT NULL
        CHECK (outcome IN ('IN_FLIGHT', 'SUCCEEDED', 'DECLINED', 'RETRYABLE_ERROR',
                           'AMBIGUOUS', 'RATE_LIMITED', 'LEASE_EXPIRED', 'RECONCILED',
                           'FOUND_BY_LOOKUP')),
    error_code    text,
    gateway_ref   text,
    worker        text,
    -- Lateness of a first attempt = started_at - due_at; kept here so the
    -- lateness figures need no join onto the partitioned table.
    due_at        timestamptz NOT NULL,
    PRIMARY KEY (payment_id, attempt)
);
CREATE INDEX attempts_started_idx ON attempts (started_at);
COMMENT ON TABLE attempts IS 'Audit: one row per gateway call (or reconciliation repair).';

-- Append-only outbox: one row per status change or attempt outcome, written
-- in the same transaction as the change.
CREATE TABLE payment_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payment_id  uuid        NOT NULL,
    payer       text        NOT NULL,
    type        text        NOT NULL,
    status      text        NOT NULL,
    attempt     integer     NOT NULL,
    data        jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payment_events_payment_idx ON payment_events (payment_id, id);

-- Parked payments waiting for a human. One open row per payment at most.
CREATE TABLE dead_letters (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payment_id   uuid        NOT NULL,
    due_at       timestamptz NOT NULL,
    payer        text        NOT NULL,
    reason       text        NOT NULL
        CHECK (reason IN ('RETRIES_EXHAUSTED', 'LEASE_EXPIRED_REPEATEDLY')),
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    resolution   text CHECK (resolution IN ('REDRIVEN', 'REFUNDED', 'DISMISSED', 'COMPLETED')),
    resolved_by  text,
    resolved_at  timestamptz,
    note         text,
    CHECK ((resolution IS NULL) = (resolved_at IS NULL))
);
CREATE UNIQUE INDEX dead_letters_open_idx ON dead_letters (payment_id) WHERE resolution IS NULL;

-- Bearer keys: only a sha256 of the key is stored (keys are 256-bit random,
-- so a slow KDF buys nothing and would cost every request).
CREATE TABLE api_keys (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    actor       text        NOT NULL CHECK (length(actor) BETWEEN 1 AND 200),
    prefix      text        NOT NULL,
    key_hash    bytea       NOT NULL UNIQUE,
    scopes      text[]      NOT NULL CHECK (scopes <@ ARRAY['payments', 'admin']),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
