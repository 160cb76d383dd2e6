-- Event types are the webhook contract: clients switch on them. The list is
-- paycron.enums.EventType (documented in the README); this CHECK mirrors it
-- (tests/test_events.py compares the two), so a statement that builds a type
-- no client has been told about fails at once instead of reaching them.
ALTER TABLE payment_events ADD CONSTRAINT payment_events_type_check CHECK (type IN (
    'payment.created', 'payment.processing', 'payment.pending', 'payment.completed',
    'payment.failed', 'payment.cancelled', 'payment.released', 'payment.refunded',
    'attempt.finished'));
