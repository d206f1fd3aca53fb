-- Deletes up to $2 outbox rows published before $1.
DELETE FROM outbox WHERE id IN (
    SELECT id FROM outbox
    WHERE published_at IS NOT NULL AND published_at < $1
    LIMIT $2 FOR UPDATE SKIP LOCKED)
