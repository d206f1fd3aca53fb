-- Deletes up to $2 events that occurred before $1, that no delivery refers to and that no
-- unpublished outbox row is still to publish. Oldest first, by the time index (see
-- `prune_outbox.sql`).
DELETE FROM events WHERE id = ANY (ARRAY(
    SELECT e.id FROM events e
    WHERE e.occurred_at < $1
      AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.id)
      AND NOT EXISTS (
          SELECT 1 FROM outbox o
          WHERE o.published_at IS NULL AND o.topic = 'event'
            AND convert_from(o.payload, 'UTF8')::jsonb ->> 'event_id' = e.id::text)
    ORDER BY e.occurred_at
    LIMIT $2 FOR UPDATE SKIP LOCKED))
