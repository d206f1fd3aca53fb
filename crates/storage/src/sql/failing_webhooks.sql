-- The enabled webhooks that have failed without a success for $1 ms or longer.
SELECT h.webhook_id, h.consecutive_failures, h.failing_since, h.last_error
FROM webhook_health h JOIN webhooks w ON w.id = h.webhook_id
WHERE w.enabled AND w.deleted_at IS NULL AND h.failing_since IS NOT NULL
    AND h.last_failure_at >= h.failing_since + $1 * interval '1 millisecond'
ORDER BY h.webhook_id
