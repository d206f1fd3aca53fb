-- What users of webhook services ask for most: endpoint health and auto-disable, subscription
-- filters, custom headers and per-webhook rate limits (docs/admin-api.md, "Webhooks").

-- `filters`: {"severities": [...], "sources": [...], "labels": {...}}, each key optional; `{}`
-- receives every event it subscribes to. `headers`: {name: value} sent with every delivery.
-- `rate_limit_per_second`: at most this many automatic attempts a second (NULL: no limit).
-- `disabled_reason`, `disabled_at`: why and since when a disabled webhook is disabled.
ALTER TABLE webhooks
    ADD COLUMN filters jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN headers jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN rate_limit_per_second int4 CHECK (rate_limit_per_second BETWEEN 1 AND 10000),
    ADD COLUMN disabled_reason text,
    ADD COLUMN disabled_at timestamptz;
UPDATE webhooks SET disabled_reason = 'disabled by an operator', disabled_at = updated_at
WHERE NOT enabled AND deleted_at IS NULL;

-- The labels of the alerts that opened an incident (string values), for `filters.labels`.
ALTER TABLE incidents ADD COLUMN labels jsonb NOT NULL DEFAULT '{}'::jsonb;

-- Whether a webhook's filters let an event through: its severity is listed, its alert format
-- (the dedup key's namespace) or source name is listed, and its incident carries every label
-- pair listed. A filter left out lets everything through.
CREATE FUNCTION webhook_filters_accept(filters jsonb, severity text, dedup_key text,
    source text, labels jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT (NOT filters ? 'severities' OR filters -> 'severities' ? severity)
        AND (NOT filters ? 'sources'
            OR filters -> 'sources' ? split_part(coalesce(dedup_key, ''), ':', 1)
            OR (source IS NOT NULL AND filters -> 'sources' ? source))
        AND (NOT filters ? 'labels' OR coalesce(labels, '{}'::jsonb) @> (filters -> 'labels'))
$$;

-- A webhook's health, kept up to date by every recorded attempt outcome (interrupted attempts
-- are the dispatcher's, not the target's, and do not count): read without scanning attempts.
-- `failing_since`: the first failure after the last success (NULL while the latest outcome is
-- a success); auto-disable measures from it.
CREATE TABLE webhook_health (
    webhook_id uuid PRIMARY KEY REFERENCES webhooks (id),
    consecutive_failures int4 NOT NULL DEFAULT 0,
    failing_since timestamptz,
    last_success_at timestamptz,
    last_failure_at timestamptz,
    last_error text
);

-- Attempt outcomes per webhook in five-minute buckets, for the 1 h and 24 h success rates.
CREATE TABLE webhook_outcomes (
    webhook_id uuid NOT NULL REFERENCES webhooks (id),
    bucket timestamptz NOT NULL,
    successes int4 NOT NULL DEFAULT 0,
    failures int4 NOT NULL DEFAULT 0,
    PRIMARY KEY (webhook_id, bucket)
);

-- The shared budget of a rate-limited webhook: the earliest time its next automatic attempt
-- may start without exceeding `rate_limit_per_second` (a generic cell-rate algorithm with one
-- second of burst). Every dispatcher claims attempts through it, so the limit holds across
-- any number of them. One row per webhook, made with it.
CREATE TABLE webhook_rate_budgets (
    webhook_id uuid PRIMARY KEY REFERENCES webhooks (id),
    next_free_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO webhook_rate_budgets (webhook_id) SELECT id FROM webhooks;

-- Waiting for a reason of the webhook's: `webhook_disabled` (made while it was disabled; sent
-- by "recover since" once it is enabled again) and `rate_limited` (due again at
-- `next_attempt_at`).
ALTER TABLE deliveries DROP CONSTRAINT deliveries_wait_reason_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_wait_reason_check
    CHECK (wait_reason IN ('webhook_busy', 'webhook_disabled', 'rate_limited'));
