-- name: create_payment
-- One statement, one transaction: the idempotency row, the payment and its
-- created event. A conflicting (actor, key) waits for the first writer and
-- then inserts nothing; so does a payment naming a customer not bound to
-- this actor (yet): zero rows back means "look the key and the customer up".
-- A binding is never undone, so one this statement sees stays true.
WITH idem AS (
    INSERT INTO idempotency_keys (actor, key, request_hash, payment_id, due_at)
    SELECT %(actor)s, %(key)s, %(request_hash)s, %(id)s, %(due_at)s
    WHERE %(customer)s::text IS NULL OR EXISTS (
        SELECT 1 FROM customers
        WHERE processor = %(processor)s AND customer = %(customer)s AND actor = %(actor)s)
    ON CONFLICT (actor, key) DO NOTHING
    RETURNING payment_id
), pay AS (
    INSERT INTO payments (id, due_at, payer, payee, amount_minor, currency, run_at,
                          payment_method, customer)
    SELECT %(id)s, %(due_at)s, %(actor)s, %(payee)s, %(amount_minor)s, %(currency)s, %(run_at)s,
           %(payment_method)s, %(customer)s
    FROM idem
    RETURNING *
), ev AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt, data)
    SELECT id, payer, 'payment.created', status, attempt,
           jsonb_build_object('amount', amount_minor, 'currency', currency, 'dueAt', due_at)
    FROM pay
)
SELECT * FROM pay;

-- name: customer_owner
-- The actor a processor's customer is bound to, if it is bound.
SELECT actor FROM customers WHERE processor = %(processor)s AND customer = %(customer)s;

-- name: bind_customer
-- Binds a processor's customer to the actor naming it, unless it is bound.
-- A concurrent binding of the same customer waits for the first writer and
-- then inserts nothing: zero rows back means "read the owner again".
INSERT INTO customers (processor, customer, actor)
VALUES (%(processor)s, %(customer)s, %(actor)s)
ON CONFLICT (processor, customer) DO NOTHING
RETURNING actor;

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

-- name: list_page_keys
-- A payer's payments, newest first, keyset-paged on (created_at, id): read
-- from the unpartitioned idempotency table (one row per payment).
SELECT payment_id, due_at, created_at FROM idempotency_keys
WHERE actor = %(actor)s AND (created_at, payment_id) < (%(before_created_at)s, %(before_id)s)
ORDER BY created_at DESC, payment_id DESC
LIMIT %(limit)s;

-- name: payments_by_keys
-- The payments of one page, pruned to the partitions of their due times.
SELECT * FROM payments
WHERE id = ANY(%(ids)s::uuid[]) AND due_at = ANY(%(due_ats)s::timestamptz[])
  AND payer = %(actor)s AND (%(status)s::text IS NULL OR status = %(status)s);

-- name: touch_idempotency_key
-- A replay's write: rewrites the key's row unchanged, so this session's commit
-- waits for the synchronous standby (a commit that wrote nothing does not),
-- and the replay answers only once the payment it returns is on the standby.
UPDATE idempotency_keys SET request_hash = request_hash
WHERE actor = %(actor)s AND key = %(key)s;

-- name: notify_due
-- A payment falls due within the sweep interval: wake the sweepers (they
-- LISTEN on this channel; delivered at commit, so the row is visible).
NOTIFY paycron_due;

-- name: listen_due
LISTEN paycron_due;
