-- Deletion events: each log entry's place in the event stream, and the endpoints the stream
-- is delivered to.

-- Ids are taken before a transaction commits, so they do not follow commit order: a reader
-- going by id skips entries that commit late. A transaction's id (xid) does, once every
-- transaction older than the reader's snapshot has ended; the stream is read in
-- (xid, id) order up to that horizon. Added without a default, then given one: a volatile
-- default on ADD COLUMN would rewrite the whole log under an exclusive lock, stopping
-- deletes for as long. Entries from before keep NULL: they are no events.
ALTER TABLE plantstore_deletions
    ADD COLUMN xid xid8,
    -- The restore's transaction: a restore is an event of its own, after its delete.
    ADD COLUMN restored_xid xid8;
ALTER TABLE plantstore_deletions ALTER COLUMN xid SET DEFAULT pg_current_xact_id();

CREATE INDEX plantstore_deletions_stream ON plantstore_deletions (xid, id);
CREATE INDEX plantstore_deletions_restores ON plantstore_deletions (restored_xid, id)
    WHERE restored_xid IS NOT NULL;

CREATE TABLE plantstore_webhook_endpoints (
    id                BIGSERIAL PRIMARY KEY,
    url               TEXT NOT NULL UNIQUE,
    -- A comma list: plant.deleted, plant.restored.
    events            TEXT NOT NULL,
    -- whsec_ and the base64 of the signing key.
    secret            TEXT NOT NULL,
    state             TEXT NOT NULL DEFAULT 'active'
                      CHECK (state IN ('active', 'failing', 'disabled')),
    -- Every event at or before this stream position (pos, kind, id) was delivered;
    -- kind 0 is a delete, 1 a restore.
    cursor_pos        BIGINT NOT NULL,
    cursor_kind       BIGINT NOT NULL,
    cursor_id         BIGINT NOT NULL,
    -- The deletion log id of the last event delivered, as `webhooks list` shows it.
    delivered_through BIGINT,
    last_error        TEXT,
    next_attempt_at   TIMESTAMPTZ,
    -- Raised by `replay` and `enable`, so the instance delivering starts over from the cursor.
    generation        BIGINT NOT NULL DEFAULT 0,
    -- The one instance delivering to it, until lease_until unless it renews.
    lease_owner       TEXT,
    lease_until       TIMESTAMPTZ,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);
