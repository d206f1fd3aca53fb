-- A token bound to an alert source: ingest reads its bodies as that source (docs/ingest.md,
-- "Alert sources"). NULL: the body's format is detected, as before. The names are
-- `tocsin_domain::alerts::AlertFormat`'s; a test holds this list to it.
ALTER TABLE inbound_tokens ADD COLUMN source text CHECK (source IN ('alertmanager', 'grafana',
    'pagerduty', 'generic', 'cloudwatch', 'azure', 'google', 'sentry', 'datadog', 'newrelic',
    'kibana', 'zabbix', 'uptimekuma', 'opsgenie'));

-- Credentials a sender that cannot send `Authorization: Bearer` may use instead, each an opt-in
-- of the token: HTTP basic authentication with the token as password (user-info in the URL),
-- and the token in the `token` query parameter.
ALTER TABLE inbound_tokens ADD COLUMN basic_auth boolean NOT NULL DEFAULT false;
ALTER TABLE inbound_tokens ADD COLUMN query_token boolean NOT NULL DEFAULT false;

-- The secret a signing source signs its bodies with (Sentry's client secret): when set, a body
-- without a valid signature is refused. Ingest needs the secret itself to check an HMAC, so it
-- is kept as given; the API never shows it.
ALTER TABLE inbound_tokens ADD COLUMN signing_secret text;
ALTER TABLE inbound_tokens ADD CONSTRAINT inbound_tokens_signing_secret_check
    CHECK (signing_secret IS NULL OR source IS NOT DISTINCT FROM 'sentry');
