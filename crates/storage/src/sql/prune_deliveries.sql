-- Deletes up to $2 finished deliveries last changed before $1 (their attempts go with them,
-- ON DELETE CASCADE), skipping rows another transaction holds. Oldest first, by the time
-- index (see `prune_outbox.sql`): a batch reads past only the old rows it keeps.
DELETE FROM deliveries WHERE id = ANY (ARRAY(
    SELECT id FROM deliveries
    WHERE state IN ('succeeded', 'failed') AND updated_at < $1
    ORDER BY created_at, id
    LIMIT $2 FOR UPDATE SKIP LOCKED))
