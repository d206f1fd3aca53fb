-- Tocsin's tables. See docs/architecture.md for the data flow they serve.

CREATE TABLE incidents (
    id           uuid PRIMARY KEY,
    dedup_key    text NOT NULL,
    title        text NOT NULL,
    severity     text NOT NULL CHECK (severity IN ('SEV1', 'SEV2', 'SEV3', 'SEV4', 'SEV5')),
    status       text NOT NULL CHECK (status IN ('triggered', 'acknowledged', 'investigating', 'mitigated', 'resolved')),
    source       text,
    description  text,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    resolved_at  timestamptz
);
-- At most one open incident per key: concurrent alerts with a new key open one incident.
CREATE UNIQUE INDEX incidents_open_dedup_key ON incidents (dedup_key) WHERE status <> 'resolved';
CREATE INDEX incidents_by_time ON incidents (created_at DESC, id DESC);
CREATE INDEX incidents_by_status ON incidents (status, created_at DESC, id DESC);

-- Every event, with the exact body sent to targets (the same on every attempt).
CREATE TABLE events (
    id                uuid PRIMARY KEY,
    kind              text NOT NULL,
    incident_id       uuid NOT NULL,
    occurred_at       timestamptz NOT NULL,
    body              text NOT NULL,
    -- Set for a test event: only this webhook receives it.
    test_webhook_id   uuid
);
CREATE INDEX events_by_time ON events (occurred_at);

-- Transactional outbox: written in the same transaction as the change, published by the relay.
CREATE TABLE outbox (
    id            bigserial PRIMARY KEY,
    topic         text NOT NULL CHECK (topic IN ('event', 'delivery')),
    headers       jsonb NOT NULL DEFAULT '{}',
    payload       bytea NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;
CREATE INDEX outbox_published ON outbox (published_at) WHERE published_at IS NOT NULL;

CREATE TABLE webhooks (
    id                          uuid PRIMARY KEY,
    name                        text NOT NULL,
    url                         text NOT NULL,
    events                      text[] NOT NULL CHECK (cardinality(events) > 0),
    max_attempts                smallint NOT NULL CHECK (max_attempts BETWEEN 1 AND 5),
    timeout_ms                  integer NOT NULL CHECK (timeout_ms BETWEEN 1000 AND 30000),
    enabled                     boolean NOT NULL DEFAULT true,
    secret                      text NOT NULL,
    -- The secret before the last rotation keeps signing until it expires.
    previous_secret             text,
    previous_secret_expires_at  timestamptz,
    created_at                  timestamptz NOT NULL,
    updated_at                  timestamptz NOT NULL,
    -- Deleted webhooks are kept so their delivery log stays readable.
    deleted_at                  timestamptz
);
CREATE INDEX webhooks_by_time ON webhooks (created_at DESC, id DESC) WHERE deleted_at IS NULL;
CREATE INDEX webhooks_subscribed ON webhooks USING gin (events) WHERE deleted_at IS NULL AND enabled;

CREATE TABLE deliveries (
    id               uuid PRIMARY KEY,
    webhook_id       uuid NOT NULL REFERENCES webhooks (id),
    event_id         uuid NOT NULL REFERENCES events (id),
    event            text NOT NULL,
    incident_id      uuid NOT NULL,
    state            text NOT NULL CHECK (state IN ('pending', 'retrying', 'succeeded', 'failed')),
    -- All attempts made, automatic and manual.
    attempt_count    integer NOT NULL DEFAULT 0,
    -- Automatic attempts made: the position in the retry schedule.
    auto_attempts    integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    UNIQUE (event_id, webhook_id)
);
CREATE INDEX deliveries_by_time ON deliveries (created_at DESC, id DESC);
CREATE INDEX deliveries_by_webhook ON deliveries (webhook_id, created_at DESC, id DESC);
CREATE INDEX deliveries_by_incident ON deliveries (incident_id, created_at DESC);
CREATE INDEX deliveries_by_state ON deliveries (state, created_at DESC, id DESC);
-- The sweeper's scan: unfinished deliveries by when they are due.
CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE state IN ('pending', 'retrying');

CREATE TABLE attempts (
    delivery_id         uuid NOT NULL REFERENCES deliveries (id) ON DELETE CASCADE,
    number              integer NOT NULL CHECK (number > 0),
    trigger             text NOT NULL CHECK (trigger IN ('automatic', 'manual')),
    started_at          timestamptz NOT NULL,
    success             boolean NOT NULL,
    status_code         integer,
    duration_ms         integer NOT NULL,
    error               text CHECK (error IN ('timeout', 'connect', 'dns', 'tls', 'blocked', 'http_status', 'redirect', 'other')),
    error_detail        text,
    request_headers     jsonb NOT NULL,
    response_body       text,
    response_truncated  boolean NOT NULL DEFAULT false,
    PRIMARY KEY (delivery_id, number)
);
CREATE INDEX attempts_by_time ON attempts (started_at);

CREATE TABLE inbound_tokens (
    id            uuid PRIMARY KEY,
    name          text NOT NULL,
    lookup        text NOT NULL UNIQUE,
    token_hash    bytea NOT NULL,
    created_at    timestamptz NOT NULL,
    last_used_at  timestamptz,
    revoked_at    timestamptz
);
