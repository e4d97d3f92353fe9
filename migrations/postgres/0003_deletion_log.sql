-- The deletion log: what each delete removed, the client's idempotency key, and whether
-- the plant was put back. Nullable columns without defaults: adding them rewrites no row,
-- and entries from before this migration keep NULL (no snapshot, no key).
ALTER TABLE plantstore_deletions
    -- The client's Idempotency-Key, scoped to token_name: a retry with it within
    -- PLANTSTORE_IDEMPOTENCY_TTL is answered from this row.
    ADD COLUMN idempotency_key TEXT,
    -- to_jsonb of the deleted row.
    ADD COLUMN snapshot JSONB,
    ADD COLUMN restored_at TIMESTAMPTZ,
    ADD COLUMN restored_by TEXT;

-- Finds a caller's key without scanning the log; unkeyed deletes add nothing to it.
CREATE INDEX plantstore_deletions_idempotency
    ON plantstore_deletions (token_name, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
