-- One press of Retry, one request: a manual attempt is claimed only while its delivery has a
-- manual attempt asked for (`manual_requested`), and the claim clears it, so that a manual
-- message redelivered by the broker or published twice by the relay sends nothing more.
-- Manual messages already in the queues when this migration runs find the mark unset and are
-- refused: ask for those retries again.
ALTER TABLE deliveries ADD COLUMN manual_requested boolean NOT NULL DEFAULT false;

-- `not_sent`: a claimed attempt that had no room to be sent within its lease; no request was made.
ALTER TABLE attempts DROP CONSTRAINT attempts_error_check;
ALTER TABLE attempts ADD CONSTRAINT attempts_error_check CHECK (error IN ('timeout', 'connect',
    'dns', 'tls', 'blocked', 'http_status', 'redirect', 'interrupted', 'not_sent', 'other'));
