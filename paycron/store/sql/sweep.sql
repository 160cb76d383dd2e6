-- name: lock_claim_room
-- Serialises the queue bound across sweepers: held from counting the queue
-- to committing the claims, so two sweeps never both see the same room and
-- fill it twice. Transaction-scoped (released by the claim's commit);
-- per database, so test databases on one server never wait on each other.
SELECT pg_advisory_xact_lock(hashtext('paycron.sweep.claim_room'));
