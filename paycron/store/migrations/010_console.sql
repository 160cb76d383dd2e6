-- The operator console (docs/operations.md): the indexes its lists need, nothing else.
--
-- Payments that wait on someone: AWAITING_GATEWAY (the processor will tell;
-- the status arrives with its own migration, and until then this index is
-- empty) and FAILED in doubt (parked while a call may have charged). The
-- console lists both across every attached day, oldest due first; partial,
-- so it holds only those rows and costs the write path nothing else.
CREATE INDEX payments_attention_idx ON payments (due_at, id)
    WHERE status = 'AWAITING_GATEWAY' OR (status = 'FAILED' AND in_doubt);

-- The open dead letters, oldest first, keyset-paged on (created_at, id):
-- dead_letters_open_idx is keyed by payment, so without this the list
-- sorts every open letter to show the first page.
CREATE INDEX dead_letters_open_age_idx ON dead_letters (created_at, id)
    WHERE resolution IS NULL;
