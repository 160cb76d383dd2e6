-- The events feed: a payer's payment_events in (txid, id) order.
--
-- Only rows whose transaction id is below the snapshot's xmin are read:
-- every transaction below xmin has committed or aborted, so no event can
-- still appear at a position before one already returned. A transaction
-- left open anywhere on the cluster holds the feed back; it never skips.

-- name: events_after
-- A payer's events after a feed position, oldest first.
SELECT id, txid::text AS txid, payment_id, type, status, attempt, data, created_at
FROM payment_events
WHERE payer = %(payer)s
  AND (txid, id) > (%(after_txid)s::xid8, %(after_id)s)
  AND txid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY txid, id
LIMIT %(limit)s;
