-- An outbox row that ingest hands straight to its own relay at commit is held from every
-- relay's claim until `held_until`: the relay it was handed to publishes it without reading it
-- back, and should that process stop before marking it published, any relay claims it once the
-- hold is over (docs/architecture.md, "hand-over").
ALTER TABLE outbox ADD COLUMN held_until timestamptz;
