-- Moves pending or retrying deliveries ($1 ids, $2 the automatic attempts the caller saw made)
-- to `waiting` for reason $3, unless they moved on meanwhile or an attempt is under way.
UPDATE deliveries d SET state = 'waiting', wait_reason = $3, updated_at = now()
FROM unnest($1::uuid[], $2::int4[]) AS v(id, auto_attempts)
-- Found by key; `IS TRUE` keeps the planner off the partial index `deliveries_due` (see
-- `SESSION_SETTINGS`).
WHERE d.id = v.id AND (d.state IN ('pending', 'retrying')) IS TRUE
    -- The least and the greatest id: only their day partitions are read (see `claim.sql`).
    AND d.id BETWEEN $4 AND $5
    AND d.auto_attempts = v.auto_attempts AND d.attempting_until IS NULL
RETURNING d.id
