-- name: open_dead_letters
-- Parked payments waiting for a human, oldest first.
SELECT d.payment_id, d.reason, d.last_error, d.created_at, d.payer, d.due_at
FROM dead_letters d WHERE d.resolution IS NULL
ORDER BY d.created_at, d.id
LIMIT %(limit)s;

-- name: dead_letters_of
-- Every dead letter of one payment, newest first.
SELECT * FROM dead_letters WHERE payment_id = %(id)s ORDER BY id DESC;

-- name: resolve_dead_letter
-- Close the open dead letter of a payment (dismiss or refund).
UPDATE dead_letters
SET resolution = %(resolution)s, resolved_by = %(actor)s, resolved_at = now(),
    note = %(note)s
WHERE payment_id = %(id)s AND resolution IS NULL
RETURNING id;

-- name: record_refund
-- The refund's audit row, refunded_at on the payment and its event, at once.
WITH refund AS (
    INSERT INTO refunds (payment_id, gateway_key, charge_id, gateway_refund_id, amount_minor,
                         requested_by)
    VALUES (%(id)s, %(gateway_key)s, %(charge_id)s, %(gateway_refund_id)s, %(amount_minor)s,
            %(actor)s)
    ON CONFLICT (payment_id) DO NOTHING
    RETURNING payment_id
), marked AS (
    UPDATE payments SET refunded_at = now(), updated_at = now()
    WHERE id = %(id)s AND due_at >= %(due_from)s AND due_at < %(due_to)s
      AND id IN (SELECT payment_id FROM refund)
    RETURNING id, payer, status, attempt
), events AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt, data)
    SELECT id, payer, 'payment.refunded', status, attempt,
           jsonb_build_object('chargeId', %(charge_id)s::text, 'refundId', %(gateway_refund_id)s::text,
                              'amount', %(amount_minor)s::bigint, 'by', %(actor)s::text)
    FROM marked
)
SELECT payment_id FROM refund;
