-- Fair claiming (docs/design.md): one payer's backlog never starves another's.
-- The sweep walks the payers that have due work (a loose index scan: one
-- probe per payer, however deep each backlog is) and takes each payer's
-- oldest rows in turn. Partial, like the sweep index: only PENDING rows.
CREATE INDEX payments_fair_idx ON payments (payer, run_at) WHERE status = 'PENDING';
