-- Ordered delivery per incident (a webhook's `ordering`: `none`, the default, or `incident`).
ALTER TABLE webhooks ADD COLUMN ordering text NOT NULL DEFAULT 'none'
    CHECK (ordering IN ('none', 'incident'));

-- The order of an incident's changes: each event takes the next number when it is recorded,
-- under its incident's row lock, so numbers follow the incident's changes whatever clock the
-- services read. Events recorded before this migration have none (NULL) and order before every
-- numbered one, by id. Set as a default only: no table rewrite.
CREATE SEQUENCE events_seq AS bigint;
ALTER TABLE events ADD COLUMN seq bigint;
ALTER TABLE events ALTER COLUMN seq SET DEFAULT nextval('events_seq');
ALTER SEQUENCE events_seq OWNED BY events.seq;
-- The fan-out of an ordered webhook reads an incident's earlier events.
CREATE INDEX events_by_incident ON events (incident_id, seq);

-- `ordering`: waiting for the delivery of the incident's previous event to the same webhook.
ALTER TABLE deliveries DROP CONSTRAINT deliveries_wait_reason_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_wait_reason_check
    CHECK (wait_reason IN ('webhook_busy', 'webhook_disabled', 'rate_limited', 'ordering'));
