-- name: create_batch
-- A batch create's one write: the idempotency rows, the payments and their
-- created events of many items, from arrays (one element per item), in one
-- statement and so one transaction. The items come sorted by key, and the
-- rows are inserted in that order: two batches sharing keys wait for each
-- other in one order, never in a cycle. A key already used (or used by a
-- concurrent create, which this waits for) inserts nothing: only the
-- payments actually created come back, with their key. Payments naming a
-- customer come here only once the customer is bound to this actor.
WITH item AS (
    SELECT *
    FROM unnest(%(keys)s::text[], %(request_hashes)s::bytea[], %(ids)s::uuid[],
                %(due_ats)s::timestamptz[], %(payees)s::text[], %(amounts)s::bigint[],
                %(currencies)s::text[], %(run_ats)s::timestamptz[],
                %(payment_methods)s::text[], %(customers)s::text[])
         WITH ORDINALITY AS i(key, request_hash, id, due_at, payee, amount_minor, currency,
                              run_at, payment_method, customer, ord)
), idem AS (
    INSERT INTO idempotency_keys (actor, key, request_hash, payment_id, due_at)
    SELECT %(actor)s, key, request_hash, id, due_at FROM item ORDER BY ord
    ON CONFLICT (actor, key) DO NOTHING
    RETURNING key, payment_id
), pay AS (
    INSERT INTO payments (id, due_at, payer, payee, amount_minor, currency, run_at,
                          payment_method, customer)
    SELECT i.id, i.due_at, %(actor)s, i.payee, i.amount_minor, i.currency, i.run_at,
           i.payment_method, i.customer
    FROM item i JOIN idem ON idem.payment_id = i.id
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
SELECT idem.key, pay.* FROM pay JOIN idem ON idem.payment_id = pay.id;

-- name: find_idempotency_keys
-- The earlier creates under these (actor, key)s, if any.
SELECT key, request_hash, payment_id, due_at FROM idempotency_keys
WHERE actor = %(actor)s AND key = ANY(%(keys)s::text[]);

-- name: touch_idempotency_keys
-- The replays' write, as touch_idempotency_key for many keys: the batch's
-- commit then waits for the synchronous standby.
UPDATE idempotency_keys SET request_hash = request_hash
WHERE actor = %(actor)s AND key = ANY(%(keys)s::text[]);

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
