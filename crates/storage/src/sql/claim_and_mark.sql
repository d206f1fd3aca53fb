-- Claims up to $1 unpublished outbox rows from id $3 on, oldest first, skipping rows another
-- relay holds and rows handed over to their writer's relay (`held_until`, until it is over),
-- and marks them published at $2 in the same statement. The relay starts most claims at its
-- floor (`relay.rs`): a row marked published leaves its entry in the index of unpublished
-- rows until a vacuum, and a claim from the first row visited every one of them.
UPDATE outbox SET published_at = $2, held_until = NULL
WHERE id IN (
    SELECT id FROM outbox
    WHERE published_at IS NULL AND id >= $3 AND (held_until IS NULL OR held_until < $2)
    ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
)
RETURNING id, topic, headers, payload
