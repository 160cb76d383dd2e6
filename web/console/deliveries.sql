-- An endpoint's webhook deliveries and their replays
-- (web/console/deliveries.py). Like console.sql: each bounded and riding an
-- index.

-- name: webhook_endpoint
-- One endpoint (deleted ones too: their deliveries stay readable).
SELECT id, actor, url, created_at, deleted_at, next_attempt_at
FROM webhook_endpoints WHERE id = %(id)s;

-- name: webhook_deliveries_page
-- An endpoint's deliveries, newest event first, keyset-paged on event_id
-- below %(before_event_id)s (webhook_deliveries_pkey).
SELECT event_id, attempts, last_status, last_error, last_latency_ms, first_attempt_at,
       last_attempt_at, delivered_at
FROM webhook_deliveries
WHERE endpoint_id = %(endpoint_id)s AND event_id < %(before_event_id)s
ORDER BY event_id DESC
LIMIT %(limit)s;

-- name: webhook_replays_of
-- An endpoint's latest replays, newest first (webhook_replays_endpoint_idx).
SELECT id, event_id, requested_by, requested_at, done_at, status, error, latency_ms
FROM webhook_replays
WHERE endpoint_id = %(endpoint_id)s
ORDER BY id DESC
LIMIT %(limit)s;

-- name: webhook_replay_request
-- A replay of one delivery, queued for the relay: only of a delivery the
-- endpoint has (the primary key), while the endpoint is live and its
-- event still in the outbox. No row back: nothing to replay.
INSERT INTO webhook_replays (endpoint_id, event_id, requested_by)
SELECT d.endpoint_id, d.event_id, %(requested_by)s
FROM webhook_deliveries d
JOIN webhook_endpoints w ON w.id = d.endpoint_id AND w.deleted_at IS NULL
WHERE d.endpoint_id = %(endpoint_id)s AND d.event_id = %(event_id)s
  AND EXISTS (SELECT 1 FROM payment_events e WHERE e.id = d.event_id)
RETURNING id;
