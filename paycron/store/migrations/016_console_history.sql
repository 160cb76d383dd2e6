-- The console's history and webhook tools (docs/console.md).
--
-- history_minutes: one row per UTC minute, rolled up from attempts and
-- dead_letters by the scheduler's history service (scheduler/history.py),
-- so the console's 1 h / 24 h / 7 d charts read at most 10,080 small rows
-- and never scan attempts. A minute's row is recomputed whole from its
-- sources (an upsert that replaces, never adds), so rolling a minute up
-- again cannot double count; it is rolled again until it has settled, and
-- rows older than the retention are deleted by the same service.
CREATE TABLE history_minutes (
    minute                timestamptz PRIMARY KEY CHECK (extract(second FROM minute) = 0),
    attempts              integer     NOT NULL CHECK (attempts >= 0),
    first_attempts        integer     NOT NULL CHECK (first_attempts >= 0),
    finished              integer     NOT NULL CHECK (finished >= 0),
    completed             integer     NOT NULL CHECK (completed >= 0),
    processor_errors      integer     NOT NULL CHECK (processor_errors >= 0),
    lateness_buckets      integer[]   NOT NULL,
    lateness_sum_seconds  float8      NOT NULL,
    dead_letters          integer     NOT NULL CHECK (dead_letters >= 0),
    rolled_at             timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE history_minutes IS 'Per-minute rollup of attempts and dead letters for the console''s history charts; recomputed, never incremented.';
COMMENT ON COLUMN history_minutes.minute IS 'The UTC minute [minute, minute + 1 min) the row counts, by attempts.started_at and dead_letters.created_at.';
COMMENT ON COLUMN history_minutes.attempts IS 'Calls started in the minute (every attempt row).';
COMMENT ON COLUMN history_minutes.first_attempts IS 'First attempts started in the minute: the lateness sample.';
COMMENT ON COLUMN history_minutes.finished IS 'Calls started in the minute whose outcome was known when the row was rolled (not IN_FLIGHT).';
COMMENT ON COLUMN history_minutes.completed IS 'Calls started in the minute that charged (SUCCEEDED, FOUND_BY_LOOKUP, RECONCILED): throughput.';
COMMENT ON COLUMN history_minutes.processor_errors IS 'Finished calls the processor failed (RETRYABLE_ERROR, AMBIGUOUS, RATE_LIMITED, KEY_IN_USE, REJECTED, AUTH_FAILED): the error rate is this over finished.';
COMMENT ON COLUMN history_minutes.lateness_buckets IS 'First attempts by started_at - due_at, counted by the bucket edges of paycron.store.history.LATENESS_EDGES (one more bucket than edges).';
COMMENT ON COLUMN history_minutes.lateness_sum_seconds IS 'Sum of the first attempts'' lateness in seconds: the mean over any range.';
COMMENT ON COLUMN history_minutes.dead_letters IS 'Dead letters created in the minute: DLQ inflow.';
COMMENT ON COLUMN history_minutes.rolled_at IS 'When the row was last recomputed (a row rolled after it settled is final).';

-- DLQ inflow per minute reads dead letters by creation time, resolved or
-- not (dead_letters_open_age_idx holds only the open ones).
CREATE INDEX dead_letters_created_idx ON dead_letters (created_at);

-- How long the last delivery of an event to an endpoint took, as the relay
-- measured it (the console's deliveries list).
ALTER TABLE webhook_deliveries
    ADD COLUMN last_latency_ms integer CHECK (last_latency_ms >= 0);
COMMENT ON COLUMN webhook_deliveries.last_latency_ms IS 'Wall time of the last attempt in milliseconds, the request sent to the answer read (or the timeout).';

-- An operator's request to send one event to one endpoint again, outside
-- the endpoint's ordered stream (its cursor does not move). The console
-- inserts the row; a relay claims it with a lease, POSTs the event as it
-- posts any (signed anew), and records the answer. One try per request: a
-- relay that dies mid-send leaves the lease to run out, and another sends it.
CREATE TABLE webhook_replays (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id   uuid        NOT NULL REFERENCES webhook_endpoints (id),
    event_id      bigint      NOT NULL,
    requested_by  text        NOT NULL,
    requested_at  timestamptz NOT NULL DEFAULT now(),
    lease_until   timestamptz,
    done_at       timestamptz,
    status        integer,
    error         text,
    latency_ms    integer     CHECK (latency_ms >= 0)
);
COMMENT ON TABLE webhook_replays IS 'Operator replays of one delivery, sent by the relay outside the stream; one try each.';
COMMENT ON COLUMN webhook_replays.requested_by IS 'The console operator''s actor (the audit log has the rest).';
COMMENT ON COLUMN webhook_replays.lease_until IS 'A relay is sending it until then; NULL: not yet claimed.';
COMMENT ON COLUMN webhook_replays.done_at IS 'When the answer (or its absence) was recorded; NULL while waiting.';
COMMENT ON COLUMN webhook_replays.status IS 'HTTP status of the replay; NULL when no answer came.';
-- The relay's claim: the waiting replays, oldest first.
CREATE INDEX webhook_replays_waiting_idx ON webhook_replays (requested_at, id) WHERE done_at IS NULL;
-- The console's list of an endpoint's replays, newest first.
CREATE INDEX webhook_replays_endpoint_idx ON webhook_replays (endpoint_id, id);
