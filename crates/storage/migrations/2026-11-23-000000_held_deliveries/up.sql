-- A delivery created while its webhook is marked slow is held: it waits in PostgreSQL, with no
-- outbox row and no broker message, until the mark lapses and a dispatcher releases it (clears
-- `held` and enqueues its first attempt). The partial index serves the release pass; it holds
-- only the rows waiting. A constant default adds the column without rewriting the table; the
-- index build scans it, so on a large table build the index first with
-- `CREATE INDEX CONCURRENTLY` (docs/operations.md), and this statement finds it.
ALTER TABLE deliveries ADD COLUMN IF NOT EXISTS held boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS deliveries_held ON deliveries (webhook_id, next_attempt_at) WHERE held;
