-- The failover harness's reads (bench/failover.py). Every payments query is
-- bounded by due_at so future partitions are pruned at plan time.

-- name: failover_open
-- Payments not yet terminal.
SELECT count(*) AS n FROM payments
WHERE status IN ('PENDING', 'PROCESSING') AND due_at < %(until)s;

-- name: failover_payments
-- Every payment of the run with its final state.
SELECT id, payee, status, amount_minor, failure_reason, lease_expiries
FROM payments WHERE due_at < %(until)s;

-- name: failover_claims_around
-- The last claim (a payment.processing event) before a moment and the first
-- after another, and the same for gateway calls (attempt rows started).
SELECT
    (SELECT max(created_at) FROM payment_events
     WHERE type = 'payment.processing' AND created_at <= %(before)s) AS last_claim_before,
    (SELECT min(created_at) FROM payment_events
     WHERE type = 'payment.processing' AND created_at > %(after)s) AS first_claim_after,
    (SELECT min(started_at) FROM attempts WHERE started_at > %(after)s) AS first_call_after;

-- name: failover_counts
-- What the run left behind, counted.
SELECT
    (SELECT count(*) FROM attempts WHERE outcome = 'LEASE_EXPIRED') AS lease_expired_rows,
    (SELECT count(*) FROM attempts WHERE outcome = 'IN_FLIGHT') AS in_flight,
    (SELECT count(*) FROM attempts) AS attempts;

-- name: failover_completed_at
-- When each payment was recorded COMPLETED.
SELECT payment_id, min(created_at) AS at FROM payment_events
WHERE type = 'payment.completed' GROUP BY payment_id;

-- name: failover_longest_gaps
-- The longest stretch without a claim (a payment.processing event), and
-- without a call (an attempt started), from one moment to another: the
-- pause a fault caused, even where a deposed primary ran on for a while.
WITH claims AS (
    SELECT created_at AS at FROM payment_events
    WHERE type = 'payment.processing' AND created_at BETWEEN %(since)s AND %(until)s
    UNION ALL SELECT %(since)s::timestamptz
), calls AS (
    SELECT started_at AS at FROM attempts WHERE started_at BETWEEN %(since)s AND %(until)s
    UNION ALL SELECT %(since)s::timestamptz
)
SELECT
    (SELECT extract(epoch FROM max(gap)) FROM
        (SELECT at - lag(at) OVER (ORDER BY at) AS gap FROM claims) g) AS claims_gap,
    (SELECT extract(epoch FROM max(gap)) FROM
        (SELECT at - lag(at) OVER (ORDER BY at) AS gap FROM calls) g) AS calls_gap;
