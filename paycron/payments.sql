-- name: create_payment
-- One statement, one transaction: the idempotency row, the payment and its
-- created event. A conflicting (actor, key) waits for the first writer and
-- then inserts nothing: zero rows back means "look the key up again".
WITH idem AS (
    INSERT INTO idempotency_keys (actor, key, request_hash, payment_id, due_at)
    VALUES (%(actor)s, %(key)s, %(request_hash)s, %(id)s, %(due_at)s)
    ON CONFLICT (actor, key) DO NOTHING
    RETURNING payment_id
), pay AS (
    INSERT INTO payments (id, due_at, payer, payee, amount_minor, currency, run_at)
    SELECT %(id)s, %(due_at)s, %(actor)s, %(payee)s, %(amount_minor)s, %(currency)s, %(run_at)s
    FROM idem
    RETURNING *
), ev AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt, data)
    SELECT id, payer, 'payment.created', status, attempt,
           jsonb_build_object('amount', amount_minor, 'currency', currency, 'dueAt', due_at)
    FROM pay
)
SELECT * FROM pay;

-- name: find_idempotency_key
-- The earlier create under this (actor, key), if any.
SELECT request_hash, payment_id, due_at FROM idempotency_keys
WHERE actor = %(actor)s AND key = %(key)s;

-- name: get_payment
-- One payment by id, pruned to one partition by the id's due range; scoped to its payer.
SELECT * FROM payments
WHERE id = %(id)s AND due_at >= %(due_from)s AND due_at < %(due_to)s
  AND (%(actor)s::text IS NULL OR payer = %(actor)s);

-- name: get_attempts
-- A payment's attempts, oldest first.
SELECT attempt, gateway_key, started_at, finished_at, outcome, error_code, gateway_ref, worker
FROM attempts WHERE payment_id = %(id)s ORDER BY attempt;

-- name: list_payments
-- A payer's payments, newest first, keyset-paged on (created_at, id).
SELECT * FROM payments
WHERE payer = %(actor)s
  AND (created_at, id) < (%(before_created_at)s, %(before_id)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;
