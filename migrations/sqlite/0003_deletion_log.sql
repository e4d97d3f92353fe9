-- The deletion log: what each delete removed, the client's idempotency key, and whether
-- the plant was put back. Columns are added, never rewritten: entries from before this
-- migration keep NULL (no snapshot, no key).

-- The client's Idempotency-Key, scoped to token_name: a retry with it within
-- PLANTSTORE_IDEMPOTENCY_TTL is answered from this row.
ALTER TABLE plantstore_deletions ADD COLUMN idempotency_key TEXT;
-- The deleted row as a JSON object of its columns (a BLOB as {"blob": "<hex>"}).
ALTER TABLE plantstore_deletions ADD COLUMN snapshot TEXT;
ALTER TABLE plantstore_deletions ADD COLUMN restored_at TEXT;
ALTER TABLE plantstore_deletions ADD COLUMN restored_by TEXT;

-- Finds a caller's key without scanning the log; unkeyed deletes add nothing to it.
CREATE INDEX plantstore_deletions_idempotency
    ON plantstore_deletions (token_name, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
