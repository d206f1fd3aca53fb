ALTER TABLE deliveries DROP COLUMN manual_requested;
