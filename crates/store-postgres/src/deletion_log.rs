//! The deletion log: listing it, putting a deleted plant back, pruning old entries.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use plantstore_store::{
    DeletionFilter, DeletionLog, DeletionRecord, LogSize, RestoreError, StoreError,
    backend::{EntryState, column_changes},
};
use sqlx::Acquire;

use crate::{PostgresStore, announcements::announce_in, sync_replication::replicated};

#[async_trait]
impl DeletionLog for PostgresStore {
    #[tracing::instrument(skip(self))]
    async fn list_deletions(
        &self,
        filter: &DeletionFilter,
    ) -> Result<Vec<DeletionRecord>, StoreError> {
        sqlx::query_as!(
            DeletionRecord,
            r#"SELECT id, plant_id, token_name AS caller, request_id, idempotency_key,
                      deleted_at, snapshot::TEXT AS snapshot, restored_at, restored_by
               FROM plantstore_deletions
               WHERE ($1::BIGINT IS NULL OR plant_id = $1)
                 AND ($2::TEXT IS NULL OR token_name = $2)
                 AND ($3::TIMESTAMPTZ IS NULL OR deleted_at >= $3)
               ORDER BY id DESC LIMIT $4"#,
            filter.plant_id,
            filter.caller,
            filter.since,
            filter.limit,
        )
        .fetch_all(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))
    }

    #[tracing::instrument(skip(self))]
    async fn restore_deletion(&self, entry: i64, by: &str) -> Result<i64, RestoreError> {
        let db = &self.db;
        let mut conn = db.conn().await?;
        let mut tx = conn.begin().await.map_err(|err| db.error(err))?;
        // FOR UPDATE: a second restore of the same entry waits, then sees it restored.
        let found = sqlx::query_as!(
            EntryState,
            r#"SELECT plant_id, snapshot IS NOT NULL AS "has_snapshot!", restored_at, restored_by,
                      EXISTS (SELECT 1 FROM plants WHERE plants.id = log.plant_id) AS "plant_exists!"
               FROM plantstore_deletions AS log WHERE id = $1
               FOR UPDATE"#,
            entry
        )
        .fetch_optional(&mut *tx)
        .await
        .map_err(|err| db.error(err))?
        .ok_or(RestoreError::NoSuchEntry(entry))?;
        let plant_id = found.plant_id;
        found.restorable()?;
        let columns = sqlx::query!(
            r#"SELECT ARRAY(SELECT attname::TEXT FROM pg_attribute
                            WHERE attrelid = to_regclass('plants') AND attnum > 0
                              AND NOT attisdropped AND attgenerated = ''
                            ORDER BY attnum) AS "table!",
                      ARRAY(SELECT jsonb_object_keys(snapshot)) AS "held!"
               FROM plantstore_deletions WHERE id = $1"#,
            entry
        )
        .fetch_one(&mut *tx)
        .await
        .map_err(|err| db.error(err))?;
        column_changes(&columns.table, &columns.held)?;
        // OVERRIDING SYSTEM VALUE: the plant gets its own id back even where `plants.id`
        // is GENERATED ALWAYS AS IDENTITY.
        sqlx::query!(
            "INSERT INTO plants OVERRIDING SYSTEM VALUE
             SELECT * FROM jsonb_populate_record(NULL::plants,
                 (SELECT snapshot FROM plantstore_deletions WHERE id = $1))",
            entry
        )
        .execute(&mut *tx)
        .await
        .map_err(|err| RestoreError::from_insert(db.error(err)))?;
        sqlx::query!(
            "UPDATE plantstore_deletions
         SET restored_at = now(), restored_by = $2, restored_xid = pg_current_xact_id()
         WHERE id = $1",
            entry,
            by
        )
        .execute(&mut *tx)
        .await
        .map_err(|err| db.error(err))?;
        announce_in(&mut tx, &self.announcer)
            .await
            .map_err(|err| db.error(err))?;
        // A restore told "done" is one the synchronous standbys hold, as for a delete.
        replicated(db, tx.commit())
            .await
            .map_err(RestoreError::from_insert)?;
        self.news.bump();
        Ok(plant_id)
    }

    #[tracing::instrument(skip(self))]
    async fn prune_deletions(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        // An entry stays while an endpoint not disabled has yet to receive its delete or its
        // restore. `LIMIT 500` is `PRUNE_BATCH`, spelt as a literal for the reason given there.
        let done = sqlx::query!(
            "DELETE FROM plantstore_deletions WHERE id IN (
             SELECT d.id FROM plantstore_deletions d
             WHERE d.deleted_at < $1
               AND NOT EXISTS (
                   SELECT 1 FROM plantstore_webhook_endpoints e
                   WHERE e.state <> 'disabled'
                     AND ((d.xid::TEXT::BIGINT, 0::BIGINT, d.id)
                              > (e.cursor_pos, e.cursor_kind, e.cursor_id)
                          OR (d.restored_xid::TEXT::BIGINT, 1::BIGINT, d.id)
                              > (e.cursor_pos, e.cursor_kind, e.cursor_id)))
             ORDER BY d.id LIMIT 500)",
            before
        )
        .execute(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))?;
        Ok(done.rows_affected())
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn log_size(&self) -> Result<LogSize, StoreError> {
        // The lowest id is the oldest entry: ids are taken with the delete's time. The count
        // reads the whole table, which is why `/metrics` has it from a sample a minute old.
        let size = sqlx::query!(
            r#"SELECT (SELECT count(*) FROM plantstore_deletions) AS "entries!",
                      (SELECT deleted_at FROM plantstore_deletions ORDER BY id LIMIT 1) AS oldest"#
        )
        .fetch_one(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))?;
        Ok(LogSize {
            entries: size.entries,
            oldest: size.oldest,
        })
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn claim_chore(
        &self,
        name: &str,
        owner: &str,
        length: Duration,
    ) -> Result<bool, StoreError> {
        // The database's clock, not the instances': theirs may disagree.
        let held = sqlx::query_scalar!(
            "INSERT INTO plantstore_leases (name, owner, expires_at)
             VALUES ($1, $2, now() + make_interval(secs => $3))
             ON CONFLICT (name) DO UPDATE
             SET owner = excluded.owner, expires_at = excluded.expires_at
             WHERE plantstore_leases.owner = excluded.owner
                OR plantstore_leases.expires_at < now()
             RETURNING owner",
            name,
            owner,
            length.as_secs_f64()
        )
        .fetch_optional(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))?;
        Ok(held.is_some())
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn release_chore(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        sqlx::query!(
            "DELETE FROM plantstore_leases WHERE name = $1 AND owner = $2",
            name,
            owner
        )
        .execute(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))?;
        Ok(())
    }
}
