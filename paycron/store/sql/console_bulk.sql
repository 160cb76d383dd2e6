-- Console bulk actions, their approvals and the console's audit rows
-- (paycron/engine/console_bulk.py, docs/console.md).

-- name: bulk_request_insert
-- A bulk action over a filter, running at once or awaiting a second operator
-- until %(minutes)s minutes from now (the database's clock).
INSERT INTO console_bulk_requests (action, filter, reason, requested_by, requested_key_id,
                                   state, expires_at, payments, totals)
VALUES (%(action)s, %(filter)s, %(reason)s, %(actor)s, %(key_id)s, %(state)s,
        CASE WHEN %(state)s = 'AWAITING_APPROVAL'
             THEN now() + make_interval(secs => %(minutes)s * 60) END,
        %(payments)s, %(totals)s)
RETURNING *;

-- name: bulk_items_insert
-- The payments the request acts on: exactly those previewed.
INSERT INTO console_bulk_items (request_id, payment_id, due_at, payer, amount_minor, currency)
SELECT %(request_id)s, *
FROM unnest(%(ids)s::uuid[], %(due_ats)s::timestamptz[], %(payers)s::text[],
            %(amounts)s::bigint[], %(currencies)s::text[]);

-- name: bulk_request
-- One request (its primary key).
SELECT *, (state = 'AWAITING_APPROVAL' AND expires_at <= now()) AS lapsed
FROM console_bulk_requests WHERE id = %(id)s;

-- name: bulk_decide
-- Approve (RUNNING) or reject a request by compare-and-swap: only while it
-- awaits approval, before it expires, and never by the operator (actor or
-- key) who asked for it.
UPDATE console_bulk_requests
SET state = %(state)s, decided_by = %(actor)s, decided_key_id = %(key_id)s, decided_at = now()
WHERE id = %(id)s AND state = 'AWAITING_APPROVAL' AND expires_at > now()
  AND requested_by <> %(actor)s AND requested_key_id <> %(key_id)s
RETURNING *;

-- name: bulk_expire
-- Requests nobody decided in time (console_bulk_requests_open_idx).
UPDATE console_bulk_requests
SET state = 'EXPIRED', decided_at = now()
WHERE state = 'AWAITING_APPROVAL' AND expires_at <= now()
RETURNING *;

-- name: bulk_awaiting_page
-- Requests awaiting approval, oldest first (console_bulk_requests_open_idx).
SELECT * FROM console_bulk_requests
WHERE state = 'AWAITING_APPROVAL' AND expires_at > now()
ORDER BY state, id
LIMIT %(limit)s;

-- name: bulk_running
-- Requests the runner works on, oldest first (console_bulk_requests_open_idx).
SELECT id, action, reason, requested_by, decided_by FROM console_bulk_requests
WHERE state = 'RUNNING'
ORDER BY state, id
LIMIT %(limit)s;

-- name: bulk_next_item
-- The next payment of a request not yet done or refused, locked for this
-- transaction; another runner skips it (console_bulk_items_todo_idx).
SELECT payment_id, due_at, payer, amount_minor, currency
FROM console_bulk_items
WHERE request_id = %(request_id)s AND outcome IS NULL
ORDER BY payment_id
LIMIT 1
FOR UPDATE SKIP LOCKED;

-- name: bulk_item_finish
-- A payment's outcome, with the request's counts, in the transaction that acted on it.
WITH item AS (
    UPDATE console_bulk_items
    SET outcome = %(outcome)s, detail = %(detail)s, finished_at = now()
    WHERE request_id = %(request_id)s AND payment_id = %(payment_id)s AND outcome IS NULL
    RETURNING outcome
)
UPDATE console_bulk_requests r
SET done = r.done + (SELECT count(*) FROM item WHERE outcome = 'done'),
    refused = r.refused + (SELECT count(*) FROM item WHERE outcome = 'refused')
WHERE r.id = %(request_id)s
RETURNING (SELECT count(*) FROM item) AS finished;

-- name: bulk_finish
-- A running request whose every payment has its outcome is finished.
UPDATE console_bulk_requests r
SET state = 'FINISHED', finished_at = now()
WHERE r.id = %(id)s AND r.state = 'RUNNING'
  AND NOT EXISTS (SELECT 1 FROM console_bulk_items i
                  WHERE i.request_id = r.id AND i.outcome IS NULL)
RETURNING *;

-- name: bulk_items_page
-- A request's payments in id order, keyset-paged (its primary key).
SELECT payment_id, due_at, payer, amount_minor, currency, outcome, detail, finished_at
FROM console_bulk_items
WHERE request_id = %(request_id)s AND payment_id > %(after)s
ORDER BY request_id, payment_id
LIMIT %(limit)s;

-- name: console_audit_insert
-- One console audit row.
INSERT INTO console_audit (event, outcome, actor, key_id, target, reason, filter, payments,
                           done, refused, request_id)
VALUES (%(event)s, %(outcome)s, %(actor)s, %(key_id)s, %(target)s, %(reason)s, %(filter)s,
        %(payments)s, %(done)s, %(refused)s, %(request_id)s);

-- name: console_audit_page
-- The console's audit rows, newest first, keyset-paged on id (its primary key).
SELECT id, at, event, outcome, actor, key_id, target, reason, filter, payments, done, refused,
       request_id
FROM console_audit
WHERE id < %(before_id)s
ORDER BY id DESC
LIMIT %(limit)s;
