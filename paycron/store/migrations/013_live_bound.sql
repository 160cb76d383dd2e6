-- A maintained lower bound of live due_at: every payment that is not terminal
-- (PENDING, PROCESSING, AWAITING_GATEWAY) has due_at >= live_bound.due_from.
-- The claim passes it as a parameter, so Postgres prunes every settled past
-- day partition at plan time: a claim's planning no longer grows with the
-- days kept attached for the retention (bench/sweep_history.py).
--
-- The partition keeper raises it, a day at a time, over days whose partition
-- holds no live row (checked under a SHARE lock on that partition, so no
-- write slips between the check and the raise), and never past the start of
-- the day before yesterday on the database's clock. Anything that makes a row
-- live below it lowers it in the same transaction: the triggers below, on an
-- insert due more than a day ago and on a terminal row made live again (a
-- re-drive, a lookup that finds the processor still at work). Rows due within
-- the last day never need them: the bound is at least two days behind now.
CREATE TABLE live_bound (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    due_from timestamptz NOT NULL
);
-- The lowest a timestamp the drivers read can be: prunes nothing until raised.
INSERT INTO live_bound (due_from) VALUES ('0001-01-01 00:00:00+00');

CREATE FUNCTION payments_lower_live_bound() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE live_bound
    SET due_from = date_trunc('day', NEW.due_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
    WHERE due_from > NEW.due_at;
    RETURN NULL;
END
$$;

CREATE TRIGGER payments_live_insert
    AFTER INSERT ON payments FOR EACH ROW
    WHEN (NEW.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
          AND NEW.due_at < statement_timestamp() - interval '1 day')
    EXECUTE FUNCTION payments_lower_live_bound();

CREATE TRIGGER payments_live_again
    AFTER UPDATE OF status ON payments FOR EACH ROW
    WHEN (OLD.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
          AND NEW.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED'))
    EXECUTE FUNCTION payments_lower_live_bound();
