-- Leases on the service's own chores, such as keeping the deletion log to its retention:
-- the one instance doing each, until expires_at unless it renews.
CREATE TABLE plantstore_leases (
    name       TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
