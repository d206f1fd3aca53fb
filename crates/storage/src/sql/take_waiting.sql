-- Waiting deliveries to try now, oldest first per webhook: those waiting for a slot
-- (`webhook_busy`), those waiting for their webhook's rate limit (`rate_limited`) whose time
-- has come, and those waiting for their incident's order (`ordering`) whose earlier deliveries
-- have all finished (or whose webhook no longer asks for order); for each enabled webhook at most the room the caller has for it ($1 webhook
-- ids, $2 room; $3 for any other webhook), at most $4 in all. Webhooks are walked one by one
-- through the partial index of waiting rows, so a large backlog waiting for one webhook costs
-- the others nothing; deliveries waiting for a disabled webhook are not read at all (they wait
-- for it to be enabled). Those of a deleted webhook are taken, so that their refused claims
-- fail them: a fan-out that met the deletion may have left some after it stopped the rest.
SELECT d.id AS delivery_id, d.webhook_id, d.auto_attempts
FROM webhooks w CROSS JOIN LATERAL (
    SELECT d.id, d.webhook_id, d.auto_attempts, d.created_at FROM deliveries d
    WHERE d.webhook_id = w.id AND d.state = 'waiting'
        AND (d.wait_reason = 'webhook_busy'
            OR (d.wait_reason = 'rate_limited' AND d.next_attempt_at <= now())
            OR (d.wait_reason = 'ordering' AND (w.ordering <> 'incident' OR NOT EXISTS (
                SELECT 1 FROM deliveries p JOIN events pe ON pe.id = p.event_id, events me
                WHERE me.id = d.event_id AND p.webhook_id = d.webhook_id
                    AND p.incident_id = d.incident_id AND p.id <> d.id
                    AND p.state IN ('pending', 'waiting', 'retrying')
                    AND (coalesce(pe.seq, 0), pe.id) < (coalesce(me.seq, 0), me.id)))))
    ORDER BY d.created_at, d.id
    LIMIT coalesce(
        (SELECT q.room FROM unnest($1::uuid[], $2::int8[]) AS q(webhook_id, room)
         WHERE q.webhook_id = w.id LIMIT 1),
        $3)
) d
WHERE w.enabled OR w.deleted_at IS NOT NULL
ORDER BY d.created_at, d.id
LIMIT $4
