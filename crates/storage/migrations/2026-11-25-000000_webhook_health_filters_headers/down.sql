-- Back to the previous release: deliveries waiting for a disabled or rate-limited webhook
-- become pending (the previous release fails them once it finds their webhook disabled).
UPDATE deliveries SET state = CASE WHEN auto_attempts = 0 THEN 'pending' ELSE 'retrying' END,
    wait_reason = NULL, next_attempt_at = now()
WHERE state = 'waiting' AND wait_reason IN ('webhook_disabled', 'rate_limited');
ALTER TABLE deliveries DROP CONSTRAINT deliveries_wait_reason_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_wait_reason_check
    CHECK (wait_reason IN ('webhook_busy'));
DROP TABLE webhook_rate_budgets;
DROP TABLE webhook_outcomes;
DROP TABLE webhook_health;
DROP FUNCTION webhook_filters_accept(jsonb, text, text, text, jsonb);
ALTER TABLE incidents DROP COLUMN labels;
ALTER TABLE webhooks
    DROP COLUMN filters,
    DROP COLUMN headers,
    DROP COLUMN rate_limit_per_second,
    DROP COLUMN disabled_reason,
    DROP COLUMN disabled_at;
