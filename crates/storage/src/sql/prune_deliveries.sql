-- Deletes up to $2 finished deliveries last changed before $1 (their attempts go with them,
-- ON DELETE CASCADE), skipping rows another transaction holds.
DELETE FROM deliveries WHERE id IN (
    SELECT id FROM deliveries
    WHERE state IN ('succeeded', 'failed') AND updated_at < $1
    LIMIT $2 FOR UPDATE SKIP LOCKED)
