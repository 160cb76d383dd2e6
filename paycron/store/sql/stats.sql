-- name: lateness
-- Trigger lateness (first attempt's start - due time) percentiles, in
-- seconds, over first attempts started since %(since)s.
SELECT count(*) AS n,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - due_at)) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - due_at)) AS p99,
       max(extract(epoch FROM started_at - due_at)) AS max
FROM attempts
WHERE attempt = 1 AND started_at >= %(since)s;

-- name: health
-- The operator's numbers: backlog, oldest due pending age, DLQ, lease expiries.
-- %(now)s (not now()) bounds due_at so future partitions are pruned at plan time.
SELECT
    (SELECT count(*) FROM payments
     WHERE status = 'PENDING' AND run_at <= now() AND due_at <= %(now)s) AS backlog,
    (SELECT extract(epoch FROM now() - min(run_at)) FROM payments
     WHERE status = 'PENDING' AND run_at <= now() AND due_at <= %(now)s) AS oldest_due_age,
    (SELECT count(*) FROM payments
     WHERE status = 'PROCESSING' AND due_at <= %(now)s) AS processing,
    (SELECT count(*) FROM payments
     WHERE status = 'AWAITING_GATEWAY' AND due_at <= %(now)s) AS awaiting_gateway,
    (SELECT extract(epoch FROM now() - min(awaiting_since)) FROM payments
     WHERE status = 'AWAITING_GATEWAY' AND due_at <= %(now)s) AS oldest_awaiting_age,
    (SELECT count(*) FROM dead_letters WHERE resolution IS NULL) AS dlq_open,
    -- first called at another processor than the configured one: never
    -- claimed here (docs/design.md), waiting for an operator
    (SELECT count(*) FROM payments
     WHERE status = 'PENDING' AND processor <> %(processor)s
       AND due_at <= %(now)s) AS other_processor,
    (SELECT count(*) FROM attempts
     WHERE outcome = 'LEASE_EXPIRED' AND started_at >= %(since)s) AS lease_expiries,
    (SELECT count(*) FROM attempts WHERE started_at >= %(since)s) AS attempts;

-- name: metrics_gauges
-- The scrape-time gauges. Every payments subquery is bounded by %(now)s so
-- future partitions are pruned at plan time.
SELECT
    (SELECT extract(epoch FROM now() - min(run_at)) FROM payments
     WHERE status = 'PENDING' AND run_at <= now() AND due_at <= %(now)s) AS oldest_due_age,
    (SELECT count(*) FROM payments
     WHERE status = 'PENDING' AND run_at <= now() AND due_at <= %(now)s) AS backlog,
    (SELECT count(*) FROM payments
     WHERE status = 'PROCESSING' AND due_at <= %(now)s) AS processing,
    (SELECT count(*) FROM payments
     WHERE due_at > %(since)s AND due_at <= %(now)s) AS due_5m,
    (SELECT count(*) FROM dead_letters WHERE resolution IS NULL) AS dlq_open,
    -- accepted by the processor, settled later (bank debits): how many, how old
    (SELECT count(*) FROM payments
     WHERE status = 'AWAITING_GATEWAY' AND due_at <= %(now)s) AS awaiting,
    (SELECT extract(epoch FROM now() - min(awaiting_since)) FROM payments
     WHERE status = 'AWAITING_GATEWAY' AND due_at <= %(now)s) AS oldest_awaiting_age,
    (SELECT count(*) FROM gateway_events WHERE applied_at IS NULL) AS gateway_events_pending,
    -- The latest run of the most recent day reconciled: nonzero pages.
    (SELECT mismatches FROM reconciliation_runs
     ORDER BY day DESC, id DESC LIMIT 1) AS mismatches;
