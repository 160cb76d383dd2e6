-- Reconciliation's statements. Every statement on payments names the due
-- bounds of the ids it reads as parameters, so Postgres prunes partitions
-- at plan time (sessions run with plan_cache_mode = force_custom_plan): an
-- unpruned statement plans and locks every day partition (~1,900 locks).

-- name: payments_due_within
-- The payments among %(ids)s, all due within one day's bounds (one partition).
SELECT id, due_at, status, amount_minor, currency
FROM payments
WHERE id = ANY(%(ids)s::uuid[]) AND due_at >= %(due_from)s AND due_at < %(due_to)s;

-- name: completions_finished_within
-- Successes recorded in [day_from, day_to), one per payment (its latest).
-- attempts is unpartitioned; the started_at bound (a call starts at most a
-- day before it finishes) lets attempts_started_idx bound the read.
SELECT DISTINCT ON (payment_id) payment_id, due_at, outcome, gateway_ref, finished_at
FROM attempts
WHERE outcome IN ('SUCCEEDED', 'FOUND_BY_LOOKUP', 'RECONCILED')
  AND finished_at >= %(day_from)s AND finished_at < %(day_to)s
  AND started_at >= %(started_from)s AND started_at < %(day_to)s
ORDER BY payment_id, finished_at DESC;

-- name: start_run
-- A run begins: its id anchors the items (finished_at stays NULL until the end).
INSERT INTO reconciliation_runs (day, source)
VALUES (%(day)s, %(source)s)
RETURNING id, day, started_at, source;

-- name: record_items
-- Items of one run, all at once; detail arrives as JSON text.
INSERT INTO reconciliation_items (run_id, kind, payment_id, charge_id, detail)
SELECT %(run_id)s, i.kind, i.payment_id, i.charge_id, i.detail::jsonb
FROM unnest(%(kinds)s::text[], %(payment_ids)s::uuid[], %(charge_ids)s::text[],
            %(details)s::text[]) AS i(kind, payment_id, charge_id, detail);

-- name: finish_run
-- A run ends with its counts.
UPDATE reconciliation_runs
SET finished_at = now(), charges_seen = %(charges_seen)s, repaired = %(repaired)s,
    deferred = %(deferred)s, mismatches = %(mismatches)s
WHERE id = %(run_id)s AND finished_at IS NULL
RETURNING id, day, started_at, finished_at, charges_seen, repaired, deferred, mismatches, source;
