-- Records the outcome of claimed attempts and moves their deliveries, in one statement. An
-- attempt whose outcome is recorded already (the sweeper found it interrupted) changes
-- nothing. The delivery moves to $4 (the transition's state; NULL keeps it) only where the
-- transition is allowed: to `succeeded` from any state but `succeeded`; to `retrying` or
-- `failed` (a failed automatic attempt) only while the delivery is unfinished and this is its
-- latest automatic attempt. A `retrying` delivery's next attempt is due $5 ms from now. The
-- lease of an automatic attempt ends with it. Rows are locked in id order. $14 and $15 are the
-- least and the greatest of the ids: reads by id are bounded by them, so that only the day
-- partitions between them are read (see `claim.sql`).
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::int4[], $3::int4[], $4::text[], $5::int8[],
            $6::bool[], $7::int4[], $8::int4[], $9::text[], $10::text[], $11::jsonb[],
            $12::text[], $13::bool[])
        AS v(id, number, auto_attempts, to_state, delay_ms, success, status_code, duration_ms,
            error, error_detail, request_headers, response_body, response_truncated)
), done AS (
    UPDATE attempts a SET
        success = v.success,
        status_code = v.status_code,
        duration_ms = v.duration_ms,
        error = v.error,
        error_detail = v.error_detail,
        request_headers = v.request_headers,
        response_body = v.response_body,
        response_truncated = v.response_truncated
    FROM input v
    -- Found by key; `IS TRUE` keeps the planner off the partial index `attempts_under_way`
    -- (see `SESSION_SETTINGS`).
    WHERE a.delivery_id = v.id AND a.number = v.number AND (a.success IS NULL) IS TRUE
        AND a.delivery_id BETWEEN $14 AND $15
    RETURNING a.delivery_id
), judged AS (
    SELECT d.id, v.to_state, v.delay_ms, v.auto_attempts,
        CASE v.to_state
            WHEN 'succeeded' THEN d.state <> 'succeeded'
            WHEN 'retrying' THEN d.state IN ('pending', 'waiting', 'retrying')
                AND d.auto_attempts = v.auto_attempts
            WHEN 'failed' THEN d.state IN ('pending', 'waiting', 'retrying')
                AND d.auto_attempts = v.auto_attempts
            ELSE false
        END AS allowed,
        v.auto_attempts IS NOT NULL AND d.auto_attempts = v.auto_attempts AS ends_lease
    FROM deliveries d JOIN input v ON v.id = d.id JOIN done x ON x.delivery_id = d.id
    WHERE d.id BETWEEN $14 AND $15
    ORDER BY d.id
    FOR UPDATE OF d
), moved AS (
    UPDATE deliveries AS d SET
        state = CASE WHEN j.allowed THEN j.to_state ELSE d.state END,
        next_attempt_at = CASE
            WHEN j.allowed AND j.to_state = 'retrying'
                THEN now() + j.delay_ms * interval '1 millisecond'
            WHEN j.allowed THEN NULL
            WHEN j.ends_lease AND d.state IN ('pending', 'waiting', 'retrying') THEN now()
            ELSE d.next_attempt_at END,
        wait_reason = CASE WHEN j.allowed THEN NULL ELSE d.wait_reason END,
        attempting_until = CASE WHEN j.ends_lease THEN NULL ELSE d.attempting_until END,
        updated_at = now()
    FROM judged j
    WHERE d.id = j.id AND (j.allowed OR j.ends_lease) AND d.id BETWEEN $14 AND $15
    RETURNING d.id, d.state, d.next_attempt_at, j.allowed
)
SELECT x.delivery_id AS id, m.state, m.next_attempt_at, coalesce(m.allowed, false) AS moved
FROM done x LEFT JOIN moved m ON m.id = x.delivery_id
