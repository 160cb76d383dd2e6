-- The per-minute history the console charts (history_minutes, migration
-- 016; docs/console.md). Minutes are UTC minutes, binned with date_bin so
-- the session's TimeZone never moves a boundary. A minute's row is always
-- recomputed whole from attempts and dead_letters and written with an
-- upsert that replaces it: rolling a minute up twice counts it once.

-- name: history_try_lock
-- One roller at a time across every scheduler (class 8 of the two-key
-- advisory locks; webhooks use 7): held to the end of the transaction; a
-- roller that does not get it skips this batch (another is doing it).
SELECT pg_try_advisory_xact_lock(8, 0) AS held;

-- name: history_clock
-- The database's clock, the time every history boundary is measured by.
SELECT now() AS now;

-- name: history_first_pending
-- The oldest minute in [%(since)s, %(until)s) that needs rolling: one with
-- no row yet, or one last rolled before it had settled (rolled_at earlier
-- than its end plus %(settle_seconds)s, when a late outcome may still have
-- been unwritten). A scan of at most the retention's minutes (11,520 for
-- 8 days) against the primary key.
SELECT m.minute
FROM generate_series(%(since)s::timestamptz, %(until)s::timestamptz - interval '1 minute',
                     interval '1 minute') AS m(minute)
LEFT JOIN history_minutes h ON h.minute = m.minute
WHERE h.minute IS NULL
   OR h.rolled_at < m.minute + interval '1 minute' + make_interval(secs => %(settle_seconds)s)
ORDER BY m.minute
LIMIT 1;

-- name: history_attempts_by_minute
-- Attempts started in [%(since)s, %(until)s) (attempts_started_idx), per
-- minute and lateness bucket (width_bucket over %(edges)s seconds; NULL
-- for attempts after the first, which have no lateness).
SELECT date_bin('1 minute', started_at, timestamptz '2000-01-01 00:00:00+00') AS minute,
       CASE WHEN attempt = 1 THEN
           width_bucket(extract(epoch FROM started_at - due_at)::float8, %(edges)s::float8[])
       END AS bucket,
       count(*) AS attempts,
       count(*) FILTER (WHERE outcome <> 'IN_FLIGHT') AS finished,
       count(*) FILTER (WHERE outcome IN ('SUCCEEDED', 'FOUND_BY_LOOKUP', 'RECONCILED'))
           AS completed,
       count(*) FILTER (WHERE outcome IN ('RETRYABLE_ERROR', 'AMBIGUOUS', 'RATE_LIMITED',
                                          'KEY_IN_USE', 'REJECTED', 'AUTH_FAILED'))
           AS processor_errors,
       coalesce(sum(extract(epoch FROM started_at - due_at)::float8)
                    FILTER (WHERE attempt = 1), 0) AS lateness_sum_seconds
FROM attempts
WHERE started_at >= %(since)s AND started_at < %(until)s
GROUP BY 1, 2;

-- name: history_dead_letters_by_minute
-- Dead letters created in [%(since)s, %(until)s), per minute
-- (dead_letters_created_idx).
SELECT date_bin('1 minute', created_at, timestamptz '2000-01-01 00:00:00+00') AS minute,
       count(*) AS n
FROM dead_letters
WHERE created_at >= %(since)s AND created_at < %(until)s
GROUP BY 1;

-- name: history_upsert
-- The recomputed rows, one per minute, replacing whatever was there.
INSERT INTO history_minutes AS h
    (minute, attempts, first_attempts, finished, completed, processor_errors,
     lateness_buckets, lateness_sum_seconds, dead_letters, rolled_at)
SELECT r.minute, r.attempts, r.first_attempts, r.finished, r.completed, r.processor_errors,
       ARRAY(SELECT e.n::integer
             FROM jsonb_array_elements_text(r.buckets) WITH ORDINALITY AS e(n, i)
             ORDER BY e.i),
       r.lateness_sum_seconds, r.dead_letters, now()
FROM jsonb_to_recordset(%(rows)s::jsonb) AS r(
    minute timestamptz, attempts integer, first_attempts integer, finished integer,
    completed integer, processor_errors integer, buckets jsonb,
    lateness_sum_seconds float8, dead_letters integer)
ON CONFLICT (minute) DO UPDATE
SET attempts = excluded.attempts, first_attempts = excluded.first_attempts,
    finished = excluded.finished, completed = excluded.completed,
    processor_errors = excluded.processor_errors,
    lateness_buckets = excluded.lateness_buckets,
    lateness_sum_seconds = excluded.lateness_sum_seconds,
    dead_letters = excluded.dead_letters, rolled_at = excluded.rolled_at;

-- name: history_prune
-- Rows older than the retention, deleted by the roller (the primary key's
-- oldest end).
DELETE FROM history_minutes WHERE minute < %(before)s;
