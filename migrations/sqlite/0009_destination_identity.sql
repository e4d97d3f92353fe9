-- What must be unique is what two destinations would contend for: a webhook endpoint's
-- URL, and a stream destination's server with its stream and subject prefix. The URL
-- alone was unique, which refused a second stream or prefix on one server.
--
-- SQLite cannot drop a column's UNIQUE, so the table is rebuilt, its ids and its
-- AUTOINCREMENT counter kept (an id is never handed out twice). plantstore_stream_subjects
-- refers to it, so its rows are set aside and put back: dropping the old table would
-- otherwise delete them with it.
CREATE TABLE plantstore_webhook_endpoints_new (
    id                    INTEGER PRIMARY KEY AUTOINCREMENT,
    url                   TEXT NOT NULL,
    events                TEXT NOT NULL,
    secret                TEXT NOT NULL,
    previous_secret       TEXT,
    previous_secret_until TEXT,
    http2                 INTEGER NOT NULL DEFAULT 0 CHECK (http2 IN (0, 1)),
    state                 TEXT NOT NULL DEFAULT 'active'
                          CHECK (state IN ('active', 'failing', 'disabled')),
    cursor_pos            INTEGER NOT NULL,
    cursor_kind           INTEGER NOT NULL,
    cursor_id             INTEGER NOT NULL,
    delivered_through     INTEGER,
    last_error            TEXT,
    next_attempt_at       TEXT,
    generation            INTEGER NOT NULL DEFAULT 0,
    lease_owner           TEXT,
    lease_until           TEXT,
    created_at            TEXT NOT NULL,
    kind                  TEXT NOT NULL DEFAULT 'webhook' CHECK (kind IN ('webhook', 'nats')),
    stream                TEXT,
    subject_prefix        TEXT
);

INSERT INTO plantstore_webhook_endpoints_new
    (id, url, events, secret, previous_secret, previous_secret_until, http2, state,
     cursor_pos, cursor_kind, cursor_id, delivered_through, last_error, next_attempt_at,
     generation, lease_owner, lease_until, created_at, kind, stream, subject_prefix)
SELECT id, url, events, secret, previous_secret, previous_secret_until, http2, state,
       cursor_pos, cursor_kind, cursor_id, delivered_through, last_error, next_attempt_at,
       generation, lease_owner, lease_until, created_at, kind, stream, subject_prefix
FROM plantstore_webhook_endpoints;

DELETE FROM sqlite_sequence WHERE name = 'plantstore_webhook_endpoints_new';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'plantstore_webhook_endpoints_new', seq FROM sqlite_sequence
WHERE name = 'plantstore_webhook_endpoints';

CREATE TEMP TABLE plantstore_stream_subjects_kept AS SELECT * FROM plantstore_stream_subjects;
DROP TABLE plantstore_stream_subjects;
DROP TABLE plantstore_webhook_endpoints;
ALTER TABLE plantstore_webhook_endpoints_new RENAME TO plantstore_webhook_endpoints;

CREATE UNIQUE INDEX plantstore_webhook_endpoints_destination
    ON plantstore_webhook_endpoints (url, COALESCE(stream, ''), COALESCE(subject_prefix, ''));

-- As migration 0007 made it.
CREATE TABLE plantstore_stream_subjects (
    endpoint_id INTEGER NOT NULL REFERENCES plantstore_webhook_endpoints (id) ON DELETE CASCADE,
    plant_id    INTEGER NOT NULL,
    stream_seq  INTEGER NOT NULL,
    pos         INTEGER NOT NULL,
    kind        INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    PRIMARY KEY (endpoint_id, plant_id)
);
INSERT INTO plantstore_stream_subjects SELECT * FROM temp.plantstore_stream_subjects_kept;
DROP TABLE temp.plantstore_stream_subjects_kept;
