-- A bulk cancel of PENDING payments over the console's payments filter
-- (docs/console.md): one more action a bulk request may be. Its payments are
-- read from the existing partial indexes (payments_fair_idx by payer,
-- payments_sweep_idx otherwise), so nothing else changes.
ALTER TABLE console_bulk_requests DROP CONSTRAINT console_bulk_requests_action_check;
ALTER TABLE console_bulk_requests ADD CONSTRAINT console_bulk_requests_action_check
    CHECK (action IN ('redrive', 'refund', 'dismiss', 'cancel'));
