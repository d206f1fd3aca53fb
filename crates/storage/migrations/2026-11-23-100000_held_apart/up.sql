-- Held deliveries move out of `deliveries` into a narrow table of their own. While a dispatcher
-- has a webhook marked slow, each new event for it is one row here: the pair and when it was
-- held, one index, no foreign keys. A row of `deliveries` carries eight indexes, and a hanging
-- webhook's rows took that cost from the healthy webhooks' deliveries on the same database
-- (docs/performance.md, eighth round). The release turns these rows into pending deliveries.
CREATE TABLE IF NOT EXISTS held_deliveries (
    webhook_id  uuid NOT NULL,
    event_id    uuid NOT NULL,
    held_at     timestamptz NOT NULL,
    PRIMARY KEY (webhook_id, event_id)
);
-- Held rows never attempted move over, in one statement: a row that the previous release's pods
-- commit meanwhile is neither moved nor deleted. `deliveries.held` and its index stay for those
-- pods during the rollout (expand, then contract a release later): a held row that such a pod
-- writes, or one attempted while held, is an ordinary overdue delivery to this release, which
-- the sweeper enqueues once its mark has lapsed (docs/operations.md).
WITH moved AS (
    DELETE FROM deliveries WHERE held AND state = 'pending' AND attempt_count = 0
    RETURNING webhook_id, event_id, created_at
)
INSERT INTO held_deliveries (webhook_id, event_id, held_at)
SELECT webhook_id, event_id, created_at FROM moved
ON CONFLICT DO NOTHING;
