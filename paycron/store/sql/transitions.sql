-- Every status transition of a payment, each a single conditional UPDATE
-- (compare-and-swap) that writes its event in the same statement. Zero rows
-- back means the row was not in the expected state: the caller lost a race.
--
-- Every statement names the due_at values or bounds it needs as parameters,
-- so the planner prunes partitions at plan time (sessions run with
-- plan_cache_mode = force_custom_plan, see paycron/store/db.py).

-- name: cancel
-- transition: PENDING -> CANCELLED
-- PENDING -> CANCELLED, only while no earlier call may have charged.
WITH cancelled AS (
    UPDATE payments SET status = 'CANCELLED', updated_at = now()
    WHERE id = %(id)s AND due_at >= %(due_from)s AND due_at < %(due_to)s
      AND payer = %(actor)s AND status = 'PENDING' AND NOT in_doubt
    RETURNING id, payer, status, attempt
), ev AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt)
    SELECT id, payer, 'payment.cancelled', status, attempt FROM cancelled
)
SELECT id FROM cancelled;

-- name: lock_due_fairly
-- The claim, step 1 (one transaction with claim_locked): lock up to
-- %(limit)s due PENDING rows, shared across payers round-robin and oldest
-- first within each payer (docs/design.md): each payer with due work gets an equal
-- share of the batch, and the rows come back as every payer's oldest, then
-- every payer's second, ... A FIFO over run_at let one payer's backlog of
-- 1,500 hold another payer's 15 back by 15 s at 100/s. A payer with less
-- than its share leaves the rest to the next batch (the sweep goes on while
-- batches claim anything).
-- The payers with due work are found by a loose index scan over
-- payments_fair_idx (one probe per payer, however deep its backlog); each
-- payer's oldest rows by the same index, locked as they are read. SKIP
-- LOCKED: concurrent sweepers take disjoint rows without waiting.
-- due_at <= %(now)s is implied by run_at <= now() but, being a parameter,
-- lets Postgres prune every future partition at PLAN time: with now() it
-- prunes only at run time, after locking and planning all ~375 partitions
-- (1,878 locks per claim instead of 13, measured on PostgreSQL 15).
-- due_at >= %(live_from)s (the live bound, migration 012: no payment below it
-- is PENDING) prunes the settled past days the same way, so planning does not
-- grow with the days kept attached for the retention (bench/sweep_history.py).
-- A payment first called at another processor than %(processor)s is never
-- claimed (docs/design.md: one processor per payment): it waits for an operator.
WITH RECURSIVE payers(payer) AS (
    (SELECT payer FROM payments
     WHERE status = 'PENDING' AND run_at <= now() AND due_at <= %(now)s
       AND due_at >= %(live_from)s
     ORDER BY payer LIMIT 1)
    UNION ALL
    SELECT (SELECT p.payer FROM payments p
            WHERE p.status = 'PENDING' AND p.run_at <= now() AND p.due_at <= %(now)s
              AND p.due_at >= %(live_from)s AND p.payer > payers.payer
            ORDER BY p.payer LIMIT 1)
    FROM payers WHERE payers.payer IS NOT NULL
), share AS (
    SELECT ceil(%(limit)s::numeric / greatest(count(*), 1))::int AS rows_each
    FROM payers WHERE payer IS NOT NULL
), turns AS (
    SELECT c.id, c.due_at, c.run_at,
           row_number() OVER (PARTITION BY payers.payer ORDER BY c.run_at, c.id) AS turn
    FROM payers CROSS JOIN share
    CROSS JOIN LATERAL (
        SELECT id, due_at, run_at FROM payments
        WHERE payer = payers.payer AND status = 'PENDING' AND run_at <= now()
          AND due_at <= %(now)s AND due_at >= %(live_from)s
          AND (processor IS NULL OR processor = %(processor)s)
        ORDER BY run_at LIMIT share.rows_each
        FOR UPDATE SKIP LOCKED
    ) c
    WHERE payers.payer IS NOT NULL
)
SELECT id, due_at FROM turns ORDER BY turn, run_at, id LIMIT %(limit)s;

-- name: next_due_wait
-- Seconds until the sweep next has work, on the database's clock: the
-- earliest run_at still ahead among PENDING rows due by %(until)s (null:
-- none before then). Only rows still ahead: one due but left unclaimed (a
-- payment of another processor) never makes the sweep spin. The sweep index
-- gives each pruned partition's first run_at.
SELECT extract(epoch FROM min(run_at) - clock_timestamp())::float8 AS seconds
FROM payments
WHERE status = 'PENDING' AND run_at > clock_timestamp() AND run_at <= %(until)s
  AND due_at <= %(until)s AND due_at >= %(live_from)s;

-- name: count_queued
-- Claims waiting for their call (PROCESSING, no attempt row yet): the sweep
-- keeps only about two seconds of the ceiling queued beyond what is in
-- flight, so a later payer's claim is never behind a long FIFO (docs/design.md).
-- The reaper's partial index finds PROCESSING rows; future partitions are
-- pruned at plan time as in lock_due_fairly.
SELECT count(*) AS n FROM payments p
WHERE p.status = 'PROCESSING' AND p.due_at <= %(now)s AND p.due_at >= %(live_from)s
  AND NOT EXISTS (SELECT 1 FROM attempts a
                  WHERE a.payment_id = p.id AND a.attempt = p.attempt);

-- name: claim_locked
-- transition: PENDING -> PROCESSING
-- The claim, step 2: PENDING -> PROCESSING for the rows step 1 locked,
-- stamping a lease and attempt + 1, with their events. A separate statement
-- naming the rows (not an UPDATE joined to the locking subquery) because,
-- beside millions of terminal rows, the planner turned that join into a hash
-- join reading every due row through the sweep index for a 10-row claim
-- (bench/sweep_history.py); and due_at = ANY(...) plans only the claimed
-- rows' partitions. Its arrays are sent binary, as start_attempts'.
WITH locked AS (
    SELECT * FROM unnest(%(ids)b::uuid[], %(due_ats)b::timestamptz[]) WITH ORDINALITY
        AS l(id, due_at, turn)
), claimed AS (
    UPDATE payments p
    SET status = 'PROCESSING',
        lease_until = now() + make_interval(secs => %(lease_seconds)s),
        attempt = p.attempt + 1,
        updated_at = now()
    FROM locked l
    WHERE p.id = l.id AND p.due_at = l.due_at AND p.status = 'PENDING'
      AND p.due_at = ANY(%(due_ats)b::timestamptz[])
    RETURNING p.id, p.due_at, p.payer, p.attempt, l.turn
), ev AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt)
    SELECT id, payer, 'payment.processing', 'PROCESSING', attempt FROM claimed
)
SELECT id, due_at, attempt FROM claimed ORDER BY turn;

-- name: start_attempts
-- Fence + lease renewal + the IN_FLIGHT attempt row (the recovery point),
-- for every claim of a message at once. A claim whose fence fails is stale
-- and dropped; a claim whose attempt row already exists is a duplicated
-- message and is dropped too: the attempt row is the exclusive token.
-- The payment is stamped with the processor about to be called (only ever
-- that one after: a payment first called elsewhere is fenced out).
-- Its arrays, as finish_attempts', are sent binary (%(name)b): psycopg
-- dumps a group's arrays in about a third of the text format's time.
WITH claim AS (
    SELECT * FROM unnest(%(ids)b::uuid[], %(due_ats)b::timestamptz[], %(attempts)b::int[])
        AS c(id, due_at, attempt)
), fenced AS (
    UPDATE payments p
    SET lease_until = now() + make_interval(secs => %(lease_seconds)s),
        processor = %(processor)s,
        updated_at = now()
    FROM claim c
    WHERE p.id = c.id AND p.due_at = c.due_at AND p.status = 'PROCESSING'
      AND p.attempt = c.attempt AND p.due_at = ANY(%(due_ats)b::timestamptz[])
      AND (p.processor IS NULL OR p.processor = %(processor)s)
    RETURNING p.id, p.due_at, p.attempt, p.payer, p.amount_minor, p.currency, p.failures,
              p.in_doubt, p.key_in_use, p.customer, p.payment_method, p.key_generation,
              p.gateway_intent_id, p.calls_land_by, p.in_doubt_since, p.lease_expiries,
              p.processor
), started AS (
    INSERT INTO attempts (payment_id, attempt, gateway_key, key_generation, processor,
                          outcome, worker, due_at)
    SELECT id, attempt,
           paycron_idempotency_key(id, key_generation),
           key_generation, %(processor)s, 'IN_FLIGHT', %(worker)s, due_at
    FROM fenced
    ON CONFLICT (payment_id, attempt) DO NOTHING
    RETURNING payment_id, started_at
)
SELECT f.*, s.started_at FROM fenced f JOIN started s ON s.payment_id = f.id;

-- name: finish_attempts
-- transition: PROCESSING -> PENDING, AWAITING_GATEWAY, COMPLETED, FAILED
-- Each call's outcome on its own attempt row (also after the reaper marked
-- it LEASE_EXPIRED: the real outcome wins), then the payment's CAS fenced on
-- the attempt (a zombie changes no status), an event per outcome, and a
-- dead letter for each payment parked.
WITH outcome AS (
    SELECT * FROM unnest(
        %(ids)b::uuid[], %(due_ats)b::timestamptz[], %(attempts)b::int[], %(payers)b::text[],
        %(outcomes)b::text[], %(error_codes)b::text[], %(gateway_refs)b::text[],
        %(statuses)b::text[], %(delays)b::float8[], %(failures)b::int[], %(in_doubts)b::bool[],
        %(failure_reasons)b::text[], %(key_in_uses)b::int[], %(next_keys)b::bool[],
        %(confirms)b::text[], %(may_lands)b::bool[]
    ) AS o(id, due_at, attempt, payer, outcome, error_code, gateway_ref, status, delay,
           failures, in_doubt, failure_reason, key_in_use, next_key, confirm, may_land)
), finished AS (
    UPDATE attempts a
    SET outcome = o.outcome, error_code = o.error_code, gateway_ref = o.gateway_ref,
        finished_at = now()
    FROM outcome o
    WHERE a.payment_id = o.id AND a.attempt = o.attempt
      AND a.outcome IN ('IN_FLIGHT', 'LEASE_EXPIRED')
    RETURNING a.payment_id, a.started_at
), moved AS (
    -- in_doubt_since: when the oldest unresolved call was made (the key
    -- retention rule), kept while in doubt, cleared with the doubt.
    -- calls_land_by, the in-flight bound (docs/design.md): a call that may still
    -- land (sent, no definitive answer, not a replay) can land until its
    -- lease end + call timeout + the processor's settle margin.
    UPDATE payments p
    SET status = o.status,
        run_at = CASE WHEN o.status = 'PENDING'
                      THEN greatest(p.due_at, now() + make_interval(secs => o.delay))
                      ELSE p.run_at END,
        failures = o.failures, in_doubt = o.in_doubt, failure_reason = o.failure_reason,
        in_doubt_since = CASE WHEN o.in_doubt
                              THEN coalesce(p.in_doubt_since, f.started_at, now()) END,
        key_in_use = o.key_in_use, last_error = coalesce(o.error_code, p.last_error),
        key_generation = p.key_generation + CASE WHEN o.next_key THEN 1 ELSE 0 END,
        calls_land_by = CASE WHEN o.may_land THEN greatest(p.calls_land_by,
            coalesce(f.started_at, now()) + make_interval(secs => %(land_seconds)s))
            ELSE p.calls_land_by END,
        gateway_intent_id = CASE WHEN o.status = 'AWAITING_GATEWAY' THEN o.gateway_ref
                                 ELSE coalesce(o.confirm, p.gateway_intent_id) END,
        -- waiting for the processor: fenced on its payment, polled if no event comes
        awaiting_since = CASE WHEN o.status = 'AWAITING_GATEWAY' THEN now() END,
        next_poll_at = CASE WHEN o.status = 'AWAITING_GATEWAY'
                            THEN now() + make_interval(secs => %(poll_seconds)s) END,
        polls = 0,
        lease_until = NULL,
        updated_at = now()
    FROM outcome o LEFT JOIN finished f ON f.payment_id = o.id
    WHERE p.id = o.id AND p.due_at = o.due_at AND p.status = 'PROCESSING'
      AND p.attempt = o.attempt AND p.due_at = ANY(%(due_ats)b::timestamptz[])
    RETURNING p.id, p.status, p.run_at, p.in_doubt
), events AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt, data)
    SELECT o.id, o.payer,
           CASE WHEN m.id IS NULL THEN 'attempt.finished'
                ELSE 'payment.' || lower(m.status) END,
           coalesce(m.status, 'UNCHANGED'), o.attempt,
           jsonb_strip_nulls(jsonb_build_object(
               'outcome', o.outcome, 'errorCode', o.error_code, 'gatewayRef', o.gateway_ref,
               'failureReason', o.failure_reason,
               'nextAttemptAt', CASE WHEN m.status = 'PENDING' THEN m.run_at END,
               -- parked in doubt: the outcome is unknown, a charge may exist
               'outcomeUnknown', CASE WHEN m.status = 'FAILED' AND m.in_doubt THEN true END,
               'stale', m.id IS NULL))
    FROM outcome o
    JOIN finished f ON f.payment_id = o.id
    LEFT JOIN moved m ON m.id = o.id
), parked AS (
    INSERT INTO dead_letters (payment_id, due_at, payer, reason, last_error)
    SELECT o.id, o.due_at, o.payer, o.failure_reason, o.error_code
    FROM outcome o JOIN moved m ON m.id = o.id
    WHERE m.status = 'FAILED'
      AND o.failure_reason IN ('RETRIES_EXHAUSTED', 'LOOKUP_MISMATCH', 'GATEWAY_REJECTED',
                               'LEASE_EXPIRED_REPEATEDLY')
    ON CONFLICT (payment_id) WHERE resolution IS NULL DO NOTHING
)
SELECT o.id, f.payment_id IS NOT NULL AS recorded, m.id IS NOT NULL AS moved, m.status
FROM outcome o
LEFT JOIN finished f ON f.payment_id = o.id
LEFT JOIN moved m ON m.id = o.id;

-- name: complete_late_success
-- transition: FAILED -> COMPLETED
-- A call whose answer came after its payment was parked in doubt (a hung
-- worker's late SUCCEEDED, already on its own attempt row): the payment is
-- FAILED only because nobody knew; the money moved, so it is COMPLETED by
-- CAS (only from FAILED in doubt, only for an attempt row that says
-- SUCCEEDED), with its event, and its open dead letter resolved.
WITH late AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(due_ats)s::timestamptz[], %(attempts)s::int[],
                         %(gateway_refs)s::text[])
        AS l(id, due_at, attempt, gateway_ref)
), completed AS (
    UPDATE payments p
    SET status = 'COMPLETED', failure_reason = NULL, in_doubt = false, in_doubt_since = NULL,
        updated_at = now()
    FROM late l
    WHERE p.id = l.id AND p.due_at = l.due_at AND p.status = 'FAILED' AND p.in_doubt
      AND p.attempt >= l.attempt AND p.due_at = ANY(%(due_ats)s::timestamptz[])
      -- a human refunded its charge: the money went back, never reported COMPLETED
      AND p.refunded_at IS NULL
      -- a mismatch is for a human: the other processor payment may be a second charge
      AND p.failure_reason IS DISTINCT FROM 'LOOKUP_MISMATCH'
      -- only an answer under the key generation still in use: a re-driven
      -- payment's newer call may have charged too, and its doubt stays for a human
      AND EXISTS (SELECT 1 FROM attempts a
                  WHERE a.payment_id = l.id AND a.attempt = l.attempt
                    AND a.outcome = 'SUCCEEDED' AND a.key_generation = p.key_generation)
    RETURNING p.id, p.payer, p.attempt, l.attempt AS late_attempt, l.gateway_ref
), events AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt, data)
    SELECT id, payer, 'payment.completed', 'COMPLETED', attempt,
           jsonb_strip_nulls(jsonb_build_object(
               'outcome', 'SUCCEEDED', 'gatewayRef', gateway_ref, 'lateAttempt', late_attempt))
    FROM completed
), resolved AS (
    UPDATE dead_letters d
    SET resolution = 'COMPLETED', resolved_by = %(actor)s, resolved_at = now(),
        note = 'a late answer of attempt ' || c.late_attempt || ': charged'
    FROM completed c
    WHERE d.payment_id = c.id AND d.resolution IS NULL
)
SELECT id FROM completed;

-- name: lock_claims_to_release
-- A release, step 1 (one transaction with release_claims): lock the claims
-- still held as claimed, so that step 2, a statement of its own, sees every
-- attempt row a worker's start committed before the lock was granted (a
-- single UPDATE re-checking a locked row would judge NOT EXISTS on its old
-- snapshot and release a started claim).
SELECT p.id FROM payments p
JOIN unnest(%(ids)s::uuid[], %(due_ats)s::timestamptz[], %(attempts)s::int[])
    AS c(id, due_at, attempt) ON p.id = c.id AND p.due_at = c.due_at
WHERE p.status = 'PROCESSING' AND p.attempt = c.attempt
  AND p.due_at = ANY(%(due_ats)s::timestamptz[])
ORDER BY p.id
FOR UPDATE OF p;

-- name: release_claims
-- transition: PROCESSING -> PENDING
-- Give held claims back without a call and without using budget (the
-- breaker is open, or the broker refused the message): run_at is kept, so
-- the backlog drains oldest-first later. Fenced on what a worker's start
-- writes: a claim whose attempt row exists was started (its call may
-- charge) and is never handed back; a message delivered after its release
-- finds the claim gone and is dropped by start's fence.
WITH claim AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(due_ats)s::timestamptz[], %(attempts)s::int[])
        AS c(id, due_at, attempt)
), released AS (
    UPDATE payments p
    SET status = 'PENDING', lease_until = NULL, updated_at = now()
    FROM claim c
    WHERE p.id = c.id AND p.due_at = c.due_at AND p.status = 'PROCESSING'
      AND p.attempt = c.attempt AND p.due_at = ANY(%(due_ats)s::timestamptz[])
      AND NOT EXISTS (SELECT 1 FROM attempts a
                      WHERE a.payment_id = c.id AND a.attempt = c.attempt)
    RETURNING p.id, p.payer, p.attempt
), events AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt, data)
    SELECT id, payer, 'payment.released', 'PENDING', attempt,
           jsonb_build_object('reason', %(reason)s::text)
    FROM released
)
SELECT id FROM released;

-- name: lock_expired
-- The reap, step 1 (one transaction with reap_locked): lock up to
-- %(limit)s PROCESSING rows whose lease ran out, with what the policy needs
-- to decide their next state (paycron.domain.policy.after_lease_expiry): their
-- counters, and whether their attempt's call was still IN_FLIGHT (it may
-- have landed). SKIP LOCKED: a row its worker is finishing right now is
-- left to that worker.
SELECT p.id, p.due_at, p.attempt, p.lease_expiries, p.failures, p.in_doubt,
       coalesce(a.outcome = 'IN_FLIGHT', false) AS call_in_flight
FROM payments p
LEFT JOIN attempts a ON a.payment_id = p.id AND a.attempt = p.attempt
WHERE p.status = 'PROCESSING' AND p.lease_until < now() AND p.due_at <= %(now)s
  AND p.due_at >= %(live_from)s
ORDER BY p.lease_until
LIMIT %(limit)s
FOR UPDATE OF p SKIP LOCKED;

-- name: reap_locked
-- transition: PROCESSING -> PENDING, FAILED
-- The reap, step 2: each locked row to the state the policy decided
-- (PENDING, or FAILED LEASE_EXPIRED_REPEATEDLY), guarded again on status +
-- lease + attempt so a row that completed is never overwritten (River
-- #1302). Its attempt row, if still IN_FLIGHT, is marked LEASE_EXPIRED
-- (unless its worker already wrote it: the real outcome wins); an event per
-- row; a dead letter for each row parked.
WITH decided AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(due_ats)s::timestamptz[], %(attempts)s::int[],
                         %(statuses)s::text[], %(failure_reasons)s::text[],
                         %(in_doubts)s::bool[], %(counteds)s::bool[])
        AS d(id, due_at, attempt, status, failure_reason, in_doubt, counted)
), marked AS (
    UPDATE attempts a SET outcome = 'LEASE_EXPIRED', finished_at = now()
    FROM decided d
    WHERE a.payment_id = d.id AND a.attempt = d.attempt AND a.outcome = 'IN_FLIGHT'
    RETURNING a.payment_id, a.started_at
), reaped AS (
    UPDATE payments p
    SET status = d.status,
        failure_reason = d.failure_reason,
        -- only an expiry whose call was in flight counts (policy.counts_expiry)
        lease_expiries = p.lease_expiries + CASE WHEN d.counted THEN 1 ELSE 0 END,
        in_doubt = d.in_doubt,
        in_doubt_since = CASE WHEN d.in_doubt
                              THEN coalesce(p.in_doubt_since, m.started_at, now()) END,
        -- a call still IN_FLIGHT may land up to its in-flight bound
        calls_land_by = CASE WHEN m.started_at IS NULL THEN p.calls_land_by
            ELSE greatest(p.calls_land_by,
                          m.started_at + make_interval(secs => %(land_seconds)s)) END,
        last_error = 'lease_expired',
        lease_until = NULL,
        run_at = greatest(p.run_at, p.due_at),
        updated_at = now()
    FROM decided d LEFT JOIN marked m ON m.payment_id = d.id
    WHERE p.id = d.id AND p.due_at = d.due_at AND p.status = 'PROCESSING'
      AND p.attempt = d.attempt AND p.lease_until < now()
      AND p.due_at = ANY(%(due_ats)s::timestamptz[])
    RETURNING p.id, p.due_at, p.payer, p.status, p.attempt, p.in_doubt
), events AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt, data)
    SELECT id, payer, 'payment.' || lower(status), status, attempt,
           jsonb_strip_nulls(jsonb_build_object(
               'reason', 'lease_expired', 'inDoubt', in_doubt,
               'failureReason', CASE WHEN status = 'FAILED' THEN 'LEASE_EXPIRED_REPEATEDLY' END,
               -- parked in doubt: the outcome is unknown, a charge may exist
               'outcomeUnknown', CASE WHEN status = 'FAILED' AND in_doubt THEN true END))
    FROM reaped
), parked AS (
    INSERT INTO dead_letters (payment_id, due_at, payer, reason, last_error)
    SELECT id, due_at, payer, 'LEASE_EXPIRED_REPEATEDLY', 'lease_expired'
    FROM reaped WHERE status = 'FAILED'
    ON CONFLICT (payment_id) WHERE resolution IS NULL DO NOTHING
)
SELECT id, status, in_doubt FROM reaped;

-- name: complete_from_gateway
-- transition: FAILED, PENDING -> COMPLETED
-- FAILED or PENDING -> COMPLETED because the gateway holds a charge for the
-- payment (a lookup by reference, or the settlement report): attempt + 1 for
-- the audit row that records how we learned it, an event, and the open dead
-- letter resolved. Never over a PROCESSING row: that one is its worker's.
WITH completed AS (
    UPDATE payments
    SET status = 'COMPLETED', attempt = attempt + 1, failure_reason = NULL, in_doubt = false,
        in_doubt_since = NULL, updated_at = now()
    WHERE id = %(id)s AND due_at >= %(due_from)s AND due_at < %(due_to)s
      AND status IN ('FAILED', 'PENDING')
    RETURNING id, due_at, payer, attempt, key_generation, processor
), audit AS (
    INSERT INTO attempts (payment_id, attempt, gateway_key, key_generation, processor, outcome,
                          gateway_ref, worker, finished_at, due_at)
    SELECT id, attempt,
           paycron_idempotency_key(id, key_generation),
           key_generation, processor, %(outcome)s, %(gateway_ref)s, %(actor)s, now(), due_at
    FROM completed
), events AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt, data)
    SELECT id, payer, 'payment.completed', 'COMPLETED', attempt,
           jsonb_build_object('outcome', %(outcome)s::text, 'gatewayRef', %(gateway_ref)s::text,
                              'by', %(actor)s::text)
    FROM completed
), resolved AS (
    UPDATE dead_letters d
    SET resolution = 'COMPLETED', resolved_by = %(actor)s, resolved_at = now()
    FROM completed c
    WHERE d.payment_id = c.id AND d.resolution IS NULL
)
SELECT id, attempt FROM completed;

-- name: redrive
-- transition: FAILED -> PENDING
-- A parked payment back to PENDING with a fresh budget and the next key
-- generation (the processor may replay a stored answer for the old key),
-- after a lookup found nothing conclusively (paycron.engine.dead_letters). Only
-- RETRIES_EXHAUSTED and LEASE_EXPIRED_REPEATEDLY: a decline needs a new
-- payment. Only when the lookup was asked at the payment's own processor
-- (%(processor)s; another processor's "nothing" is no answer).
WITH redriven AS (
    UPDATE payments
    SET status = 'PENDING', failure_reason = NULL, failures = 0, lease_expiries = 0,
        key_in_use = 0, key_generation = key_generation + 1,
        in_doubt = false, in_doubt_since = NULL, run_at = greatest(due_at, now()),
        updated_at = now()
    WHERE id = %(id)s AND due_at >= %(due_from)s AND due_at < %(due_to)s
      AND status = 'FAILED'
      AND failure_reason IN ('RETRIES_EXHAUSTED', 'LEASE_EXPIRED_REPEATEDLY')
      AND (%(processor)s::text IS NULL OR processor IS NULL OR processor = %(processor)s)
    RETURNING id, payer, attempt
), events AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt, data)
    SELECT id, payer, 'payment.pending', 'PENDING', attempt,
           jsonb_build_object('reason', 'redriven', 'by', %(actor)s::text)
    FROM redriven
), resolved AS (
    UPDATE dead_letters d
    SET resolution = 'REDRIVEN', resolved_by = %(actor)s, resolved_at = now()
    FROM redriven r
    WHERE d.payment_id = r.id AND d.resolution IS NULL
)
SELECT id FROM redriven;

-- name: await_from_lookup
-- transition: FAILED, PENDING -> AWAITING_GATEWAY
-- FAILED or PENDING -> AWAITING_GATEWAY because a lookup found the processor
-- still processing a payment for it (a re-drive, docs/design.md): attempt + 1 for
-- the audit row of the lookup, an event, the open dead letter resolved.
WITH waiting AS (
    UPDATE payments
    SET status = 'AWAITING_GATEWAY', attempt = attempt + 1, failure_reason = NULL,
        in_doubt = false, in_doubt_since = NULL, gateway_intent_id = %(intent)s,
        awaiting_since = now(), polls = 0,
        next_poll_at = now() + make_interval(secs => %(poll_seconds)s), updated_at = now()
    WHERE id = %(id)s AND due_at >= %(due_from)s AND due_at < %(due_to)s
      AND status IN ('FAILED', 'PENDING')
    RETURNING id, due_at, payer, attempt, key_generation, processor
), audit AS (
    INSERT INTO attempts (payment_id, attempt, gateway_key, key_generation, processor, outcome,
                          gateway_ref, worker, finished_at, due_at)
    SELECT id, attempt,
           paycron_idempotency_key(id, key_generation),
           key_generation, processor, 'SUBMITTED', %(intent)s, %(actor)s, now(), due_at
    FROM waiting
), events AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt, data)
    SELECT id, payer, 'payment.awaiting_gateway', 'AWAITING_GATEWAY', attempt,
           jsonb_build_object('outcome', 'SUBMITTED', 'gatewayRef', %(intent)s::text,
                              'by', %(actor)s::text)
    FROM waiting
), resolved AS (
    UPDATE dead_letters d
    SET resolution = 'REDRIVEN', resolved_by = %(actor)s, resolved_at = now(),
        note = 'the processor is processing ' || %(intent)s::text
    FROM waiting w
    WHERE d.payment_id = w.id AND d.resolution IS NULL
)
SELECT id, attempt FROM waiting;

-- name: settle_awaiting
-- transition: AWAITING_GATEWAY -> COMPLETED, FAILED
-- AWAITING_GATEWAY -> COMPLETED or FAILED (DECLINED) from the processor's
-- truth (its payment retrieved after a signed event, or by the poller),
-- fenced on the processor-side payment the row waits for: an event about
-- another of its intents never settles it. The audit row records the
-- settlement as an attempt; the event says who learned it.
WITH settled AS (
    UPDATE payments
    SET status = %(status)s,
        failure_reason = CASE WHEN %(status)s = 'FAILED' THEN 'DECLINED' END,
        last_error = coalesce(%(error_code)s, last_error),
        attempt = attempt + 1, next_poll_at = NULL, updated_at = now()
    WHERE id = %(id)s AND due_at >= %(due_from)s AND due_at < %(due_to)s
      AND status = 'AWAITING_GATEWAY' AND gateway_intent_id = %(intent)s
    RETURNING id, due_at, payer, attempt, key_generation, processor, status
), audit AS (
    INSERT INTO attempts (payment_id, attempt, gateway_key, key_generation, processor, outcome,
                          error_code, gateway_ref, worker, finished_at, due_at)
    SELECT id, attempt,
           paycron_idempotency_key(id, key_generation),
           key_generation, processor,
           CASE WHEN status = 'COMPLETED' THEN 'SUCCEEDED' ELSE 'DECLINED' END,
           %(error_code)s, %(intent)s, %(actor)s, now(), due_at
    FROM settled
), events AS (
    INSERT INTO payment_events (payment_id, payer, type, status, attempt, data)
    SELECT id, payer, 'payment.' || lower(status), status, attempt,
           jsonb_strip_nulls(jsonb_build_object(
               'outcome', CASE WHEN status = 'COMPLETED' THEN 'SUCCEEDED' ELSE 'DECLINED' END,
               'errorCode', %(error_code)s::text, 'gatewayRef', %(intent)s::text,
               'failureReason', CASE WHEN status = 'FAILED' THEN 'DECLINED' END,
               'by', %(actor)s::text))
    FROM settled
)
SELECT id, status FROM settled;

-- name: claim_due_polls
-- Waiting payments whose next poll is due, oldest poll first: each is
-- claimed by moving its next poll out by the next backing-off interval
-- (%(intervals)s, by polls so far) and committed before the processor is
-- asked, so no connection waits on a call, two schedulers never poll one
-- payment at once (SKIP LOCKED), and a crash only delays a poll. Every
-- waiting payment is due in the past: %(now)s prunes future partitions.
-- Only payments waiting at %(processor)s, the processor this scheduler can
-- ask: another processor's answer about them would be no answer.
WITH due AS (
    SELECT id, due_at FROM payments
    WHERE status = 'AWAITING_GATEWAY' AND next_poll_at <= now() AND due_at <= %(now)s
      AND processor = %(processor)s
    ORDER BY next_poll_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE payments p
SET polls = p.polls + 1,
    next_poll_at = now() + make_interval(secs => (%(intervals)s::float8[])[
        least(p.polls + 1, cardinality(%(intervals)s::float8[]))])
FROM due
WHERE p.id = due.id AND p.due_at = due.due_at AND p.due_at <= %(now)s
RETURNING p.id, p.due_at, p.gateway_intent_id, p.polls, p.awaiting_since;
