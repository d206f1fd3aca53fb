UPDATE outbox SET topic = 'delivery' WHERE topic = 'deferred';
ALTER TABLE outbox DROP CONSTRAINT outbox_topic_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_topic_check CHECK (topic IN ('event', 'delivery'));
ALTER TABLE webhooks DROP COLUMN slow_until;
