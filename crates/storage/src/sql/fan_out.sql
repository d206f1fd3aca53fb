-- Fan-out of the events in $1..$4 (ids, kinds, incident ids, test webhook ids): one delivery
-- per (event, target), where the targets are every undeleted webhook subscribed to the
-- event's kind whose filters let it through (`webhook_filters_accept`: the severity of the
-- event's incident, its alert format or source, its labels), or for a test event its one
-- undeleted webhook. Idempotent: a pair that has its delivery already gets none (a
-- redelivered event creates nothing twice). Rows are inserted in key order, so that
-- concurrent fan-outs wait for each other's rows in one order. New ids are UUIDv7s with the
-- event's millisecond time, then random bits: a delivery is in its event's day partition
-- (`partitions.rs`).
--
-- Every read of `events` and `deliveries` starts at id $10, which `fan_out.rs` writes into the
-- text as a literal (`read_floor`: the first id of the day of an hour before the oldest given
-- incident opened), so that PostgreSQL plans only the partitions from that day on: a scan of
-- each partition set up on every call cost the 20/s fan-out stage p50 3.7 against 1.8 ms at 38
-- partitions, and a plan of every partition, made again on every connection when retention
-- drops a day, 22-25 ms against 2.7-3.0 at 37. No upper bound: a range
-- closed at both ends looked selective enough for it to read the range instead of the key (a
-- hash join over 20 800 events, measured); reads of one row by id go through LATERAL ...
-- LIMIT 1, so that each stays a lookup by key whatever the plan.
--
-- Each event's row is read once (`given`, `earlier`), and whether a pair has its delivery once
-- (`subscribed`): a generic plan holds a scan of every partition for every read, and is made
-- again on every connection whenever a partition is attached, detached or dropped (retention,
-- the days ahead). At 38 partitions, planning took 37.5 ms with ten reads and 20.0 ms with
-- five (psql, median of 10 each, alternating). On an empty database (8 partitions), single
-- runs in one sitting, the 20/s fan-out stage p50 went from 3.5 to 2.8 ms and `e2e` from 1 352
-- to 1 505-1 529 deliveries/s. An event not found (not yet readable) still gets its deliveries to
-- webhooks without filters, as before; they are sent once their claim's lease ends.
--
-- A delivery to a disabled webhook starts `waiting` (`webhook_disabled`): listed, and sent
-- only when an operator recovers it. Whether a webhook is disabled is read from its row locked
-- (`disabled`), not from this statement's snapshot: an enabling that commits while this
-- statement runs is seen, so its deliveries start as an enabled webhook's, and one that
-- starts later waits for this statement's commit, so the recovery that follows it finds them.
-- It locks every disabled webhook subscribed to a kind in $2 (or tested by $4), filters aside,
-- so that `subscribed` is read once and stays inlined.
--
-- The fanning dispatcher has room for $8[i] more attempts to webhook $5[i] (any other: no
-- limit): a delivery beyond its webhook's room starts `waiting` (`webhook_busy`). When $6 is
-- true, every other delivery, but those of a rate-limited webhook (their claims go through its
-- budget, `sql/claim.sql`), starts with its first attempt claimed, as `sql/claim.sql` claims
-- one: counted, leased for twice the webhook's timeout (time to wait for a slot, then to make
-- the request) plus $7 ms, and logged with no outcome yet, in this same statement; the
-- fanning dispatcher makes them.
-- Otherwise they start `pending`.
--
-- A replay ($9, a webhook id; else NULL) gives the events to that one webhook only, as their
-- fan-out would have (subscription and filters apply), and marks the deliveries `replayed`.
--
-- A webhook that receives each incident's events in order (`ordering = 'incident'`) also gets
-- the deliveries of the incident's earlier events it has none of (those that happened since it
-- was created and that its subscription and filters accept), and a delivery that has an
-- unfinished earlier one for the same incident, made before or in this statement, starts
-- `waiting` (`ordering`), neither claimed nor taking room: it is claimed once the earlier one
-- has finished (`sql/claim.sql` refuses it until then). Events are ordered by `seq`.
WITH given AS (
    -- Each given event's row, read once: everything below takes its time, order and body from
    -- here (`found` false: no such event).
    SELECT v.*, g.id IS NOT NULL AS found, g.seq, g.occurred_at, g.body,
        g.test_webhook_id AS event_test_webhook_id
    FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::uuid[])
            AS v(event_id, kind, incident_id, test_webhook_id)
        LEFT JOIN LATERAL (SELECT g.id, g.seq, g.occurred_at, g.body, g.test_webhook_id
            FROM events g WHERE g.id = v.event_id AND g.id >= $10 LIMIT 1) g ON true
), earlier AS (
    -- While any webhook receives incidents' events in order: each given event's incident's
    -- earlier events, fanned out or not, so that every earlier delivery exists before a later
    -- one is decided (two dispatchers may fan out one incident's events in either order).
    SELECT DISTINCT ON (e.id) e.id AS event_id, e.kind, e.incident_id,
        NULL::uuid AS test_webhook_id, true AS found, e.seq, e.occurred_at, e.body,
        e.test_webhook_id AS event_test_webhook_id
    FROM given v
        JOIN LATERAL (SELECT e.id, e.kind, e.incident_id, e.seq, e.occurred_at, e.body,
                e.test_webhook_id
            FROM events e
            WHERE e.incident_id = v.incident_id AND e.test_webhook_id IS NULL AND e.id >= $10
                AND (coalesce(e.seq, 0), e.id) < (coalesce(v.seq, 0), v.event_id)
                -- Recent ones only: this repairs fan-outs that race (seconds apart, or the
                -- length of a broker outage), and never brings back an event whose delivery
                -- retention pruned.
                AND e.occurred_at > now() - interval '1 day'
            OFFSET 0) e ON true
    WHERE v.found AND v.test_webhook_id IS NULL
        AND EXISTS (SELECT 1 FROM webhooks w WHERE w.ordering = 'incident' AND w.deleted_at IS NULL)
        AND e.id NOT IN (SELECT x.event_id FROM given x)
    ORDER BY e.id
), input AS (
    SELECT v.*, false AS earlier FROM given v
    UNION ALL
    SELECT x.*, true FROM earlier x
), subscribed AS (
    -- `delivered`: for an ordered webhook, or an earlier event, whether the pair has its
    -- delivery already.
    SELECT s.* FROM (
        SELECT v.event_id, v.kind, v.incident_id, w.id AS webhook_id, w.timeout_ms, w.enabled,
            w.rate_limit_per_second IS NOT NULL AS limited, w.ordering = 'incident' AS ordered,
            v.earlier, coalesce(v.seq, 0) AS seq,
            (v.earlier OR w.ordering = 'incident') AND EXISTS (SELECT 1 FROM deliveries d
                WHERE d.event_id = v.event_id AND d.webhook_id = w.id
                    AND d.id >= $10) AS delivered
        FROM input v JOIN webhooks w
            ON w.deleted_at IS NULL AND w.events @> ARRAY[v.kind]
        WHERE v.test_webhook_id IS NULL AND ($9::uuid IS NULL OR w.id = $9)
            -- An earlier event goes only to ordered webhooks that existed when it happened.
            AND (NOT v.earlier OR (w.ordering = 'incident' AND v.occurred_at >= w.created_at))
            AND (w.filters = '{}'::jsonb OR (
                SELECT webhook_filters_accept(w.filters, v.body::jsonb #>> '{data,severity}',
                    i.dedup_key, i.source, i.labels)
                FROM (SELECT 1) one LEFT JOIN incidents i ON i.id = v.incident_id
                WHERE v.found))
        OFFSET 0) s
    -- An earlier event goes only where it has no delivery yet.
    WHERE NOT (s.earlier AND s.delivered)
    UNION ALL
    SELECT v.event_id, v.kind, v.incident_id, w.id, w.timeout_ms, w.enabled,
        w.rate_limit_per_second IS NOT NULL, false, false, coalesce(v.seq, 0), false
    FROM input v JOIN webhooks w ON w.id = v.test_webhook_id AND w.deleted_at IS NULL
), disabled AS (
    SELECT w.id FROM webhooks w
    WHERE NOT w.enabled AND w.deleted_at IS NULL
        AND (w.events && $2::text[] OR w.events && ARRAY(SELECT x.kind FROM earlier x)
            OR w.id = ANY($4::uuid[]))
    FOR SHARE
), decided AS (
    SELECT s.event_id, s.kind, s.incident_id, s.webhook_id, s.timeout_ms, s.limited, s.ordered,
        d.id IS NULL AS enabled,
        CASE WHEN s.ordered THEN s.seq END AS seq,
        s.ordered AND s.delivered AS delivered
    FROM subscribed s LEFT JOIN disabled d ON d.id = s.webhook_id
), ordered AS (
    -- Behind: for an ordered webhook, the incident has an earlier delivery to it that is not
    -- finished, made before or in this statement; it waits (`ordering`).
    SELECT s.*, s.enabled AND s.ordered AND (
            count(*) FILTER (WHERE NOT s.delivered) OVER (
                PARTITION BY s.webhook_id, s.incident_id, s.ordered ORDER BY s.seq, s.event_id
                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) > 0
            OR EXISTS (SELECT 1 FROM deliveries p
                    JOIN events pe ON pe.id = p.event_id AND pe.id >= $10
                WHERE p.webhook_id = s.webhook_id AND p.incident_id = s.incident_id
                    AND p.id >= $10
                    AND p.state IN ('pending', 'waiting', 'retrying')
                    AND (coalesce(pe.seq, 0), pe.id) < (s.seq, s.event_id))) AS behind
    FROM decided s
), targets AS (
    SELECT s.*,
        s.enabled AND NOT s.behind AND row_number() OVER (
            PARTITION BY s.webhook_id, s.behind ORDER BY s.event_id)
            > coalesce(r.room, 9223372036854775807) AS busy,
        $6 AND s.enabled AND NOT s.behind AND NOT s.limited AND row_number() OVER (
            PARTITION BY s.webhook_id, s.behind ORDER BY s.event_id)
            <= coalesce(r.room, 9223372036854775807) AS claim
    FROM ordered s LEFT JOIN unnest($5::uuid[], $8::int8[]) AS r(webhook_id, room)
        ON r.webhook_id = s.webhook_id
), created AS (
    INSERT INTO deliveries
        (id, webhook_id, event_id, event, incident_id, state, wait_reason, attempt_count,
         auto_attempts, attempting_until, next_attempt_at, created_at, updated_at, replayed)
    SELECT
        uuid_v7_sharing_time(t.event_id),
        t.webhook_id, t.event_id, t.kind, t.incident_id,
        CASE WHEN NOT t.enabled OR t.busy OR t.behind THEN 'waiting' ELSE 'pending' END,
        CASE WHEN NOT t.enabled THEN 'webhook_disabled' WHEN t.behind THEN 'ordering'
            WHEN t.busy THEN 'webhook_busy' END,
        CASE WHEN t.claim THEN 1 ELSE 0 END,
        CASE WHEN t.claim THEN 1 ELSE 0 END,
        CASE WHEN t.claim
            THEN now() + (2 * t.timeout_ms + $7) * interval '1 millisecond' END,
        CASE WHEN NOT t.claim THEN now() END,
        now(), now(), $9::uuid IS NOT NULL
    FROM targets t
    ORDER BY t.event_id, t.webhook_id
    -- No conflict target: in day partitions, each day's own unique index is the arbiter.
    ON CONFLICT DO NOTHING
    RETURNING *
), logged AS (
    INSERT INTO attempts (delivery_id, number, trigger, started_at, request_headers)
    SELECT c.id, 1, 'automatic', now(), '{}'::jsonb FROM created c WHERE c.attempt_count = 1
)
-- Everything making a claimed attempt needs, so that no second query loads it.
SELECT c.*, row_to_json(w)::text AS webhook, e.body, e.occurred_at, e.test_webhook_id
FROM created c JOIN webhooks w ON w.id = c.webhook_id
    JOIN LATERAL (SELECT i.body, i.occurred_at, i.event_test_webhook_id AS test_webhook_id
        FROM input i WHERE i.event_id = c.event_id AND i.found LIMIT 1) e ON true
