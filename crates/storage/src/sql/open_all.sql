-- Opens an incident for each key without an open one, with its `incidents.opened` event and
-- the outbox row that publishes it (`$11`, the event message, one per input row, with `$13`,
-- its headers: NULL, or an array with NULL for none); `$12` holds each incident's labels. Keys are
-- inserted in key order (concurrent batches wait for each other in one order), outbox rows in
-- the order the alerts came in. The conflict target's predicate is a literal: PostgreSQL must
-- match the partial index when planning, which a bound parameter does not allow.
--
-- `$14` is each row's inbound token (NULL: none to check): a row whose token is not live
-- (revoked, or deleted) opens nothing, and the statement answers that token's id with
-- `revoked` true, beside the ids of the incidents it opened.
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
            $7::uuid[], $8::text[], $9::int4[], $11::bytea[], $12::jsonb[], $13::jsonb[],
            $14::uuid[])
        AS v(id, dedup_key, title, severity, source, description, event_id, body, arrival,
            message, labels, headers, token_id)
), live AS (
    SELECT v.* FROM input v
    WHERE v.token_id IS NULL OR EXISTS (SELECT 1 FROM inbound_tokens t
        WHERE t.id = v.token_id AND t.revoked_at IS NULL)
), opened AS (
    INSERT INTO incidents
        (id, dedup_key, title, severity, status, source, description, created_at, updated_at,
         labels)
    SELECT id, dedup_key, title, severity, 'triggered', source, description, $10, $10, labels
    FROM live ORDER BY dedup_key
    ON CONFLICT (dedup_key) WHERE status <> 'resolved' DO NOTHING
    RETURNING id
), recorded AS (
    INSERT INTO events (id, kind, incident_id, occurred_at, body)
    SELECT v.event_id, 'incidents.opened', v.id, $10, v.body FROM live v JOIN opened o ON o.id = v.id
), queued AS (
    INSERT INTO outbox (topic, headers, payload)
    SELECT 'event', COALESCE(v.headers, '{}'), v.message FROM live v JOIN opened o ON o.id = v.id
    ORDER BY v.arrival
)
SELECT id, false AS revoked FROM opened
UNION ALL
SELECT DISTINCT v.token_id, true FROM input v
WHERE v.token_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM live l WHERE l.id = v.id)
