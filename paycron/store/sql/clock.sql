-- name: database_now
-- The database's clock: every time a payment's row holds (calls_land_by,
-- in_doubt_since) was written by it, so it is compared on it, never on an
-- app host's clock (a skew would erase the settle margin).
SELECT clock_timestamp() AS now;
