-- Deletion events: each restore's place in the event stream, and the endpoints the stream
-- is delivered to. SQLite has one writer at a time and gives ids inside the write, so a
-- delete's place is its id; a restore's is the highest id when it was written.
ALTER TABLE plantstore_deletions ADD COLUMN restored_pos INTEGER;

CREATE INDEX plantstore_deletions_restores ON plantstore_deletions (restored_pos, id)
    WHERE restored_pos IS NOT NULL;

CREATE TABLE plantstore_webhook_endpoints (
    id                INTEGER PRIMARY KEY,
    url               TEXT NOT NULL UNIQUE,
    -- A comma list: plant.deleted, plant.restored.
    events            TEXT NOT NULL,
    -- whsec_ and the base64 of the signing key.
    secret            TEXT NOT NULL,
    state             TEXT NOT NULL DEFAULT 'active'
                      CHECK (state IN ('active', 'failing', 'disabled')),
    -- Every event at or before this stream position (pos, kind, id) was delivered;
    -- kind 0 is a delete, 1 a restore.
    cursor_pos        INTEGER NOT NULL,
    cursor_kind       INTEGER NOT NULL,
    cursor_id         INTEGER NOT NULL,
    -- The deletion log id of the last event delivered, as `webhooks list` shows it.
    delivered_through INTEGER,
    last_error        TEXT,
    next_attempt_at   TEXT,
    -- Raised by `replay` and `enable`, so the instance delivering starts over from the cursor.
    generation        INTEGER NOT NULL DEFAULT 0,
    -- The one instance delivering to it, until lease_until unless it renews.
    lease_owner       TEXT,
    lease_until       TEXT,
    created_at        TEXT NOT NULL
);
