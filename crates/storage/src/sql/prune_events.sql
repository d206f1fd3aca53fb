-- Deletes up to $2 events that occurred before $1, that no delivery refers to and that no
-- unpublished outbox row is still to publish.
DELETE FROM events WHERE id IN (
    SELECT e.id FROM events e
    WHERE e.occurred_at < $1
      AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.id)
      AND NOT EXISTS (
          SELECT 1 FROM outbox o
          WHERE o.published_at IS NULL AND o.topic = 'event'
            AND convert_from(o.payload, 'UTF8')::jsonb ->> 'event_id' = e.id::text)
    LIMIT $2 FOR UPDATE SKIP LOCKED)
