-- The console's history and webhook-delivery reads (web/console/history.py).
-- Like console.sql: each bounded and riding an index. The charts read the
-- per-minute rollup (history_minutes), never attempts.

-- name: history_range
-- The rollup's minutes in [%(since)s, %(until)s) summed into buckets of
-- %(step_seconds)s, with the number of minutes rolled up in each (fewer
-- than the bucket holds: the roller has not reached them). At most 10,080
-- rows of the primary key (7 days).
SELECT date_bin(make_interval(secs => %(step_seconds)s), minute, %(since)s) AS bucket,
       count(*) AS minutes,
       sum(attempts) AS attempts, sum(first_attempts) AS first_attempts,
       sum(finished) AS finished, sum(completed) AS completed,
       sum(processor_errors) AS processor_errors,
       sum(lateness_sum_seconds) AS lateness_sum_seconds,
       sum(dead_letters) AS dead_letters
FROM history_minutes
WHERE minute >= %(since)s AND minute < %(until)s
GROUP BY 1;

-- name: history_lateness_range
-- The same buckets' lateness histograms, summed bucket by bucket: (bucket,
-- edge index, first attempts).
SELECT date_bin(make_interval(secs => %(step_seconds)s), h.minute, %(since)s) AS bucket,
       b.i - 1 AS edge, sum(b.n) AS n
FROM history_minutes h, unnest(h.lateness_buckets) WITH ORDINALITY AS b(n, i)
WHERE h.minute >= %(since)s AND h.minute < %(until)s
GROUP BY 1, 2;

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
