-- Fan-out of the events in $1..$4 (ids, kinds, incident ids, test webhook ids): one delivery
-- per (event, target), where the targets are every enabled, undeleted webhook subscribed to
-- the event's kind, or for a test event its one undeleted webhook. A delivery to a webhook in
-- $5 (those the fanning dispatcher has no room for now) starts `waiting`, the others `pending`.
-- Idempotent: a pair that has its delivery already gets none (a redelivered event creates
-- nothing twice). Rows are inserted in key order, so that concurrent fan-outs wait for each
-- other's rows in one order. New ids are UUIDv7s (a millisecond timestamp, then random bits),
-- like those made in Rust.
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::uuid[])
        AS v(event_id, kind, incident_id, test_webhook_id)
), targets AS (
    SELECT v.event_id, v.kind, v.incident_id, w.id AS webhook_id
    FROM input v JOIN webhooks w
        ON w.deleted_at IS NULL AND w.enabled AND w.events @> ARRAY[v.kind]
    WHERE v.test_webhook_id IS NULL
    UNION ALL
    SELECT v.event_id, v.kind, v.incident_id, w.id
    FROM input v JOIN webhooks w ON w.id = v.test_webhook_id AND w.deleted_at IS NULL
)
INSERT INTO deliveries
    (id, webhook_id, event_id, event, incident_id, state, wait_reason, next_attempt_at,
     created_at, updated_at)
SELECT
    encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
        FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid,
    t.webhook_id, t.event_id, t.kind, t.incident_id,
    CASE WHEN t.webhook_id = ANY($5) THEN 'waiting' ELSE 'pending' END,
    CASE WHEN t.webhook_id = ANY($5) THEN 'webhook_busy' END,
    now(), now(), now()
FROM targets t
ORDER BY t.event_id, t.webhook_id
ON CONFLICT (event_id, webhook_id) DO NOTHING
RETURNING id, event_id, webhook_id, state
