-- The soak's checks. Every payments query is bounded by due_at (%(until)s)
-- so future partitions are pruned at plan time.

-- name: soak_open
-- Payments not yet terminal.
SELECT count(*) AS n FROM payments
WHERE status IN ('PENDING', 'PROCESSING', 'AWAITING_GATEWAY') AND due_at < %(until)s;

-- name: soak_payments
-- Every payment of the soak with its final state.
SELECT id, status, amount_minor, failure_reason FROM payments WHERE due_at < %(until)s;

-- name: soak_counts
-- The invariants, counted.
WITH p AS (
    SELECT id, status, failure_reason FROM payments WHERE due_at < %(until)s
)
SELECT
    (SELECT count(*) FROM p WHERE status IN ('PENDING', 'PROCESSING', 'AWAITING_GATEWAY'))
        AS open,
    (SELECT count(*) FROM p
     WHERE status = 'FAILED'
       AND failure_reason IN ('RETRIES_EXHAUSTED', 'LEASE_EXPIRED_REPEATEDLY', 'LOOKUP_MISMATCH',
                              'GATEWAY_REJECTED')
       AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.payment_id = p.id))
        AS parked_without_letter,
    (SELECT count(*) FROM p WHERE status = 'FAILED' AND failure_reason IS NULL)
        AS failed_without_reason,
    (SELECT count(*) FROM attempts
     WHERE outcome IN ('SUCCEEDED', 'DECLINED', 'RETRYABLE_ERROR', 'AMBIGUOUS', 'RATE_LIMITED',
                       'FOUND_BY_LOOKUP', 'KEY_IN_USE', 'REJECTED', 'AUTH_FAILED', 'SUBMITTED'))
        AS call_rows,
    (SELECT count(*) FROM attempts WHERE outcome = 'LEASE_EXPIRED') AS lease_expired_rows,
    (SELECT count(*) FROM attempts WHERE outcome = 'IN_FLIGHT') AS in_flight,
    (SELECT count(*) FROM p
     WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED')
       AND NOT EXISTS (SELECT 1 FROM payment_events e
                       WHERE e.payment_id = p.id AND e.status = p.status)) AS missing_events;

-- name: soak_settlements
-- Payments that waited for the processor (a SUBMITTED attempt), and how each
-- wait ended: by a signed event, by the poller, or not yet.
SELECT
    (SELECT count(DISTINCT payment_id) FROM attempts WHERE outcome = 'SUBMITTED') AS waited,
    (SELECT count(*) FROM attempts WHERE worker = 'gateway-event') AS by_event,
    (SELECT count(*) FROM attempts WHERE worker = 'gateway-poll') AS by_poll,
    (SELECT count(*) FROM gateway_events) AS events_stored,
    (SELECT count(*) FROM gateway_events WHERE applied_at IS NULL) AS events_pending;

-- name: soak_message_faults
-- The message-path faults, judged: claims handed back after a failed
-- enqueue; of those, any whose attempt a worker had started (its call may
-- charge: never released); anything the other processor's process changed
-- (a dead letter it resolved, a payment event it caused).
SELECT
    (SELECT count(*) FROM payment_events
     WHERE type = 'payment.released' AND data->>'reason' = 'enqueue_failed')
        AS released_enqueue_failed,
    (SELECT count(*) FROM payment_events e
     JOIN attempts a ON a.payment_id = e.payment_id AND a.attempt = e.attempt
     WHERE e.type = 'payment.released') AS released_started,
    (SELECT count(*) FROM dead_letters WHERE resolved_by = %(actor)s)
    + (SELECT count(*) FROM payment_events WHERE data->>'by' = %(actor)s) AS changed_by_other;

-- name: soak_oldest_letter
-- The oldest open dead letter (the one the CLI re-drives).
SELECT payment_id FROM dead_letters WHERE resolution IS NULL ORDER BY created_at LIMIT 1;
