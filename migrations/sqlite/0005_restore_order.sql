-- The order of restores that share a place in the event stream. Restores written between
-- the same two deletes share a restored_pos; ordered by entry id, a later restore of an
-- older entry sat behind an endpoint's cursor and was never delivered. restored_seq counts
-- restores as they are written (one writer, so in commit order). Entries restored before
-- keep their id, the order their cursors were saved in; new restores count on from above.
ALTER TABLE plantstore_deletions ADD COLUMN restored_seq INTEGER;

UPDATE plantstore_deletions SET restored_seq = id WHERE restored_pos IS NOT NULL;

DROP INDEX plantstore_deletions_restores;
CREATE INDEX plantstore_deletions_restores ON plantstore_deletions (restored_pos, restored_seq)
    WHERE restored_pos IS NOT NULL;
