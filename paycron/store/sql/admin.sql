-- name: migrations_table
-- The ledger of applied migration files.
CREATE TABLE IF NOT EXISTS schema_migrations (
    name        text PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: lock_migrations
-- Serialize concurrent migrate runs (session-level lock).
SELECT pg_advisory_lock(%(key)s);

-- name: unlock_migrations
-- Release the migrate lock.
SELECT pg_advisory_unlock(%(key)s);

-- name: applied_migrations
-- Names of the migrations already applied.
SELECT name FROM schema_migrations ORDER BY name;

-- name: migrations_table_exists
-- Whether the ledger of applied migrations exists (a database never migrated has none).
SELECT to_regclass('schema_migrations') IS NOT NULL AS present;

-- name: record_migration
-- Record one applied migration.
INSERT INTO schema_migrations (name) VALUES (%(name)s);

-- name: payment_partitions
-- The day partitions of payments with their bounds, oldest first.
SELECT c.relname AS name,
       pg_get_expr(c.relpartbound, c.oid) AS bound
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
WHERE p.relname = 'payments'
ORDER BY c.relname;

-- name: create_api_key
-- Store a new API key (hash only).
INSERT INTO api_keys (actor, prefix, key_hash, scopes)
VALUES (%(actor)s, %(prefix)s, %(key_hash)s, %(scopes)s)
RETURNING id, actor, prefix, scopes, created_at;

-- name: find_api_key
-- The live key with this hash.
SELECT id, actor, scopes FROM api_keys
WHERE key_hash = %(key_hash)s AND revoked_at IS NULL;

-- name: find_api_key_by_id
-- The live key with this id (a console session names its key by id).
SELECT id, actor, scopes FROM api_keys
WHERE id = %(id)s AND revoked_at IS NULL;

-- name: list_api_keys
-- Every key, newest first (never the hash).
SELECT id, actor, prefix, scopes, created_at, revoked_at FROM api_keys ORDER BY id DESC;

-- name: revoke_api_key
-- Revoke the active key with this prefix when it is the only one: prefixes
-- are 32 random bits, so two keys may share one, and revoking both would cut
-- off an actor nobody meant to (the rows are locked so the count holds).
WITH matching AS (
    SELECT id FROM api_keys WHERE prefix = %(prefix)s AND revoked_at IS NULL FOR UPDATE
)
UPDATE api_keys SET revoked_at = now()
WHERE id IN (SELECT id FROM matching) AND (SELECT count(*) FROM matching) = 1
RETURNING id, actor, prefix;

-- name: revoke_api_key_by_id
-- Revoke one key by its id (what api-key list shows beside the prefix).
UPDATE api_keys SET revoked_at = now()
WHERE id = %(id)s AND revoked_at IS NULL
RETURNING id, actor, prefix;

-- name: active_api_keys_with_prefix
-- The live keys a prefix names, when it names more than one.
SELECT id, actor, prefix FROM api_keys
WHERE prefix = %(prefix)s AND revoked_at IS NULL ORDER BY id;

-- name: create_partition
-- One day partition of payments (identifiers and bounds filled in by psycopg.sql).
CREATE TABLE IF NOT EXISTS {name} PARTITION OF payments FOR VALUES FROM ({start}) TO ({end});

-- name: lock_partition
-- Block writes to one partition while it is checked and detached; give up
-- quickly rather than stall the sweep or the API behind the lock.
LOCK TABLE {name} IN SHARE MODE;

-- name: partition_has_live_rows
-- Anything in the partition not yet settled, or parked and still open?
SELECT EXISTS (SELECT 1 FROM {name} WHERE status IN ('PENDING', 'PROCESSING'))
    OR EXISTS (SELECT 1 FROM dead_letters
               WHERE resolution IS NULL AND due_at >= {start} AND due_at < {end}) AS live;

-- name: detach_partition
-- Detach a settled day from payments (the table stays, for archiving).
ALTER TABLE payments DETACH PARTITION {name};

-- name: forget_detached_idempotency_keys
-- The idempotency rows of every day before the retention cutoff that is no
-- longer attached: detached now, or earlier by a run whose cleanup was cut
-- short. A replay of one of their creates is refused anyway (its dueAt is
-- past the retention); keeping them would grow the table forever and make
-- listings step over payments no longer there. One scan of the table, run
-- after the detaches commit and only when something was detached.
DELETE FROM idempotency_keys
WHERE due_at < %(cutoff)s
  AND NOT ((due_at AT TIME ZONE 'UTC')::date = ANY(%(attached_days)s::date[]));

-- name: set_lock_timeout
-- For this transaction only.
SET LOCAL lock_timeout = '2s';

-- name: live_bound
-- Every payment not yet terminal is due at or after this (migration 012).
SELECT due_from FROM live_bound;

-- name: partition_has_unsettled_rows
-- Any payment in the partition not yet terminal? (Locked first: no write
-- can make one live between this check and the raise of the bound.)
SELECT EXISTS (SELECT 1 FROM {name}
               WHERE status IN ('PENDING', 'PROCESSING', 'AWAITING_GATEWAY')) AS live;

-- name: raise_live_bound
-- Past a settled day, unless a writer lowered the bound meanwhile, and never
-- past the start of the day before yesterday on the database's clock (rows
-- due within the last day do not fire the triggers that lower it).
UPDATE live_bound SET due_from = %(to)s
WHERE due_from = %(from)s
  AND %(to)s <= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - interval '2 days'
RETURNING due_from;
