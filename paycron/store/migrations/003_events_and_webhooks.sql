-- The events feed and webhook delivery.
--
-- Event ids are assigned at insert, but transactions commit out of order:
-- a reader that pages by id alone can pass an id whose transaction has not
-- committed yet and skip that event forever. So each event also records its
-- writer's transaction id, and readers page by (txid, id), returning only
-- rows with txid below their snapshot's xmin: every transaction below xmin
-- has finished, so no event can appear behind a position once read.

ALTER TABLE payment_events ADD COLUMN txid xid8 NOT NULL DEFAULT pg_current_xact_id();
COMMENT ON COLUMN payment_events.txid IS
    'The writing transaction: feeds page by (txid, id) below their snapshot''s xmin, never skipping a late commit.';
-- The feed and the relay read one payer's events in (txid, id) order.
CREATE INDEX payment_events_feed_idx ON payment_events (payer, txid, id);

-- A payer's webhook endpoints. Each is an ordered stream of the payer's
-- events with its own cursor: (cursor_txid, cursor_event_id) is the last
-- event delivered (or the start position), in feed order.
CREATE TABLE webhook_endpoints (
    id               uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    actor            text        NOT NULL,
    url              text        NOT NULL CHECK (url ~* '^https?://' AND length(url) <= 2048),
    secret           text        NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    deleted_at       timestamptz,
    -- Events committed before the endpoint existed are visible in this
    -- snapshot and never delivered; everything committed later is.
    created_snapshot pg_snapshot NOT NULL DEFAULT pg_current_snapshot(),
    -- Starts at the creation snapshot's xmin: every event below it is visible
    -- in that snapshot, so the stream need not scan the payer's history.
    cursor_txid      xid8        NOT NULL DEFAULT pg_snapshot_xmin(pg_current_snapshot()),
    cursor_event_id  bigint      NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    lease_until      timestamptz,
    lease_owner      uuid,
    CHECK ((lease_until IS NULL) = (lease_owner IS NULL))
);
COMMENT ON TABLE webhook_endpoints IS 'Where a payer''s events are POSTed, signed; one ordered stream each.';
COMMENT ON COLUMN webhook_endpoints.secret IS 'HMAC-SHA256 signing key, shown once at create. Stored as is: it must sign.';
COMMENT ON COLUMN webhook_endpoints.deleted_at IS 'Soft delete: the deliveries keep their endpoint; nothing is sent after it.';
COMMENT ON COLUMN webhook_endpoints.next_attempt_at IS 'Backoff after a failed delivery; now() when healthy (claim order is round robin).';
COMMENT ON COLUMN webhook_endpoints.lease_owner IS 'The relay claim holding the stream; fences cursor moves (a relay whose lease ran out moves nothing).';
-- The relay's claim reads live endpoints by next attempt time.
CREATE INDEX webhook_endpoints_due_idx ON webhook_endpoints (next_attempt_at) WHERE deleted_at IS NULL;
CREATE INDEX webhook_endpoints_actor_idx ON webhook_endpoints (actor, created_at) WHERE deleted_at IS NULL;

-- One row per (endpoint, event) tried: attempts so far, the last answer and
-- when it was delivered (NULL while it is still being retried). No foreign
-- key to payment_events: the outbox stays free to be pruned on its own.
CREATE TABLE webhook_deliveries (
    endpoint_id      uuid        NOT NULL REFERENCES webhook_endpoints (id),
    event_id         bigint      NOT NULL,
    attempts         integer     NOT NULL CHECK (attempts >= 1),
    last_status      integer,
    last_error       text,
    first_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_attempt_at  timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    PRIMARY KEY (endpoint_id, event_id)
);
COMMENT ON TABLE webhook_deliveries IS 'Audit: each event''s delivery to each endpoint (at least once).';
COMMENT ON COLUMN webhook_deliveries.last_status IS 'HTTP status of the last attempt; NULL when no answer came (timeout, refused).';
