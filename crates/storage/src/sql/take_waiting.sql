-- Waiting deliveries to try now, oldest first per webhook: for each webhook at most the room
-- the caller has for it ($1 webhook ids, $2 room; $3 for any other webhook), at most $4 in
-- all. Webhooks are walked one by one through the partial index of waiting rows, so a large
-- backlog waiting for one busy webhook costs the others nothing.
SELECT d.id AS delivery_id, d.webhook_id, d.auto_attempts
FROM webhooks w CROSS JOIN LATERAL (
    SELECT d.id, d.webhook_id, d.auto_attempts, d.created_at FROM deliveries d
    WHERE d.webhook_id = w.id AND d.state = 'waiting'
    ORDER BY d.created_at, d.id
    LIMIT coalesce(
        (SELECT q.room FROM unnest($1::uuid[], $2::int8[]) AS q(webhook_id, room)
         WHERE q.webhook_id = w.id LIMIT 1),
        $3)
) d
ORDER BY d.created_at, d.id
LIMIT $4
