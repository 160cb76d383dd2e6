-- name: stage_batch_items
-- The session's staging table of a batch's items, made on the session's
-- first batch: a row per item that creates, COPYed in binary (psycopg
-- writes the rows in C and Postgres reads the values without parsing text:
-- typed arrays per column, or one JSON parameter, cost 2-3 times as much
-- CPU per 1,000 items, on both sides); ord is the item's place in key
-- order. Private to the session, never logged, emptied at every commit
-- or rollback.
CREATE TEMPORARY TABLE IF NOT EXISTS batch_items (
    ord integer NOT NULL,
    key text NOT NULL,
    request_hash bytea NOT NULL,
    id uuid NOT NULL,
    due_at timestamptz NOT NULL,
    payee text NOT NULL,
    amount_minor bigint NOT NULL,
    currency text NOT NULL,
    run_at timestamptz NOT NULL,
    payment_method text,
    customer text
) ON COMMIT DELETE ROWS;

-- name: copy_batch_items
-- The batch's items into its staging table (binary; the columns in this order).
COPY batch_items (ord, key, request_hash, id, due_at, payee, amount_minor, currency, run_at,
                  payment_method, customer)
FROM STDIN (FORMAT BINARY);

-- name: create_batch
-- A batch create's write: the idempotency rows, the payments and their
-- created events of the staged items, in one statement, in the
-- transaction that staged them. The rows are inserted in key order: two
-- batches sharing keys wait for each other in one order, never in a cycle.
-- A key already used (or used by a concurrent create, which this waits
-- for) inserts nothing: only the payments actually created come back, with
-- the columns an answer shows. Payments naming a customer come here only
-- once the customer is bound to this actor.
WITH idem AS (
    INSERT INTO idempotency_keys (actor, key, request_hash, payment_id, due_at)
    SELECT %(actor)s, key, request_hash, id, due_at FROM batch_items ORDER BY ord
    ON CONFLICT (actor, key) DO NOTHING
    RETURNING payment_id
), pay AS (
    INSERT INTO payments (id, due_at, payer, payee, amount_minor, currency, run_at,
                          payment_method, customer)
    SELECT i.id, i.due_at, %(actor)s, i.payee, i.amount_minor, i.currency, i.run_at,
           i.payment_method, i.customer
    FROM batch_items i JOIN idem ON idem.payment_id = i.id
    RETURNING *
), ev AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt, data)
    SELECT id, payer, 'payment.created', status, attempt,
           jsonb_build_object('amount', amount_minor, 'currency', currency, 'dueAt', due_at)
    FROM pay
), unbound AS (
    -- A customer this transaction bound for an item that then created
    -- nothing (its key was used) is bound back: a binding is made only by
    -- a create that names it.
    DELETE FROM customers
    WHERE processor = %(processor)s AND customer = ANY(%(bound)s::text[])
      AND customer NOT IN (SELECT customer FROM pay WHERE customer IS NOT NULL)
)
SELECT id, payer, payee, amount_minor, currency, payment_method, customer, due_at, status,
       failure_reason, in_doubt, run_at, refunded_at, created_at, updated_at
FROM pay;

-- name: find_idempotency_keys
-- The earlier creates under these (actor, key)s, if any.
SELECT key, request_hash, payment_id, due_at FROM idempotency_keys
WHERE actor = %(actor)s AND key = ANY(%(keys)s::text[]);

-- name: touch_idempotency_keys
-- The replays' write, as touch_idempotency_key for many keys: the batch's
-- commit then waits for the synchronous standby. The rows are locked in key
-- order first: an UPDATE alone locks them in its plan's order (the heap's
-- for a scan, the index's for an index scan), and two batches replaying
-- the same keys under different plans deadlocked.
UPDATE idempotency_keys k SET request_hash = k.request_hash
FROM (SELECT actor, key FROM idempotency_keys
      WHERE actor = %(actor)s AND key = ANY(%(keys)s::text[])
      ORDER BY key
      FOR UPDATE) locked
WHERE k.actor = locked.actor AND k.key = locked.key;

-- name: customer_owners
-- The actors these processor customers are bound to, for those that are bound.
SELECT customer, actor FROM customers
WHERE processor = %(processor)s AND customer = ANY(%(customers)s::text[]);

-- name: bind_customers
-- Binds processor customers to the actor naming them, those not bound yet,
-- in the customers' order (concurrent binders wait in one order); a
-- concurrent binding of the same customer waits for the first writer and
-- then inserts nothing. Returns the customers this bound.
INSERT INTO customers (processor, customer, actor)
SELECT %(processor)s, c, %(actor)s FROM unnest(%(customers)s::text[]) AS c ORDER BY c
ON CONFLICT (processor, customer) DO NOTHING
RETURNING customer;

-- name: payment_partition_days
-- Which of these days have a partition of payments (by the keeper's names).
SELECT d::date AS day FROM unnest(%(days)s::date[]) AS d
WHERE to_regclass('payments_p' || to_char(d, 'YYYYMMDD')) IS NOT NULL;

-- name: attempts_of_payments
-- The attempts of several payments, each payment's oldest first.
SELECT payment_id, attempt, gateway_key, started_at, finished_at, outcome, error_code,
       gateway_ref, worker
FROM attempts WHERE payment_id = ANY(%(ids)s::uuid[]) ORDER BY payment_id, attempt;
