-- A dispatcher that finds a webhook slow at its in-flight limit marks it until a time: while
-- marked, the first attempts of its new deliveries are written for the deferral queue (outbox
-- topic 'deferred') instead of the delivery queue, where each would be taken only to be
-- deferred there.
ALTER TABLE webhooks ADD COLUMN slow_until timestamptz;
ALTER TABLE outbox DROP CONSTRAINT outbox_topic_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_topic_check
    CHECK (topic IN ('event', 'delivery', 'deferred'));
