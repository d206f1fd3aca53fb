ALTER TABLE deliveries DROP COLUMN replayed;
DROP TABLE replays;
