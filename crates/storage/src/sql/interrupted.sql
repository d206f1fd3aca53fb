-- Attempts whose outcome was never recorded because the dispatcher making them stopped: an
-- automatic attempt once its delivery's lease ended more than $1 ms ago, a manual one once it
-- started more than $2 ms ago. At most $3, oldest first.
SELECT a.delivery_id, d.webhook_id, a.number, a.trigger, d.auto_attempts, w.max_attempts
FROM attempts a
    JOIN deliveries d ON d.id = a.delivery_id
    JOIN webhooks w ON w.id = d.webhook_id
WHERE a.success IS NULL
    AND CASE a.trigger
        WHEN 'automatic' THEN d.attempting_until < now() - $1 * interval '1 millisecond'
        ELSE a.started_at < now() - $2 * interval '1 millisecond'
    END
ORDER BY a.started_at
LIMIT $3
