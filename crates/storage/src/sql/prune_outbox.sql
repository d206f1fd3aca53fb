-- Deletes up to $2 outbox rows published before $1, oldest first. Ordered by the index of
-- published rows, the batch is read from that index's start, and deleted by key (an array),
-- at any size of the table: a plan made while it was small read the whole table.
DELETE FROM outbox WHERE id = ANY (ARRAY(
    SELECT id FROM outbox
    WHERE published_at IS NOT NULL AND published_at < $1
    ORDER BY published_at
    LIMIT $2 FOR UPDATE SKIP LOCKED))
