-- Fails the deliveries in $1 that can get no more automatic attempt: their webhook was
-- deleted or disabled, or they have had every automatic attempt it allows (max_attempts, at
-- most $2), with no attempt under way. Any other delivery is left as it is, and so is one
-- waiting because its webhook was disabled when its event came (recovered once it is enabled
-- again) unless the webhook is deleted.
UPDATE deliveries d SET
    state = 'failed', wait_reason = NULL, next_attempt_at = NULL, updated_at = now()
FROM webhooks w
WHERE d.id = ANY($1) AND w.id = d.webhook_id
    -- The least and the greatest id: only their day partitions are read (see `claim.sql`).
    AND d.id BETWEEN $3 AND $4
    AND d.state IN ('pending', 'waiting', 'retrying')
    AND d.attempting_until IS NULL
    AND (w.deleted_at IS NOT NULL
        OR (NOT w.enabled AND d.wait_reason IS DISTINCT FROM 'webhook_disabled')
        OR d.auto_attempts >= least(w.max_attempts, $2))
RETURNING d.id
