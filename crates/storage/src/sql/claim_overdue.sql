-- Pending or retrying deliveries whose next attempt is overdue by more than $1 ms with no
-- attempt under way (their message lost by the broker, or their dispatcher stopped before
-- making the attempt): at most $2, oldest first, locked so that concurrent sweepers take
-- different rows. Each is made due now, so that it is not taken again for another grace.
UPDATE deliveries d SET next_attempt_at = now()
WHERE d.id IN (
    SELECT id FROM deliveries
    WHERE state IN ('pending', 'retrying')
        AND attempting_until IS NULL
        AND next_attempt_at < now() - $1 * interval '1 millisecond'
    ORDER BY next_attempt_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
RETURNING d.id AS delivery_id, d.webhook_id, d.auto_attempts
