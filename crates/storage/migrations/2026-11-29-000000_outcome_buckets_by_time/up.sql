-- Outcome buckets are pruned oldest first (`sql/prune_outcome_buckets.sql`): by this index, a
-- prune reads only what it deletes, at any number of webhooks.
CREATE INDEX webhook_outcomes_by_bucket ON webhook_outcomes (bucket);
