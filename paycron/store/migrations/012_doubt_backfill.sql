-- Rows already in doubt from before the in-flight bound was kept (008).
--
-- A payment in doubt with no calls_land_by used to count as conclusive at
-- once: a lookup that found nothing let it be re-driven under a new key (or
-- cancelled) while its old call could still land. The code now treats a
-- missing bound as never conclusive; this gives those rows a bound, so they
-- can be settled again:
--   calls_land_by  = the last call's start + 12 hours. The real bound is
--                    lease + call timeout + settle margin (730 s by default),
--                    and the settings refuse any bound of half the key
--                    retention or more (43,200 s with the default 24 h), so
--                    12 hours covers every setting a deployment could run.
--   in_doubt_since = the first call's start (the key-retention rule looks
--                    such a payment up before it is called again).
-- processor: before 008 the project's own card processor ("fake") was the
-- only one, so a payment with calls and no processor was called there; a
-- payment never called keeps none. Its attempt rows say the same.
-- A row with no attempt row to date it is dated by its last update.
UPDATE payments p
SET calls_land_by = coalesce(
        p.calls_land_by,
        coalesce((SELECT max(a.started_at) FROM attempts a WHERE a.payment_id = p.id),
                 p.updated_at) + interval '12 hours'),
    in_doubt_since = coalesce(
        p.in_doubt_since,
        (SELECT min(a.started_at) FROM attempts a WHERE a.payment_id = p.id),
        p.updated_at)
WHERE p.in_doubt AND (p.calls_land_by IS NULL OR p.in_doubt_since IS NULL);

UPDATE payments p
SET processor = 'fake'
WHERE p.processor IS NULL
  AND EXISTS (SELECT 1 FROM attempts a WHERE a.payment_id = p.id AND a.due_at = p.due_at);

UPDATE attempts a
SET processor = p.processor
FROM payments p
WHERE a.processor IS NULL AND a.payment_id = p.id AND a.due_at = p.due_at
  AND p.processor IS NOT NULL;
