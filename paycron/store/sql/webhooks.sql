-- Webhook endpoints and their delivery streams.
--
-- Each endpoint is an ordered stream of its payer's events, read like the
-- events feed (txid below the snapshot's xmin, (txid, id) order) from the
-- cursor stored on the endpoint row. A relay claims an endpoint with a lease
-- (FOR UPDATE SKIP LOCKED, so relays take disjoint sets), commits, makes its
-- HTTP calls outside any transaction, and moves the cursor one statement per
-- event, fenced on its lease_owner: a relay whose lease ran out moves nothing.

-- name: webhook_endpoint_lock_actor
-- Serialises one payer's registrations until the transaction ends, so the
-- count below cannot be raced. Its own statement: the insert's snapshot
-- must be taken after the lock is held. Two-key form (class 7, the actor's
-- hash): apart from the one-bigint locks of migrate and admin; two payers
-- whose names collide merely wait for each other.
SELECT pg_advisory_xact_lock(7, hashtext(%(actor)s));

-- name: webhook_endpoint_create
-- A new endpoint if the payer has fewer than %(max_endpoints)s live ones
-- (NULL: no quota; no row back: the quota is full); its stream starts at its
-- creation (the table's defaults). Run under webhook_endpoint_lock_actor.
INSERT INTO webhook_endpoints (actor, url, secret)
SELECT %(actor)s, %(url)s, %(secret)s
WHERE %(max_endpoints)s::integer IS NULL
   OR (SELECT count(*) FROM webhook_endpoints
       WHERE actor = %(actor)s AND deleted_at IS NULL) < %(max_endpoints)s::integer
RETURNING id, url, secret, created_at;

-- name: webhook_endpoints_of
-- A page of a payer's live endpoints, oldest first, keyset-paged on
-- (created_at, id) after the last one seen (never the secret).
SELECT id, url, created_at FROM webhook_endpoints
WHERE actor = %(actor)s AND deleted_at IS NULL
  AND (created_at, id) > (%(after_created_at)s, %(after_id)s)
ORDER BY created_at, id
LIMIT %(limit)s;

-- name: webhook_endpoint_delete
-- Soft delete, scoped to its payer; repeating it changes nothing.
UPDATE webhook_endpoints SET deleted_at = coalesce(deleted_at, now())
WHERE id = %(id)s AND actor = %(actor)s
RETURNING id;

-- name: webhook_claim_endpoints
-- Lease up to %(limit)s live endpoints that have an event to send and are
-- not backing off, fairly across payers: a payer's endpoints are ranked
-- after the ones it already has leased, and a claim takes every payer's
-- first before anyone's second (least recently served first within a
-- rank), so a payer with N endpoints does not get N shares of the relay.
-- The lease checks are repeated on the locking level: FOR UPDATE rechecks
-- only those against a row another relay claimed meanwhile.
WITH candidates AS (
    SELECT w.id, w.actor, w.next_attempt_at FROM webhook_endpoints w
    WHERE w.deleted_at IS NULL AND w.next_attempt_at <= now()
      AND (w.lease_until IS NULL OR w.lease_until < now())
      AND EXISTS (
          SELECT 1 FROM payment_events e
          WHERE e.payer = w.actor
            AND (e.txid, e.id) > (w.cursor_txid, w.cursor_event_id)
            AND e.txid < pg_snapshot_xmin(pg_current_snapshot())
            AND NOT pg_visible_in_snapshot(e.txid, w.created_snapshot))
), leased AS (
    SELECT actor, count(*) AS n FROM webhook_endpoints
    WHERE deleted_at IS NULL AND lease_until >= now()
      AND actor IN (SELECT actor FROM candidates)
    GROUP BY actor
), ranked AS (
    SELECT c.id, c.next_attempt_at,
           coalesce(l.n, 0)
             + row_number() OVER (PARTITION BY c.actor ORDER BY c.next_attempt_at, c.id)
             AS share
    FROM candidates c LEFT JOIN leased l ON l.actor = c.actor
), due AS (
    SELECT w.id FROM webhook_endpoints w JOIN ranked r ON r.id = w.id
    WHERE w.deleted_at IS NULL AND w.next_attempt_at <= now()
      AND (w.lease_until IS NULL OR w.lease_until < now())
    ORDER BY r.share, r.next_attempt_at, r.id
    LIMIT %(limit)s
    FOR UPDATE OF w SKIP LOCKED
)
UPDATE webhook_endpoints w
SET lease_until = now() + make_interval(secs => %(lease_seconds)s),
    lease_owner = gen_random_uuid()
FROM due
WHERE w.id = due.id
RETURNING w.id, w.url, w.secret, w.lease_owner;

-- name: webhook_pending_events
-- The next events of a leased endpoint's stream, with the attempts each has
-- had at this endpoint so far (only the head of a stream has any).
SELECT e.id, e.txid::text AS txid, e.payment_id, e.type, e.status, e.attempt, e.data,
       e.created_at, coalesce(d.attempts, 0) AS attempts
FROM webhook_endpoints w
JOIN payment_events e
  ON e.payer = w.actor AND (e.txid, e.id) > (w.cursor_txid, w.cursor_event_id)
LEFT JOIN webhook_deliveries d ON d.endpoint_id = w.id AND d.event_id = e.id
WHERE w.id = %(endpoint_id)s AND w.lease_owner = %(lease_owner)s
  AND e.txid < pg_snapshot_xmin(pg_current_snapshot())
  AND NOT pg_visible_in_snapshot(e.txid, w.created_snapshot)
ORDER BY e.txid, e.id
LIMIT %(limit)s;

-- name: webhook_record_delivered
-- A 2xx: the delivery recorded (it happened, lease or not) and the cursor
-- moved past the event if the lease still holds. No row back: lease lost.
WITH delivery AS (
    INSERT INTO webhook_deliveries AS d
        (endpoint_id, event_id, attempts, last_status, delivered_at, last_latency_ms)
    VALUES (%(endpoint_id)s, %(event_id)s, 1, %(status)s, now(), %(latency_ms)s)
    ON CONFLICT (endpoint_id, event_id) DO UPDATE
    SET attempts = d.attempts + 1, last_status = excluded.last_status, last_error = NULL,
        last_attempt_at = now(), delivered_at = coalesce(d.delivered_at, now()),
        last_latency_ms = excluded.last_latency_ms
)
UPDATE webhook_endpoints
SET cursor_txid = %(txid)s::xid8, cursor_event_id = %(event_id)s
WHERE id = %(endpoint_id)s AND lease_owner = %(lease_owner)s
RETURNING deleted_at IS NULL AS live;

-- name: webhook_record_failed
-- A non-2xx or no answer: the attempt recorded, the endpoint backs off and
-- its lease is released; the same event heads the stream next time.
WITH delivery AS (
    INSERT INTO webhook_deliveries AS d
        (endpoint_id, event_id, attempts, last_status, last_error, last_latency_ms)
    VALUES (%(endpoint_id)s, %(event_id)s, 1, %(status)s, %(error)s, %(latency_ms)s)
    ON CONFLICT (endpoint_id, event_id) DO UPDATE
    SET attempts = d.attempts + 1, last_status = excluded.last_status,
        last_error = excluded.last_error, last_attempt_at = now(),
        last_latency_ms = excluded.last_latency_ms
)
UPDATE webhook_endpoints
SET next_attempt_at = now() + make_interval(secs => %(delay)s),
    lease_until = NULL, lease_owner = NULL
WHERE id = %(endpoint_id)s AND lease_owner = %(lease_owner)s;

-- name: webhook_release_endpoint
-- The lease handed back after a batch; the endpoint goes to the back of the
-- claim order.
UPDATE webhook_endpoints
SET lease_until = NULL, lease_owner = NULL, next_attempt_at = now()
WHERE id = %(endpoint_id)s AND lease_owner = %(lease_owner)s;

-- name: webhook_claim_replays
-- Lease up to %(limit)s of the replays operators asked for, oldest first
-- (webhook_replays_waiting_idx), each with its endpoint's URL and secret
-- and its event as the stream would send it (no event: pruned from the
-- outbox; the endpoint deleted: live is false). A replay whose lease ran
-- out (its relay died mid-send) is claimed again.
WITH due AS (
    SELECT r.id, r.endpoint_id, r.event_id FROM webhook_replays r
    WHERE r.done_at IS NULL AND (r.lease_until IS NULL OR r.lease_until < now())
    ORDER BY r.requested_at, r.id
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
), found AS (
    SELECT due.id, w.url, w.secret, w.deleted_at IS NULL AS live,
           e.id AS event_id, e.txid::text AS txid, e.payment_id, e.type, e.status, e.attempt,
           e.data, e.created_at
    FROM due
    JOIN webhook_endpoints w ON w.id = due.endpoint_id
    LEFT JOIN payment_events e ON e.id = due.event_id AND e.payer = w.actor
)
UPDATE webhook_replays r
SET lease_until = now() + make_interval(secs => %(lease_seconds)s)
FROM found
WHERE r.id = found.id
RETURNING r.id, r.endpoint_id, found.url, found.secret, found.live, found.event_id,
          found.txid, found.payment_id, found.type, found.status, found.attempt, found.data,
          found.created_at;

-- name: webhook_record_replay
-- A replay's answer (or its absence): done, once (a second relay that sent
-- it after a lost lease records nothing over the first).
UPDATE webhook_replays
SET done_at = now(), lease_until = NULL, status = %(status)s, error = %(error)s,
    latency_ms = %(latency_ms)s
WHERE id = %(id)s AND done_at IS NULL;
