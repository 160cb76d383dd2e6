-- Figures only the demo and the benchmarks read (paycron's own, for
-- `paycron stats` and /metrics, are in paycron/stats.sql).

-- name: status_counts
-- Payments by status (the demo's progress table).
SELECT status, count(*) AS n FROM payments GROUP BY status;

-- name: outcome_summary
-- What happened to the payments: terminal states, retried, parked.
SELECT
    count(*) FILTER (WHERE status = 'COMPLETED') AS completed,
    count(*) FILTER (WHERE status = 'FAILED' AND failure_reason = 'DECLINED') AS declined,
    count(*) FILTER (WHERE status = 'FAILED' AND failure_reason <> 'DECLINED') AS parked,
    count(*) FILTER (WHERE status = 'CANCELLED') AS cancelled,
    count(*) FILTER (WHERE status IN ('PENDING', 'PROCESSING', 'AWAITING_GATEWAY')) AS open,
    count(*) FILTER (WHERE attempt > 1) AS retried,
    count(*) FILTER (WHERE lease_expiries > 0) AS lease_expired,
    coalesce(sum(amount_minor) FILTER (WHERE status = 'COMPLETED'), 0) AS completed_minor
FROM payments;

-- name: open_payments
-- Payments not yet terminal among those due before %(until)s.
SELECT count(*) AS n FROM payments
WHERE status IN ('PENDING', 'PROCESSING', 'AWAITING_GATEWAY') AND due_at < %(until)s;

-- name: settled_counts
-- Completed payments and payments whose lease ever expired, among those due
-- before %(until)s (the benchmarks' summary).
SELECT count(*) FILTER (WHERE status = 'COMPLETED') AS completed,
       count(*) FILTER (WHERE lease_expiries > 0) AS lease_expired
FROM payments WHERE due_at < %(until)s;

-- name: debit_summary
-- Payments the processor accepted and settled later (bank debits), and who
-- learned each settlement: its signed event, or the poller (event lost).
SELECT
    (SELECT count(DISTINCT payment_id) FROM payment_events
     WHERE type = 'payment.awaiting_gateway') AS debits,
    count(*) FILTER (WHERE worker = 'gateway-event') AS settled_by_event,
    count(*) FILTER (WHERE worker = 'gateway-poll') AS settled_by_poll
FROM attempts
WHERE worker IN ('gateway-event', 'gateway-poll');
