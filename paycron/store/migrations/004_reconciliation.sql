-- Daily reconciliation (`paycron reconcile --date`): the gateway's settlement
-- report diffed against payments and attempts, both ways. Each run is one row;
-- what it repaired, deferred or paged about are its items. Matched charges
-- leave no item: the items are the exceptions.

CREATE TABLE reconciliation_runs (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    day            date        NOT NULL,
    started_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    charges_seen   integer     NOT NULL DEFAULT 0 CHECK (charges_seen >= 0),
    repaired       integer     NOT NULL DEFAULT 0 CHECK (repaired >= 0),
    deferred       integer     NOT NULL DEFAULT 0 CHECK (deferred >= 0),
    mismatches     integer     NOT NULL DEFAULT 0 CHECK (mismatches >= 0),
    source         text        NOT NULL CHECK (source IN ('gateway', 'file')),
    CHECK (finished_at IS NULL OR finished_at >= started_at)
);
CREATE INDEX reconciliation_runs_day_idx ON reconciliation_runs (day, id);

COMMENT ON TABLE reconciliation_runs IS 'One row per `paycron reconcile` run over one UTC day of the settlement report.';
COMMENT ON COLUMN reconciliation_runs.id IS 'The run; its items point here.';
COMMENT ON COLUMN reconciliation_runs.day IS 'The UTC settlement day reconciled (a charge belongs to the day of its created_at).';
COMMENT ON COLUMN reconciliation_runs.started_at IS 'When the run began (after the report was read).';
COMMENT ON COLUMN reconciliation_runs.finished_at IS 'When its items and counts were written; NULL: the run died midway (its repairs, each committed with its item, stand).';
COMMENT ON COLUMN reconciliation_runs.charges_seen IS 'Charges in the day''s report (the neighbouring days'' reports only help matching).';
COMMENT ON COLUMN reconciliation_runs.repaired IS 'Payments moved FAILED/PENDING -> COMPLETED from a charge the report holds (RECONCILED attempts).';
COMMENT ON COLUMN reconciliation_runs.deferred IS 'Charges whose payment was PROCESSING: left to its worker, re-checked by a later run over the day.';
COMMENT ON COLUMN reconciliation_runs.mismatches IS 'Items that paged (Sentry error event, exit code 1). 0 means the day is clean.';
COMMENT ON COLUMN reconciliation_runs.source IS 'gateway: the reports were fetched (the day and its neighbours); file: one CSV given with --report.';

CREATE TABLE reconciliation_items (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      bigint      NOT NULL REFERENCES reconciliation_runs (id) ON DELETE CASCADE,
    kind        text        NOT NULL
        CHECK (kind IN ('REPAIRED', 'DEFERRED', 'CHARGE_FOR_CANCELLED', 'UNKNOWN_REFERENCE',
                        'COMPLETED_WITHOUT_CHARGE', 'AMOUNT_MISMATCH', 'CURRENCY_MISMATCH',
                        'DUPLICATE_CHARGE', 'UNEXPECTED_CHARGE_STATUS')),
    payment_id  uuid,
    charge_id   text,
    detail      jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (payment_id IS NOT NULL OR charge_id IS NOT NULL)
);
CREATE INDEX reconciliation_items_run_idx ON reconciliation_items (run_id, id);
-- A payment's reconciliation history (ops: "what did reconciliation say about it?").
CREATE INDEX reconciliation_items_payment_idx ON reconciliation_items (payment_id)
    WHERE payment_id IS NOT NULL;

COMMENT ON TABLE reconciliation_items IS 'What one run repaired, deferred or paged about; matched charges leave no item.';
COMMENT ON COLUMN reconciliation_items.id IS 'Order of discovery within and across runs.';
COMMENT ON COLUMN reconciliation_items.run_id IS 'The run that found it. A later run over the same day records its own items again.';
COMMENT ON COLUMN reconciliation_items.kind IS 'REPAIRED and DEFERRED are routine; every other kind is a mismatch that paged.';
COMMENT ON COLUMN reconciliation_items.payment_id IS 'The payment concerned; NULL when a charge''s reference is no payment id of ours.';
COMMENT ON COLUMN reconciliation_items.charge_id IS 'The gateway charge concerned; NULL for COMPLETED_WITHOUT_CHARGE.';
COMMENT ON COLUMN reconciliation_items.detail IS 'The evidence: charge and payment amounts, currencies, statuses, keys, as JSON (integers in minor units).';
COMMENT ON COLUMN reconciliation_items.created_at IS 'When the item was written (a repair''s item commits with the repair itself).';
