-- Opens an incident for each key without an open one, with its `incidents.opened` event and
-- the outbox row that publishes it (`$11`, the event message, one per input row, with `$13`,
-- its headers: NULL, or an array with NULL for none); `$12` holds each incident's labels. Keys are
-- inserted in key order (concurrent batches wait for each other in one order), outbox rows in
-- the order the alerts came in. The conflict target's predicate is a literal: PostgreSQL must
-- match the partial index when planning, which a bound parameter does not allow.
--
-- `$14` is each row's inbound token (NULL: none to check): a row whose token is not live
-- (revoked, or deleted) opens nothing. `$15` holds the outbox rows from every relay's claim
-- until then (NULL: not held; `outbox::Wake`). The statement answers the ids of the
-- incidents it opened (`revoked` false), the tokens that are not live (`revoked` true), and
-- the outbox rows it wrote.
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
    INSERT INTO outbox (topic, headers, payload, held_until)
    SELECT 'event', COALESCE(v.headers, '{}'), v.message, $15 FROM live v JOIN opened o ON o.id = v.id
    ORDER BY v.arrival
    RETURNING id, topic, headers, payload
)
SELECT id, false AS revoked, NULL::int8 AS outbox_id, NULL::text AS topic, NULL::jsonb AS headers,
    NULL::bytea AS payload
FROM opened
UNION ALL
SELECT DISTINCT v.token_id, true, NULL::int8, NULL::text, NULL::jsonb, NULL::bytea FROM input v
WHERE v.token_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM live l WHERE l.id = v.id)
UNION ALL
SELECT NULL::uuid, NULL::bool, id, topic, headers, payload FROM queued
