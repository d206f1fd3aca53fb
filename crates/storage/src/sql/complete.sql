-- Records the outcome of claimed attempts and moves their deliveries, in one statement. An
-- attempt whose outcome is recorded already (the sweeper found it interrupted) changes
-- nothing. The delivery moves to $4 (the transition's state; NULL keeps it) only where the
-- transition is allowed: to `succeeded` from any state but `succeeded`; to `retrying` or
-- `failed` (a failed automatic attempt) only while the delivery is unfinished and this is its
-- latest automatic attempt. A `retrying` delivery's next attempt is due $5 ms from now. The
-- lease of an automatic attempt ends with it. Rows are locked in id order.
--
-- The outcomes recorded (all but `interrupted`, which is the dispatcher's doing, not the
-- target's) update each webhook's health, in webhook order: a success clears its failures,
-- a failure counts one more and starts its failing time if none runs; and its five-minute
-- bucket of successes and failures (docs/admin-api.md, "Webhook health").
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::int4[], $3::int4[], $4::text[], $5::int8[],
            $6::bool[], $7::int4[], $8::int4[], $9::text[], $10::text[], $11::jsonb[],
            $12::text[], $13::bool[]) WITH ORDINALITY
        AS v(id, number, auto_number, to_state, delay_ms, success, status_code, duration_ms,
            error, error_detail, request_headers, response_body, response_truncated, ord)
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
    WHERE a.delivery_id = v.id AND a.number = v.number AND a.success IS NULL
    RETURNING a.delivery_id
), judged AS (
    SELECT d.id, v.to_state, v.delay_ms, v.auto_number,
        CASE v.to_state
            WHEN 'succeeded' THEN d.state <> 'succeeded'
            WHEN 'retrying' THEN d.state IN ('pending', 'waiting', 'retrying')
                AND d.auto_attempts = v.auto_number
            WHEN 'failed' THEN d.state IN ('pending', 'waiting', 'retrying')
                AND d.auto_attempts = v.auto_number
            ELSE false
        END AS allowed,
        v.auto_number IS NOT NULL AND d.auto_attempts = v.auto_number AS ends_lease
    FROM deliveries d JOIN input v ON v.id = d.id JOIN done x ON x.delivery_id = d.id
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
    WHERE d.id = j.id AND (j.allowed OR j.ends_lease)
    RETURNING d.id, d.state, d.next_attempt_at, j.allowed
), outcomes AS (
    SELECT d.webhook_id, v.success, v.ord,
        max(v.ord) FILTER (WHERE v.success) OVER (PARTITION BY d.webhook_id) AS last_success,
        v.error || coalesce(': ' || left(v.error_detail, 500), '') AS error
    FROM done x JOIN input v ON v.id = x.delivery_id JOIN deliveries d ON d.id = x.delivery_id
    WHERE v.error IS DISTINCT FROM 'interrupted'
), per_webhook AS (
    SELECT o.webhook_id,
        bool_or(o.success) AS any_success,
        count(*) FILTER (WHERE o.success) AS successes,
        count(*) FILTER (WHERE NOT o.success) AS failures,
        -- Failures after the batch's last success (its input order).
        count(*) FILTER (WHERE NOT o.success AND o.ord > coalesce(o.last_success, 0))
            AS trailing_failures,
        (array_agg(o.error ORDER BY o.ord DESC) FILTER (WHERE NOT o.success))[1] AS last_error
    FROM outcomes o GROUP BY o.webhook_id
), health AS (
    INSERT INTO webhook_health AS h (webhook_id, consecutive_failures, failing_since,
        last_success_at, last_failure_at, last_error)
    SELECT p.webhook_id, p.trailing_failures,
        CASE WHEN p.trailing_failures > 0 THEN now() END,
        CASE WHEN p.any_success THEN now() END,
        CASE WHEN p.failures > 0 THEN now() END,
        p.last_error
    FROM per_webhook p ORDER BY p.webhook_id
    ON CONFLICT (webhook_id) DO UPDATE SET
        consecutive_failures = CASE WHEN EXCLUDED.last_success_at IS NOT NULL
            THEN EXCLUDED.consecutive_failures
            ELSE h.consecutive_failures + EXCLUDED.consecutive_failures END,
        failing_since = CASE
            WHEN EXCLUDED.consecutive_failures = 0 THEN NULL
            WHEN EXCLUDED.last_success_at IS NOT NULL THEN EXCLUDED.failing_since
            ELSE coalesce(h.failing_since, EXCLUDED.failing_since) END,
        last_success_at = coalesce(EXCLUDED.last_success_at, h.last_success_at),
        last_failure_at = coalesce(EXCLUDED.last_failure_at, h.last_failure_at),
        last_error = coalesce(EXCLUDED.last_error, h.last_error)
), counted AS (
    INSERT INTO webhook_outcomes AS b (webhook_id, bucket, successes, failures)
    SELECT p.webhook_id, date_bin('5 minutes', now(), timestamptz '2000-01-01'), p.successes,
        p.failures
    FROM per_webhook p ORDER BY p.webhook_id
    ON CONFLICT (webhook_id, bucket) DO UPDATE SET
        successes = b.successes + EXCLUDED.successes, failures = b.failures + EXCLUDED.failures
)
SELECT x.delivery_id AS id, m.state, m.next_attempt_at, coalesce(m.allowed, false) AS moved
FROM done x LEFT JOIN moved m ON m.id = x.delivery_id
