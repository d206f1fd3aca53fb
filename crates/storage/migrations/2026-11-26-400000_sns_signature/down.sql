ALTER TABLE inbound_tokens DROP COLUMN sns_signature;
