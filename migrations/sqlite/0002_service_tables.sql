-- The service's own tables, named so they cannot clash with the owner's.

-- API tokens. Only the SHA-256 of the secret half is kept; `lookup_id` is the public half
-- that finds the row before the secret is compared in constant time.
CREATE TABLE plantstore_tokens (
    name        TEXT PRIMARY KEY NOT NULL,
    lookup_id   TEXT NOT NULL UNIQUE,
    secret_hash BLOB NOT NULL,
    created_at  TEXT NOT NULL,
    expires_at  TEXT,
    revoked_at  TEXT
);

-- One row per successful delete, written in the same transaction as the delete. No foreign
-- keys: the audit must outlive both the plant and the token.
CREATE TABLE plantstore_deletions (
    id         INTEGER PRIMARY KEY,
    plant_id   INTEGER NOT NULL,
    token_name TEXT NOT NULL,
    request_id TEXT NOT NULL,
    deleted_at TEXT NOT NULL
);
