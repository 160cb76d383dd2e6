-- The console's filters, bulk actions, four-eyes approvals and audit page
-- (docs/console.md).
--
-- Open dead letters filtered by payer or by reason, oldest first, keyset-paged
-- on (created_at, id): each filter's leading column, then the list's order,
-- so a filtered page reads only its own rows.
CREATE INDEX dead_letters_open_payer_idx ON dead_letters (payer, created_at, id)
    WHERE resolution IS NULL;
CREATE INDEX dead_letters_open_reason_idx ON dead_letters (reason, created_at, id)
    WHERE resolution IS NULL;

-- A bulk action over a filter: what was asked, by whom, on which filter, and
-- where it stands. Its payments are fixed when it is requested
-- (console_bulk_items): an approval runs exactly what was previewed.
CREATE TABLE console_bulk_requests (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action            text        NOT NULL CHECK (action IN ('redrive', 'refund', 'dismiss')),
    filter            text        NOT NULL,
    reason            text        NOT NULL CHECK (length(reason) BETWEEN 1 AND 1000),
    requested_by      text        NOT NULL,
    requested_key_id  bigint      NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    state             text        NOT NULL
        CHECK (state IN ('AWAITING_APPROVAL', 'REJECTED', 'EXPIRED', 'RUNNING', 'FINISHED')),
    expires_at        timestamptz,
    decided_by        text,
    decided_key_id    bigint,
    decided_at        timestamptz,
    finished_at       timestamptz,
    payments          integer     NOT NULL CHECK (payments >= 0),
    totals            jsonb       NOT NULL,
    done              integer     NOT NULL DEFAULT 0,
    refused           integer     NOT NULL DEFAULT 0
);
-- What waits for a decision or for the runner: a handful of rows at most.
CREATE INDEX console_bulk_requests_open_idx ON console_bulk_requests (state, id)
    WHERE state IN ('AWAITING_APPROVAL', 'RUNNING');

-- One payment of a bulk action and how it ended: NULL until done or refused.
-- Its outcome is written in the transaction that acts on the payment, so a
-- crash leaves it either done (and recorded) or untouched (and done again).
CREATE TABLE console_bulk_items (
    request_id    bigint      NOT NULL REFERENCES console_bulk_requests (id),
    payment_id    uuid        NOT NULL,
    due_at        timestamptz NOT NULL,
    payer         text        NOT NULL,
    amount_minor  bigint      NOT NULL,
    currency      text        NOT NULL,
    outcome       text        CHECK (outcome IN ('done', 'refused')),
    detail        text,
    finished_at   timestamptz,
    PRIMARY KEY (request_id, payment_id)
);
CREATE INDEX console_bulk_items_todo_idx ON console_bulk_items (request_id, payment_id)
    WHERE outcome IS NULL;

-- The console's audit page: every action, request and decision an operator
-- made, newest first (its primary key). The audit log's lines go to standard
-- error and are not read back; these rows are what the page and its CSV show.
CREATE TABLE console_audit (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    event       text        NOT NULL,
    outcome     text        NOT NULL CHECK (outcome IN ('success', 'failure', 'refused')),
    actor       text,
    key_id      bigint,
    target      text,
    reason      text,
    filter      text,
    payments    integer,
    done        integer,
    refused     integer,
    request_id  bigint
);
