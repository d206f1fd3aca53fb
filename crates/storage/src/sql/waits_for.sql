-- The delivery that delivery $1, waiting for its incident's order (`ordering`), waits for: the
-- latest unfinished earlier delivery of the same webhook and incident. None in any other case.
-- The earlier ones are looked up by the incident, and their events by key (LATERAL: a join
-- planned on a small log read the partitions whole).
SELECT p.id
FROM deliveries d
    JOIN events me ON me.id = d.event_id
    CROSS JOIN LATERAL (
        SELECT p.id
        FROM deliveries p
            CROSS JOIN LATERAL (SELECT pe.seq, pe.id FROM events pe
                WHERE pe.id = p.event_id LIMIT 1) pe
        WHERE p.incident_id = d.incident_id AND p.webhook_id = d.webhook_id
            AND p.id <> d.id AND p.state IN ('pending', 'waiting', 'retrying')
            AND (coalesce(pe.seq, 0), pe.id) < (coalesce(me.seq, 0), me.id)
        ORDER BY coalesce(pe.seq, 0) DESC, pe.id DESC
        LIMIT 1) p
-- Found by key; `IS TRUE` keeps the planner off the partial index `deliveries_waiting` (see
-- `SESSION_SETTINGS`).
WHERE d.id = $1 AND (d.state = 'waiting') IS TRUE AND d.wait_reason = 'ordering'
