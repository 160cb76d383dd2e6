-- name: baseline_attempt_and_cas
-- The raw per-payment unit of work: the attempt row and the payment's CAS,
-- committed together (one transaction per payment, no queue, no HTTP).
WITH att AS (
    INSERT INTO attempts (payment_id, attempt, gateway_key, outcome, finished_at, due_at,
                          gateway_ref)
    VALUES (%(id)s, %(attempt)s, %(id)s::text, 'SUCCEEDED', now(), %(due_at)s, 'ch_baseline')
)
UPDATE payments SET status = 'COMPLETED', lease_until = NULL, updated_at = now()
WHERE id = %(id)s AND due_at = %(due_at)s AND status = 'PROCESSING' AND attempt = %(attempt)s;
