-- Held deliveries go back into `deliveries` as held rows, which the previous release releases.
-- Run it once this release's pods are gone; the lock keeps any writer left from adding a row
-- that the copy would miss (its statement fails once the table is dropped, and is retried).
LOCK TABLE held_deliveries IN EXCLUSIVE MODE;
INSERT INTO deliveries
    (id, webhook_id, event_id, event, incident_id, state, held, next_attempt_at, created_at,
     updated_at)
SELECT gen_random_uuid(), h.webhook_id, h.event_id, e.kind, e.incident_id, 'pending', true,
    h.held_at, h.held_at, now()
FROM held_deliveries h JOIN events e ON e.id = h.event_id
ON CONFLICT (event_id, webhook_id) DO NOTHING;
DROP TABLE held_deliveries;
