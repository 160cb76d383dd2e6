-- The processor's signed events (SPEC §12): stored by the web as received,
-- applied by the scheduler's gateway-event service.

-- name: store_gateway_event
-- Idempotent on the processor's event id: a duplicate delivery stores nothing.
INSERT INTO gateway_events (id, processor, type, intent_id, payment_id, payload)
VALUES (%(id)s, %(processor)s, %(type)s, %(intent_id)s, %(payment_id)s, %(payload)s)
ON CONFLICT (processor, id) DO NOTHING
RETURNING id;

-- name: claim_pending_gateway_events
-- Events to apply now, oldest first, each claimed for %(claim_seconds)s by
-- moving its next attempt out (committed before the processor is asked: no
-- connection waits on a call; a crash only delays the event). SKIP LOCKED:
-- schedulers share them. Only events of %(processor)s, the processor this
-- scheduler can ask: another's events wait for a scheduler configured for it.
WITH due AS (
    SELECT processor, id FROM gateway_events
    WHERE applied_at IS NULL AND next_attempt_at <= now() AND processor = %(processor)s
    ORDER BY next_attempt_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE gateway_events e
SET next_attempt_at = now() + make_interval(secs => %(claim_seconds)s)
FROM due
WHERE e.processor = due.processor AND e.id = due.id
RETURNING e.id, e.processor, e.type, e.intent_id, e.payment_id, e.attempts, e.received_at;

-- name: gateway_event_applied
-- Done with: applied, or found to need nothing (the result says which).
UPDATE gateway_events SET applied_at = now(), result = %(result)s, attempts = attempts + 1
WHERE processor = %(processor)s AND id = %(id)s;

-- name: gateway_event_later
-- Cannot apply yet (its payment is still PROCESSING): tried again later.
UPDATE gateway_events
SET attempts = attempts + 1, result = %(result)s,
    next_attempt_at = now() + make_interval(secs => %(delay)s)
WHERE processor = %(processor)s AND id = %(id)s;

-- name: pending_gateway_events
-- How many wait to be applied, and the oldest's age in seconds.
SELECT count(*) AS n, extract(epoch FROM now() - min(received_at)) AS oldest_age
FROM gateway_events WHERE applied_at IS NULL;
