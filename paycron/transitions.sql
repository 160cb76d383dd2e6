-- Every status transition of a payment, each a single conditional UPDATE
-- (compare-and-swap) that writes its event in the same statement. Zero rows
-- back means the row was not in the expected state: the caller lost a race.

-- name: cancel
-- PENDING -> CANCELLED, only while no earlier call may have charged.
WITH cancelled AS (
    UPDATE payments SET status = 'CANCELLED', updated_at = now()
    WHERE id = %(id)s AND due_at >= %(due_from)s AND due_at < %(due_to)s
      AND payer = %(actor)s AND status = 'PENDING' AND NOT in_doubt
    RETURNING id, payer, status, attempt
), ev AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt)
    SELECT id, payer, 'payment.cancelled', status, attempt FROM cancelled
)
SELECT id FROM cancelled;

-- name: claim_due
-- PENDING -> PROCESSING for up to %(limit)s due rows, oldest run_at first.
-- due_at <= now() is implied by run_at <= now() but lets Postgres prune
-- every future partition at run time. SKIP LOCKED: concurrent sweepers take
-- disjoint batches without waiting on each other.
WITH due AS (
    SELECT id, due_at FROM payments
    WHERE status = 'PENDING' AND run_at <= now() AND due_at <= now()
    ORDER BY run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE payments p
    SET status = 'PROCESSING',
        lease_until = now() + make_interval(secs => %(lease_seconds)s),
        attempt = p.attempt + 1,
        updated_at = now()
    FROM due
    WHERE p.id = due.id AND p.due_at = due.due_at AND p.status = 'PENDING'
    RETURNING p.id, p.due_at, p.payer, p.attempt, p.run_at
), ev AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt)
    SELECT id, payer, 'payment.processing', 'PROCESSING', attempt FROM claimed
)
SELECT id, due_at, attempt FROM claimed ORDER BY run_at;
