-- The delivery that delivery $1, waiting for its incident's order (`ordering`), waits for: the
-- latest unfinished earlier delivery of the same webhook and incident. None in any other case.
SELECT p.id
FROM deliveries d
    JOIN events me ON me.id = d.event_id
    JOIN deliveries p ON p.webhook_id = d.webhook_id AND p.incident_id = d.incident_id
        AND p.id <> d.id AND p.state IN ('pending', 'waiting', 'retrying')
    JOIN events pe ON pe.id = p.event_id
-- Found by key; `IS TRUE` keeps the planner off the partial index `deliveries_waiting` (see
-- `SESSION_SETTINGS`).
WHERE d.id = $1 AND (d.state = 'waiting') IS TRUE AND d.wait_reason = 'ordering'
    AND (coalesce(pe.seq, 0), pe.id) < (coalesce(me.seq, 0), me.id)
ORDER BY coalesce(pe.seq, 0) DESC, pe.id DESC
LIMIT 1
