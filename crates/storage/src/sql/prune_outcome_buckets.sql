-- Deletes up to $2 webhook outcome buckets older than $1.
DELETE FROM webhook_outcomes WHERE (webhook_id, bucket) IN (
    SELECT webhook_id, bucket FROM webhook_outcomes WHERE bucket < $1
    LIMIT $2 FOR UPDATE SKIP LOCKED)
