-- The delivery that comes next, in its incident's order, after delivery $1 finished: of the
-- same webhook and incident, the earliest waiting for its order (`ordering`) that has no
-- unfinished earlier delivery left. None when another earlier one is still unfinished (it
-- releases the next when it finishes), nothing waits, or the webhook is disabled or deleted
-- (its waiting deliveries wait for it to be enabled and recovered).
SELECT n.id AS delivery_id, n.webhook_id, n.auto_attempts
FROM deliveries f
    JOIN deliveries n ON n.webhook_id = f.webhook_id AND n.incident_id = f.incident_id
        AND n.state = 'waiting' AND n.wait_reason = 'ordering'
    JOIN events ne ON ne.id = n.event_id
    JOIN webhooks w ON w.id = n.webhook_id AND w.enabled AND w.deleted_at IS NULL
WHERE f.id = $1
    AND NOT EXISTS (
        SELECT 1 FROM deliveries p JOIN events pe ON pe.id = p.event_id
        WHERE p.webhook_id = n.webhook_id AND p.incident_id = n.incident_id AND p.id <> n.id
            AND p.state IN ('pending', 'waiting', 'retrying')
            AND (coalesce(pe.seq, 0), pe.id) < (coalesce(ne.seq, 0), ne.id))
ORDER BY coalesce(ne.seq, 0), ne.id
LIMIT 1
