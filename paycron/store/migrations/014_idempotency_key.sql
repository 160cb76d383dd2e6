-- The idempotency key a payment's calls carry at the processor, written in
-- one place for every statement: the payment id for key generation 1, then
-- <id>:<n> (the same as paycron.domain.keys.gateway_key, which a test holds
-- it to over many values). IMMUTABLE and a single expression, so the planner
-- inlines it where it is called.
CREATE FUNCTION paycron_idempotency_key(payment_id uuid, generation integer)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN generation <= 1 THEN payment_id::text
            ELSE payment_id::text || ':' || generation END;

COMMENT ON FUNCTION paycron_idempotency_key(uuid, integer) IS
    'The idempotency key of a payment''s key generation: <id> for 1, <id>:<n> after.';
