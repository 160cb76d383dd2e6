-- The History page's reads (web/console/history.py). Like console.sql:
-- each bounded and riding an index. The charts read the per-minute rollup
-- (history_minutes), never attempts.

-- name: history_range
-- The rollup's minutes in [%(since)s, %(until)s) summed into buckets of
-- %(step_seconds)s, with the number of minutes rolled up in each (fewer
-- than the bucket holds: the roller has not reached them). At most 10,080
-- rows of the primary key (7 days).
SELECT date_bin(make_interval(secs => %(step_seconds)s), minute, %(since)s) AS bucket,
       count(*) AS minutes,
       sum(attempts) AS attempts, sum(first_attempts) AS first_attempts,
       sum(finished) AS finished, sum(completed) AS completed,
       sum(processor_errors) AS processor_errors,
       sum(lateness_sum_seconds) AS lateness_sum_seconds,
       sum(dead_letters) AS dead_letters
FROM history_minutes
WHERE minute >= %(since)s AND minute < %(until)s
GROUP BY 1;

-- name: history_lateness_range
-- The same buckets' lateness histograms, summed bucket by bucket: (bucket,
-- edge index, first attempts).
SELECT date_bin(make_interval(secs => %(step_seconds)s), h.minute, %(since)s) AS bucket,
       b.i - 1 AS edge, sum(b.n) AS n
FROM history_minutes h, unnest(h.lateness_buckets) WITH ORDINALITY AS b(n, i)
WHERE h.minute >= %(since)s AND h.minute < %(until)s
GROUP BY 1, 2;
