-- Back to the previous release's schema. Waiting deliveries become pending; attempts still
-- under way are recorded as failed with no answer.
DROP INDEX attempts_under_way;
UPDATE attempts SET success = false, duration_ms = 0, error = 'other',
    error_detail = 'under way when the schema was rolled back'
WHERE success IS NULL;
UPDATE attempts SET error = 'other' WHERE error = 'interrupted';
ALTER TABLE attempts DROP CONSTRAINT attempts_error_check;
ALTER TABLE attempts ADD CONSTRAINT attempts_error_check CHECK (error IN ('timeout', 'connect',
    'dns', 'tls', 'blocked', 'http_status', 'redirect', 'other'));
ALTER TABLE attempts ALTER COLUMN success SET NOT NULL;
ALTER TABLE attempts ALTER COLUMN duration_ms SET NOT NULL;

DROP INDEX deliveries_waiting;
DROP INDEX deliveries_due;
UPDATE deliveries SET state = CASE WHEN auto_attempts = 0 THEN 'pending' ELSE 'retrying' END,
    next_attempt_at = now()
WHERE state = 'waiting';
ALTER TABLE deliveries DROP COLUMN attempting_until;
ALTER TABLE deliveries DROP COLUMN wait_reason;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_state_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_state_check
    CHECK (state IN ('pending', 'retrying', 'succeeded', 'failed'));
CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE state IN ('pending', 'retrying');

ALTER TABLE outbox DROP CONSTRAINT outbox_topic_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_topic_check
    CHECK (topic IN ('event', 'delivery', 'deferred'));
ALTER TABLE webhooks ADD COLUMN slow_until timestamptz;
ALTER TABLE deliveries ADD COLUMN held boolean NOT NULL DEFAULT false;
CREATE INDEX deliveries_held ON deliveries (webhook_id, next_attempt_at) WHERE held;
CREATE TABLE held_deliveries (
    webhook_id  uuid NOT NULL,
    event_id    uuid NOT NULL,
    held_at     timestamptz NOT NULL,
    PRIMARY KEY (webhook_id, event_id)
);
