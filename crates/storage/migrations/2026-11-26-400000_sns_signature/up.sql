-- A token bound to `cloudwatch` (Amazon SNS) may require SNS's own signature of each message:
-- ingest then checks it with the certificate at the message's SigningCertURL, fetched only from
-- the hosts TOCSIN_SNS_HOSTS permits (docs/ingest.md, "Credentials").
ALTER TABLE inbound_tokens ADD COLUMN sns_signature boolean NOT NULL DEFAULT false;
ALTER TABLE inbound_tokens ADD CONSTRAINT inbound_tokens_sns_signature_check
    CHECK (NOT sns_signature OR source IS NOT DISTINCT FROM 'cloudwatch');
