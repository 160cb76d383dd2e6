-- The operator console's reads (web/console/reads.py). Every one is bounded
-- (LIMIT, keyset) and rides an index; every statement on payments names its
-- due bounds as parameters, so partitions are pruned at plan time (a
-- statement pruned only at run time plans and locks every day partition).

-- name: lateness_histogram
-- First attempts started since %(since)s, counted by lateness bucket:
-- width_bucket over %(edges)s (seconds), 0 below the first edge. The time
-- bound rides attempts_started_idx.
SELECT width_bucket(extract(epoch FROM started_at - due_at)::float8, %(edges)s::float8[])
           AS bucket,
       count(*) AS n
FROM attempts
WHERE attempt = 1 AND started_at >= %(since)s AND started_at < %(until)s
GROUP BY 1;

-- name: claims_per_minute
-- Calls started (claims that reached the gateway) per minute since %(since)s.
SELECT floor(extract(epoch FROM started_at - %(since)s) / 60)::int AS minute, count(*) AS n
FROM attempts
WHERE started_at >= %(since)s AND started_at < %(until)s
GROUP BY 1;

-- name: due_per_minute
-- Payments that fell due per minute since %(since)s. A payment id's leading
-- bits are its due time, so the id range [%(id_from)s, %(id_to)s) is the
-- due window: a range scan of each day's primary key, not of its heap.
SELECT floor(extract(epoch FROM due_at - %(since)s) / 60)::int AS minute, count(*) AS n
FROM payments
WHERE id >= %(id_from)s AND id < %(id_to)s
  AND due_at >= %(since)s AND due_at < %(until)s
GROUP BY 1;

-- name: payments_due
-- A stretch of due time [%(due_from)s, %(due_to)s) in due order (ids sort
-- by due time), from after %(after)s: at most %(scan)s rows are read, and
-- the matches among them returned, at most %(limit)s. Each filter is NULL
-- for any. With the count read and the last id read, so the next page
-- starts where this stretch ended even when nothing in it matched.
WITH scanned AS (
    SELECT id, due_at, payer, payee, amount_minor, currency, status, failure_reason,
           in_doubt, attempt, updated_at, processor
    FROM payments
    WHERE due_at >= %(due_from)s AND due_at < %(due_to)s AND id > %(after)s
    ORDER BY id
    LIMIT %(scan)s
)
SELECT edge.n AS scanned, edge.last_id, s.*
FROM (SELECT count(*) AS n, (SELECT id FROM scanned ORDER BY id DESC LIMIT 1) AS last_id
      FROM scanned) edge
LEFT JOIN LATERAL (
    SELECT * FROM scanned
    WHERE (%(status)s::text IS NULL OR status = %(status)s)
      AND (%(failure_reason)s::text IS NULL OR failure_reason = %(failure_reason)s)
      AND (%(in_doubt)s::boolean IS NULL OR in_doubt = %(in_doubt)s)
      AND (%(processor)s::text IS NULL OR processor = %(processor)s)
    ORDER BY id
    LIMIT %(limit)s
) s ON true
ORDER BY s.id;

-- name: payments_by_keys
-- The payments of a page of (id, due_at) keys, whoever their payer, pruned
-- to the partitions of their due times.
SELECT id, due_at, payer, payee, amount_minor, currency, status, failure_reason, in_doubt,
       attempt, updated_at, processor
FROM payments
WHERE id = ANY(%(ids)s::uuid[]) AND due_at = ANY(%(due_ats)s::timestamptz[]);

-- name: events_of
-- One payment's events, oldest first (payment_events_payment_idx).
SELECT id, type, status, attempt, data, created_at
FROM payment_events WHERE payment_id = %(id)s
ORDER BY id
LIMIT %(limit)s;

-- name: refund_of
-- The refund an operator made of one payment's charge, if any.
SELECT gateway_refund_id, charge_id, amount_minor, requested_by, created_at
FROM refunds WHERE payment_id = %(id)s;

-- name: open_letters_page
-- Open dead letters parked before %(before)s, oldest first, keyset-paged on
-- (created_at, id) after the last one seen (dead_letters_open_age_idx).
SELECT id, payment_id, due_at, payer, reason, last_error, created_at
FROM dead_letters
WHERE resolution IS NULL AND created_at < %(before)s
  AND (created_at, id) > (%(after_created_at)s, %(after_id)s)
ORDER BY created_at, id
LIMIT %(limit)s;

-- name: open_letters_of_payer
-- The same, of one payer, of one reason or any (dead_letters_open_payer_idx).
SELECT id, payment_id, due_at, payer, reason, last_error, created_at
FROM dead_letters
WHERE resolution IS NULL AND payer = %(payer)s
  AND (%(reason)s::text IS NULL OR reason = %(reason)s)
  AND created_at < %(before)s
  AND (created_at, id) > (%(after_created_at)s, %(after_id)s)
ORDER BY payer, created_at, id  -- one payer: the index's own order, no sort
LIMIT %(limit)s;

-- name: open_letters_of_reason
-- The same, of one reason, any payer (dead_letters_open_reason_idx).
SELECT id, payment_id, due_at, payer, reason, last_error, created_at
FROM dead_letters
WHERE resolution IS NULL AND reason = %(reason)s AND created_at < %(before)s
  AND (created_at, id) > (%(after_created_at)s, %(after_id)s)
ORDER BY reason, created_at, id  -- one reason: the index's own order, no sort
LIMIT %(limit)s;

-- name: awaiting_gateway
-- Payments the processor accepted and will tell about, oldest due first,
-- across every day up to %(now)s (payments_attention_idx).
SELECT id, due_at, payer, amount_minor, currency, status, in_doubt_since, updated_at,
       awaiting_since, gateway_intent_id, next_poll_at
FROM payments
WHERE status = 'AWAITING_GATEWAY' AND due_at <= %(now)s
ORDER BY due_at, id
LIMIT %(limit)s;

-- name: parked_in_doubt
-- Payments parked while a call may have charged, whose dead letter is still
-- open, oldest due first, across every day up to %(now)s
-- (payments_attention_idx, then dead_letters_open_idx per row: a letter a
-- human closed leaves its payment FAILED in doubt, but no longer parked).
SELECT p.id, p.due_at, p.payer, p.amount_minor, p.currency, p.status, p.failure_reason,
       p.in_doubt_since, p.updated_at
FROM payments p
WHERE p.status = 'FAILED' AND p.in_doubt AND p.due_at <= %(now)s
  AND EXISTS (SELECT 1 FROM dead_letters d
              WHERE d.payment_id = p.id AND d.resolution IS NULL)
ORDER BY p.due_at, p.id
LIMIT %(limit)s;

-- name: reconciliation_runs_page
-- Reconciliation runs, newest first, keyset-paged on id (its primary key);
-- of days before %(day_before)s and only those with mismatches when asked
-- (a run a day: the filters read what they skip, a few rows a month).
SELECT id, day, started_at, finished_at, charges_seen, repaired, deferred, mismatches, source
FROM reconciliation_runs
WHERE id < %(before_id)s
  AND (%(day_before)s::date IS NULL OR day < %(day_before)s)
  AND (NOT %(mismatches_only)s OR mismatches > 0)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: reconciliation_run
-- One run.
SELECT id, day, started_at, finished_at, charges_seen, repaired, deferred, mismatches, source
FROM reconciliation_runs WHERE id = %(id)s;

-- name: reconciliation_items_page
-- A run's items in order of discovery, keyset-paged on id
-- (reconciliation_items_run_idx).
SELECT id, kind, payment_id, charge_id, detail, created_at
FROM reconciliation_items
WHERE run_id = %(run_id)s AND id > %(after_id)s
ORDER BY id
LIMIT %(limit)s;

-- name: webhook_backlog_page
-- A page of live webhook endpoints by payer, keyset-paged on (actor,
-- created_at, id) (webhook_endpoints_actor_idx), each with its delivery
-- backlog: the events past its cursor, counted up to %(count_cap)s
-- (payment_events_feed_idx), the oldest one's time, and how its delivery
-- went so far, and the endpoint's latest answer to any event (the newest
-- delivery by the primary key, so an endpoint that is caught up still shows
-- how its last delivery went). The page is cut before the backlog is looked
-- at, so only its endpoints are. A payer (%(payer)s, NULL for any) is an
-- equality on the same index's leading column.
WITH page AS (
    SELECT id, actor, url, created_at, next_attempt_at, lease_until, cursor_txid,
           cursor_event_id, created_snapshot
    FROM webhook_endpoints
    WHERE deleted_at IS NULL
      AND (%(payer)s::text IS NULL OR actor = %(payer)s)
      AND (actor, created_at, id) > (%(after_actor)s, %(after_created_at)s, %(after_id)s)
    ORDER BY actor, created_at, id
    LIMIT %(limit)s
)
SELECT w.id, w.actor, w.url, w.created_at, w.next_attempt_at, w.lease_until,
       backlog.n AS backlog, head.id AS head_event_id, head.created_at AS oldest_event_at,
       d.attempts AS head_attempts, d.last_status, d.last_error, d.last_attempt_at,
       latest.last_status AS latest_status, latest.last_error AS latest_error,
       latest.last_attempt_at AS latest_attempt_at
FROM page w
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM payment_events e
        WHERE e.payer = w.actor AND (e.txid, e.id) > (w.cursor_txid, w.cursor_event_id)
          AND NOT pg_visible_in_snapshot(e.txid, w.created_snapshot)
        LIMIT %(count_cap)s
    ) capped
) backlog
LEFT JOIN LATERAL (
    SELECT e.id, e.created_at FROM payment_events e
    WHERE e.payer = w.actor AND (e.txid, e.id) > (w.cursor_txid, w.cursor_event_id)
      AND NOT pg_visible_in_snapshot(e.txid, w.created_snapshot)
    ORDER BY e.txid, e.id
    LIMIT 1
) head ON true
LEFT JOIN webhook_deliveries d ON d.endpoint_id = w.id AND d.event_id = head.id
LEFT JOIN LATERAL (
    SELECT l.last_status, l.last_error, l.last_attempt_at FROM webhook_deliveries l
    WHERE l.endpoint_id = w.id
    ORDER BY l.event_id DESC
    LIMIT 1
) latest ON true
ORDER BY w.actor, w.created_at, w.id;

-- name: pending_of_payer
-- A bulk cancel's payments by payer: the payer's PENDING payments due in
-- [%(due_from)s, %(due_to)s) (payments_fair_idx, (payer, run_at) of the
-- PENDING rows only), at most %(scan)s read and the matches of the other
-- filters among them, with the count read.
WITH scanned AS (
    SELECT id, due_at, payer, amount_minor, currency, status, failure_reason, in_doubt,
           processor
    FROM payments
    WHERE payer = %(payer)s AND status = 'PENDING'
      AND due_at >= %(due_from)s AND due_at < %(due_to)s
    LIMIT %(scan)s
)
SELECT (SELECT count(*) FROM scanned) AS scanned, s.*
FROM (SELECT 1) one
LEFT JOIN LATERAL (
    SELECT * FROM scanned
    WHERE (%(failure_reason)s::text IS NULL OR failure_reason = %(failure_reason)s)
      AND (%(in_doubt)s::boolean IS NULL OR in_doubt = %(in_doubt)s)
      AND (%(processor)s::text IS NULL OR processor = %(processor)s)
) s ON true;

-- name: pending_due
-- A bulk cancel's payments by due range: the PENDING payments due in
-- [%(due_from)s, %(due_to)s) (payments_sweep_idx, the PENDING rows only, of
-- the days named), at most %(scan)s read and the matches of the other
-- filters among them, with the count read.
WITH scanned AS (
    SELECT id, due_at, payer, amount_minor, currency, status, failure_reason, in_doubt,
           processor
    FROM payments
    WHERE status = 'PENDING' AND due_at >= %(due_from)s AND due_at < %(due_to)s
    LIMIT %(scan)s
)
SELECT (SELECT count(*) FROM scanned) AS scanned, s.*
FROM (SELECT 1) one
LEFT JOIN LATERAL (
    SELECT * FROM scanned
    WHERE (%(failure_reason)s::text IS NULL OR failure_reason = %(failure_reason)s)
      AND (%(in_doubt)s::boolean IS NULL OR in_doubt = %(in_doubt)s)
      AND (%(processor)s::text IS NULL OR processor = %(processor)s)
) s ON true;
