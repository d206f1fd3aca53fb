-- Claims attempts before their requests are sent: each input row ($1 delivery ids, $2
-- triggers, $3 for an automatic attempt the automatic attempts the caller saw made) that its
-- guard admits adds an attempt row with no outcome yet, numbered by the delivery's new attempt
-- count, in the same statement. Ids are distinct (the caller splits repeats into rounds).
--
-- An automatic attempt is admitted only while the delivery is unfinished, no other automatic
-- attempt of it is under way (`attempting_until` unset), its automatic attempts are those the
-- caller saw (a redelivered or duplicate message finds them moved on), the schedule has
-- attempts left (the webhook's max_attempts, at most $5), the attempt is due (no earlier than
-- $6 ms ahead of `next_attempt_at`), and the webhook is enabled and not deleted. It takes a
-- lease: `attempting_until` (and `next_attempt_at`) is now plus the webhook's timeout plus $4
-- ms; if its outcome is not recorded by then, the sweeper records it as interrupted.
--
-- A manual attempt is admitted for an enabled, undeleted webhook's delivery unless it has
-- succeeded; it moves neither the automatic attempt count nor the schedule.
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::int4[]) AS v(id, trigger, expected)
), locked AS (
    SELECT d.id FROM deliveries d JOIN input v ON v.id = d.id ORDER BY d.id FOR UPDATE OF d
), claimed AS (
    UPDATE deliveries AS d SET
        attempt_count = d.attempt_count + 1,
        auto_attempts = d.auto_attempts + CASE WHEN v.trigger = 'automatic' THEN 1 ELSE 0 END,
        state = CASE
            WHEN v.trigger = 'automatic' AND d.state = 'waiting' AND d.auto_attempts = 0 THEN 'pending'
            WHEN v.trigger = 'automatic' AND d.state = 'waiting' THEN 'retrying'
            ELSE d.state END,
        wait_reason = CASE WHEN v.trigger = 'automatic' THEN NULL ELSE d.wait_reason END,
        attempting_until = CASE WHEN v.trigger = 'automatic'
            THEN now() + (w.timeout_ms + $4) * interval '1 millisecond'
            ELSE d.attempting_until END,
        next_attempt_at = CASE WHEN v.trigger = 'automatic'
            THEN now() + (w.timeout_ms + $4) * interval '1 millisecond'
            ELSE d.next_attempt_at END,
        updated_at = now()
    FROM input v, locked l, webhooks w
    WHERE d.id = v.id AND l.id = d.id AND w.id = d.webhook_id
        AND w.deleted_at IS NULL AND w.enabled
        AND CASE v.trigger
            WHEN 'automatic' THEN
                d.state IN ('pending', 'waiting', 'retrying')
                AND d.attempting_until IS NULL
                AND d.auto_attempts = v.expected
                AND d.auto_attempts < least(w.max_attempts, $5)
                AND d.next_attempt_at <= now() + $6 * interval '1 millisecond'
            ELSE d.state <> 'succeeded'
        END
    RETURNING d.id, d.attempt_count, d.auto_attempts
), logged AS (
    INSERT INTO attempts (delivery_id, number, trigger, started_at, request_headers)
    SELECT c.id, c.attempt_count, v.trigger, now(), '{}'::jsonb
    FROM claimed c JOIN input v ON v.id = c.id
)
SELECT c.id, c.attempt_count AS number, c.auto_attempts FROM claimed c
