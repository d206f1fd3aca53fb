-- One chunk of `aged`'s fill: $2 events spread evenly over the day starting at $1, each with
-- its incident (resolved) and one delivery to each webhook in $3, whose attempt succeeded at
-- once, or (a share $4 of deliveries) who failed five times with a 500. Ids are UUIDv7s of the
-- event's time; a delivery's id carries its event's time, as the fan-out makes them.
WITH times AS (
    SELECT $1::timestamptz + (n - random()) * interval '1 day' / $2 AS ts
    FROM generate_series(1, $2::int8) n
), ev AS (
    SELECT uuid_v7(ts) AS id, uuid_v7(ts) AS incident_id, ts
    FROM times
), incidents_written AS (
    INSERT INTO incidents (id, dedup_key, title, severity, status, source, created_at,
        updated_at, resolved_at)
    SELECT incident_id, 'aged:' || incident_id, 'Disk full on db-1', 'SEV2', 'resolved',
        'generic', ts, ts + interval '5 minutes', ts + interval '5 minutes'
    FROM ev
), events_written AS (
    INSERT INTO events (id, kind, incident_id, occurred_at, body)
    SELECT id, 'incidents.resolved', incident_id, ts,
        json_build_object('event', 'incidents.resolved', 'timestamp', ts,
            'data', json_build_object('id', incident_id, 'title', 'Disk full on db-1',
                'severity', 'SEV2', 'status', 'resolved'))::text
    FROM ev
), planned AS (
    SELECT ev.id AS event_id, ev.incident_id, ev.ts, w.id AS webhook_id, random() < $4 AS failed,
        uuid_v7_sharing_time(ev.id) AS id
    FROM ev CROSS JOIN unnest($3::uuid[]) AS w(id)
), deliveries_written AS (
    INSERT INTO deliveries (id, webhook_id, event_id, event, incident_id, state, attempt_count,
        auto_attempts, next_attempt_at, created_at, updated_at)
    SELECT id, webhook_id, event_id, 'incidents.resolved', incident_id,
        CASE WHEN failed THEN 'failed' ELSE 'succeeded' END,
        CASE WHEN failed THEN 5 ELSE 1 END, CASE WHEN failed THEN 5 ELSE 1 END, NULL, ts,
        ts + CASE WHEN failed THEN interval '2 hours 36 minutes' ELSE interval '40 ms' END
    FROM planned
)
INSERT INTO attempts (delivery_id, number, trigger, started_at, success, status_code,
    duration_ms, error, error_detail, request_headers, response_body)
SELECT p.id, n, 'automatic', p.ts, NOT p.failed, CASE WHEN p.failed THEN 500 ELSE 200 END, 40,
    CASE WHEN p.failed THEN 'http_status' END,
    CASE WHEN p.failed THEN 'the target answered 500' END,
    jsonb_build_object('content-type', 'application/json', 'user-agent', 'Tocsin/0.1.0',
        'webhook-id', p.id::text, 'webhook-timestamp', extract(epoch FROM p.ts)::int8::text,
        'webhook-signature', 'v1,' || encode(sha256(p.id::text::bytea), 'base64'),
        'tocsin-attempt', n::text),
    CASE WHEN p.failed THEN 'upstream exploded' ELSE 'ok' END
FROM planned p CROSS JOIN LATERAL generate_series(1, CASE WHEN p.failed THEN 5 ELSE 1 END) n
