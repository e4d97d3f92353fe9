-- The owner's table: created only when absent, so an existing `plants` with more columns
-- and foreign keys is left exactly as it is. The service only ever touches `plants.id`.
CREATE TABLE IF NOT EXISTS plants (
    id   INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    tag  TEXT
);
