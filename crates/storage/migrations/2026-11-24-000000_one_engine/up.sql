-- One delivery engine. Ingest records events; dispatchers fan them out into deliveries, every
-- one listed in the delivery log from the start; a delivery whose webhook has no room waits in
-- the log as `waiting`, with its reason; every attempt is logged when it is claimed, before its
-- request is sent, and its outcome filled in after. Stop the previous release's services before
-- this migration runs (docs/operations.md, upgrading): it removes what only they used.

-- Held deliveries of the previous release become pending deliveries, due now, in their place
-- in the log by the time they were held.
INSERT INTO deliveries
    (id, webhook_id, event_id, event, incident_id, state, next_attempt_at, created_at,
     updated_at)
SELECT gen_random_uuid(), h.webhook_id, h.event_id, e.kind, e.incident_id, 'pending', now(),
    h.held_at, now()
FROM held_deliveries h JOIN events e ON e.id = h.event_id
ON CONFLICT (event_id, webhook_id) DO NOTHING;
DROP TABLE held_deliveries;
DROP INDEX IF EXISTS deliveries_held;
ALTER TABLE deliveries DROP COLUMN IF EXISTS held;
ALTER TABLE webhooks DROP COLUMN IF EXISTS slow_until;

-- Unpublished first attempts written for the deferral queue go to the delivery queue instead.
UPDATE outbox SET topic = 'delivery' WHERE topic = 'deferred';
ALTER TABLE outbox DROP CONSTRAINT outbox_topic_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_topic_check CHECK (topic IN ('event', 'delivery'));

-- `waiting`: the next attempt is due but the webhook has no room for it; `wait_reason` says why.
-- `attempting_until`: the lease of the automatic attempt under way, if any.
ALTER TABLE deliveries DROP CONSTRAINT deliveries_state_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_state_check
    CHECK (state IN ('pending', 'waiting', 'retrying', 'succeeded', 'failed'));
ALTER TABLE deliveries ADD COLUMN wait_reason text CHECK (wait_reason IN ('webhook_busy'));
ALTER TABLE deliveries ADD COLUMN attempting_until timestamptz;
DROP INDEX deliveries_due;
CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE state IN ('pending', 'retrying');
CREATE INDEX deliveries_waiting ON deliveries (webhook_id, created_at, id) WHERE state = 'waiting';

-- An attempt is logged when claimed: its outcome (success, duration) is unknown until it ends.
-- `interrupted`: the dispatcher making it stopped before it recorded the outcome.
ALTER TABLE attempts ALTER COLUMN success DROP NOT NULL;
ALTER TABLE attempts ALTER COLUMN duration_ms DROP NOT NULL;
ALTER TABLE attempts DROP CONSTRAINT attempts_error_check;
ALTER TABLE attempts ADD CONSTRAINT attempts_error_check CHECK (error IN ('timeout', 'connect',
    'dns', 'tls', 'blocked', 'http_status', 'redirect', 'interrupted', 'other'));
CREATE INDEX attempts_under_way ON attempts (started_at) WHERE success IS NULL;
