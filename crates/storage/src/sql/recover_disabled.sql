-- Makes up to $3 deliveries of webhook $1 created since $2 that wait because it was disabled
-- when their events came due now: `pending`, or `retrying` after an earlier attempt.
UPDATE deliveries d SET
    state = CASE WHEN d.auto_attempts = 0 THEN 'pending' ELSE 'retrying' END,
    wait_reason = NULL, next_attempt_at = now(), updated_at = now()
WHERE d.id IN (
    SELECT id FROM deliveries
    WHERE webhook_id = $1 AND state = 'waiting' AND wait_reason = 'webhook_disabled'
        AND created_at >= $2
    ORDER BY id LIMIT $3 FOR UPDATE)
RETURNING d.id AS delivery_id, d.webhook_id, d.auto_attempts
