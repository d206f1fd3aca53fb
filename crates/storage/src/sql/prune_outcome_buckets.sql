-- Deletes up to $2 webhook outcome buckets older than $1, oldest first through
-- `webhook_outcomes_by_bucket` (see `prune_outbox.sql`).
DELETE FROM webhook_outcomes WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM webhook_outcomes WHERE bucket < $1
    ORDER BY bucket
    LIMIT $2 FOR UPDATE SKIP LOCKED))
