ALTER TABLE inbound_tokens
    DROP COLUMN signing_secret,
    DROP COLUMN query_token,
    DROP COLUMN basic_auth,
    DROP COLUMN source;
