-- Admin keys: named bearer keys with one role each (docs/people.md). As with inbound tokens,
-- only the public lookup part and a SHA-256 hash of the key are kept; the key is shown once.
CREATE TABLE admin_keys (
    id uuid PRIMARY KEY,
    name text NOT NULL,
    role text NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    lookup text NOT NULL UNIQUE,
    key_hash bytea NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz,
    last_used_at timestamptz,
    revoked_at timestamptz
);
CREATE INDEX admin_keys_listed ON admin_keys (created_at DESC, id DESC);

-- The audit log: every change and every reveal of a secret, whoever made it and through
-- whichever surface. Rows are only ever added (and removed by its own retention): the API has
-- no way to change or delete them, and `before`/`after` never hold a secret.
CREATE TABLE audit_log (
    id uuid PRIMARY KEY,
    created_at timestamptz NOT NULL,
    -- `key` (an admin key: actor_id is its id), `bootstrap` (TOCSIN_ADMIN_TOKEN), `oidc` (a
    -- person signed in through the identity provider) or `cli`.
    actor_kind text NOT NULL CHECK (actor_kind IN ('key', 'bootstrap', 'oidc', 'cli')),
    actor_id uuid,
    actor_name text NOT NULL,
    -- `api`, `pages` or `cli`.
    surface text NOT NULL CHECK (surface IN ('api', 'pages', 'cli')),
    address text,
    user_agent text,
    action text NOT NULL,
    resource_type text NOT NULL,
    resource_id text,
    before jsonb,
    after jsonb
);
CREATE INDEX audit_log_listed ON audit_log (created_at DESC, id DESC);
CREATE INDEX audit_log_by_resource ON audit_log (resource_type, resource_id, created_at DESC);
CREATE INDEX audit_log_by_actor ON audit_log (actor_id, created_at DESC);
