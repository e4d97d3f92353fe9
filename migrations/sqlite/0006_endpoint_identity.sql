-- Webhook endpoints: ids are never reused, a secret can be rotated with an overlap, and a
-- plain-http receiver can be spoken to in HTTP/2.
--
-- An INTEGER PRIMARY KEY takes the highest rowid + 1, so removing the newest endpoint and
-- adding another gave the new one the removed one's id, and a running delivery went on
-- posting the new endpoint's events to the removed URL. AUTOINCREMENT never hands out an
-- id twice. SQLite cannot add it to a table, so the table is rebuilt; the ids kept are
-- copied, and sqlite_sequence starts above the highest of them.
CREATE TABLE plantstore_webhook_endpoints_new (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    url               TEXT NOT NULL UNIQUE,
    -- A comma list: plant.deleted, plant.restored.
    events            TEXT NOT NULL,
    -- whsec_ and the base64 of the signing key.
    secret            TEXT NOT NULL,
    -- The secret before the last `rotate-secret`: requests are signed with it too until
    -- previous_secret_until, so a receiver can switch without losing an event.
    previous_secret       TEXT,
    previous_secret_until TEXT,
    -- HTTP/2 with prior knowledge on a plain-http URL (`webhooks add --http2`); https
    -- receivers choose HTTP/2 or HTTP/1.1 themselves, by ALPN.
    http2             INTEGER NOT NULL DEFAULT 0 CHECK (http2 IN (0, 1)),
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

INSERT INTO plantstore_webhook_endpoints_new
    (id, url, events, secret, state, cursor_pos, cursor_kind, cursor_id, delivered_through,
     last_error, next_attempt_at, generation, lease_owner, lease_until, created_at)
SELECT id, url, events, secret, state, cursor_pos, cursor_kind, cursor_id, delivered_through,
       last_error, next_attempt_at, generation, lease_owner, lease_until, created_at
FROM plantstore_webhook_endpoints;

DROP TABLE plantstore_webhook_endpoints;
ALTER TABLE plantstore_webhook_endpoints_new RENAME TO plantstore_webhook_endpoints;
