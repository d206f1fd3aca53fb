-- Records what one dispatcher tallied of each webhook's attempt outcomes since its last call
-- ($1 webhook ids; $2 successes, $3 failures; $4 the failures after the tally's last success;
-- $5 the last success's time, $6 the last failure's, $7 the first failure after the last
-- success, $8 the last failure's error), in webhook order: a success clears the failures
-- before it, a failure counts one more and starts the failing time if none runs. The counts
-- also go into the current five-minute bucket of `webhook_outcomes`. A webhook deleted for
-- good is skipped.
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::int4[], $3::int4[], $4::int4[], $5::timestamptz[],
            $6::timestamptz[], $7::timestamptz[], $8::text[])
        AS v(webhook_id, successes, failures, trailing_failures, last_success_at, last_failure_at,
            failing_since, last_error)
    WHERE EXISTS (SELECT 1 FROM webhooks w WHERE w.id = v.webhook_id)
), health AS (
    INSERT INTO webhook_health AS h (webhook_id, consecutive_failures, failing_since,
        last_success_at, last_failure_at, last_error)
    SELECT v.webhook_id, v.trailing_failures, v.failing_since, v.last_success_at, v.last_failure_at,
        v.last_error
    FROM input v ORDER BY v.webhook_id
    ON CONFLICT (webhook_id) DO UPDATE SET
        consecutive_failures = CASE WHEN EXCLUDED.last_success_at IS NOT NULL
            THEN EXCLUDED.consecutive_failures
            ELSE h.consecutive_failures + EXCLUDED.consecutive_failures END,
        failing_since = CASE
            WHEN EXCLUDED.consecutive_failures = 0 THEN NULL
            WHEN EXCLUDED.last_success_at IS NOT NULL THEN EXCLUDED.failing_since
            ELSE coalesce(h.failing_since, EXCLUDED.failing_since) END,
        last_success_at = greatest(EXCLUDED.last_success_at, h.last_success_at),
        last_failure_at = greatest(EXCLUDED.last_failure_at, h.last_failure_at),
        last_error = coalesce(EXCLUDED.last_error, h.last_error)
)
INSERT INTO webhook_outcomes AS b (webhook_id, bucket, successes, failures)
SELECT v.webhook_id, date_bin('5 minutes', now(), timestamptz '2000-01-01'), v.successes,
    v.failures
FROM input v ORDER BY v.webhook_id
ON CONFLICT (webhook_id, bucket) DO UPDATE SET
    successes = b.successes + EXCLUDED.successes, failures = b.failures + EXCLUDED.failures
