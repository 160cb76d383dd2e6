-- name: register_customer
-- Binds a processor customer to an actor, as an admin's registration; a
-- binding to the same actor is marked registered. Returns the binding as it
-- is now (another actor's binding stays: zero rows changed, read it after).
INSERT INTO customers (processor, customer, actor, registered_by)
VALUES (%(processor)s, %(customer)s, %(actor)s, %(by)s)
ON CONFLICT (processor, customer) DO UPDATE
    SET registered_by = COALESCE(customers.registered_by, EXCLUDED.registered_by)
    WHERE customers.actor = EXCLUDED.actor
RETURNING id, customer, actor, registered_by, created_at, (xmax = 0) AS inserted;

-- name: customer_binding
-- One processor customer's binding, if any.
SELECT id, customer, actor, registered_by, created_at FROM customers
WHERE processor = %(processor)s AND customer = %(customer)s;

-- name: remove_customer
-- Ends a processor customer's binding; returns it, if there was one.
DELETE FROM customers WHERE processor = %(processor)s AND customer = %(customer)s
RETURNING id, customer, actor, registered_by, created_at;

-- name: list_customers
-- A page of bindings at a processor, in id order after a keyset position,
-- all actors' or one actor's.
SELECT id, customer, actor, registered_by, created_at FROM customers
WHERE processor = %(processor)s AND id > %(after)s
  AND (%(actor)s::text IS NULL OR actor = %(actor)s)
ORDER BY id
LIMIT %(limit)s;
