-- Claims up to $1 unpublished outbox rows, oldest first, skipping rows another relay holds,
-- and marks them published at $2 in the same statement.
UPDATE outbox SET published_at = $2
WHERE id IN (
    SELECT id FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
)
RETURNING id, topic, headers, payload
