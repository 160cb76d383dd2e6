-- Customers an admin registers to an actor (docs/customers.md): with
-- CUSTOMER_BINDING=registered only those may be named; with first_use a
-- registered customer is its actor's before anyone names it.
--
-- id: a stable position for the admin listing's keyset pages (filled in for
-- the bindings made so far, in no particular order).
-- registered_by: who registered the binding (an operator's login or an admin
-- key's actor); NULL for a binding made by the first create naming the customer.
ALTER TABLE customers
    ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY,
    ADD COLUMN registered_by text CHECK (length(registered_by) BETWEEN 1 AND 200);
CREATE UNIQUE INDEX customers_id ON customers (id);
CREATE INDEX customers_actor ON customers (actor, id);

COMMENT ON TABLE customers IS
    'Processor customers, each bound to one actor: registered by an admin, or bound by the first create naming it (CUSTOMER_BINDING=first_use).';
COMMENT ON COLUMN customers.registered_by IS
    'Who registered the binding; NULL when the first create naming the customer bound it.';
