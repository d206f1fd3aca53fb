ALTER TABLE outbox DROP COLUMN held_until;
