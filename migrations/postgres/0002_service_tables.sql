-- The service's own tables, named so they cannot clash with the owner's.

-- API tokens. Only the SHA-256 of the secret half is kept; `lookup_id` is the public half
-- that finds the row before the secret is compared in constant time.
CREATE TABLE plantstore_tokens (
    name        TEXT PRIMARY KEY,
    lookup_id   TEXT NOT NULL UNIQUE,
    secret_hash BYTEA NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    expires_at  TIMESTAMPTZ,
    revoked_at  TIMESTAMPTZ
);

-- One row per successful delete, written in the same transaction as the delete. No foreign
-- keys: the audit must outlive both the plant and the token.
CREATE TABLE plantstore_deletions (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    plant_id   BIGINT NOT NULL,
    token_name TEXT NOT NULL,
    request_id TEXT NOT NULL,
    deleted_at TIMESTAMPTZ NOT NULL
);
