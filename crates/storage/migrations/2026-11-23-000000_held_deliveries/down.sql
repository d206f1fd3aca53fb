-- Held deliveries become ordinary overdue first attempts, which the sweeper enqueues.
DROP INDEX deliveries_held;
ALTER TABLE deliveries DROP COLUMN held;
