-- Replays: past events given to a webhook that has no delivery of them (a new integration
-- brought up to date). Dispatchers work through each a page of events at a time, in the order
-- the events happened, keeping their place (`cursor_at`, `cursor_id`) in the same transaction
-- as the deliveries they create.
CREATE TABLE replays (
    id          uuid PRIMARY KEY,
    webhook_id  uuid NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    since       timestamptz NOT NULL,
    until       timestamptz,
    -- NULL: every kind the webhook subscribes to.
    kinds       text[],
    cursor_at   timestamptz NOT NULL,
    cursor_id   uuid NOT NULL,
    -- Deliveries created so far.
    created     bigint NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX replays_unfinished ON replays (created_at) WHERE finished_at IS NULL;

-- A replayed delivery is marked as such in the delivery log.
ALTER TABLE deliveries ADD COLUMN replayed boolean NOT NULL DEFAULT false;
