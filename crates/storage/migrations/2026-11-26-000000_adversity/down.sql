ALTER TABLE deliveries DROP COLUMN manual_requested;
-- The previous release knows no `not_sent`: such attempts become `other` (no request was sent).
ALTER TABLE attempts DROP CONSTRAINT attempts_error_check;
UPDATE attempts SET error = 'other' WHERE error = 'not_sent';
ALTER TABLE attempts ADD CONSTRAINT attempts_error_check CHECK (error IN ('timeout', 'connect',
    'dns', 'tls', 'blocked', 'http_status', 'redirect', 'interrupted', 'other'));
