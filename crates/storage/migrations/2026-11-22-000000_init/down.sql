DROP TABLE inbound_tokens;
DROP TABLE attempts;
DROP TABLE deliveries;
DROP TABLE webhooks;
DROP TABLE outbox;
DROP TABLE events;
DROP TABLE incidents;
