-- Back to the previous release: deliveries waiting for their incident's order are due now.
UPDATE deliveries SET state = CASE WHEN auto_attempts = 0 THEN 'pending' ELSE 'retrying' END,
    wait_reason = NULL, next_attempt_at = now()
WHERE state = 'waiting' AND wait_reason = 'ordering';
ALTER TABLE deliveries DROP CONSTRAINT deliveries_wait_reason_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_wait_reason_check
    CHECK (wait_reason IN ('webhook_busy', 'webhook_disabled', 'rate_limited'));
DROP INDEX events_by_incident;
ALTER TABLE events DROP COLUMN seq;
ALTER TABLE webhooks DROP COLUMN ordering;
