//! The deletion log: listing it, putting a deleted plant back, pruning old entries.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use plantstore_store::{
    DeletionFilter, DeletionLog, DeletionRecord, LogSize, RestoreError, StoreError,
    backend::{EntryState, column_changes},
    time::{LAST_STORABLE_TIME, storable_after},
};
use sqlx::{Connection, SqliteConnection};

use crate::{SqliteStore, errors::classify, snapshot};

#[async_trait]
impl DeletionLog for SqliteStore {
    #[tracing::instrument(skip(self))]
    async fn list_deletions(
        &self,
        filter: &DeletionFilter,
    ) -> Result<Vec<DeletionRecord>, StoreError> {
        sqlx::query_as!(
            DeletionRecord,
            r#"SELECT id AS "id!: i64", plant_id AS "plant_id!: i64", token_name AS caller,
                      request_id, idempotency_key, deleted_at AS "deleted_at!: DateTime<Utc>",
                      snapshot, restored_at AS "restored_at?: DateTime<Utc>", restored_by
               FROM plantstore_deletions
               WHERE (?1 IS NULL OR plant_id = ?1) AND (?2 IS NULL OR token_name = ?2)
                 AND (?3 IS NULL OR deleted_at >= ?3)
               ORDER BY id DESC LIMIT ?4"#,
            filter.plant_id,
            filter.caller,
            filter.since,
            filter.limit,
        )
        .fetch_all(&self.readers)
        .await
        .map_err(classify)
    }

    #[tracing::instrument(skip(self))]
    async fn restore_deletion(&self, entry: i64, by: &str) -> Result<i64, RestoreError> {
        let mut turn = self.write_connection.lock().await?;
        let restored = restore_entry(turn.conn()?, entry, by).await;
        match restored {
            Ok(_) => self.news.bump(),
            Err(RestoreError::Store(_)) => turn.discard().await,
            Err(_) => {}
        }
        restored
    }

    #[tracing::instrument(skip(self))]
    async fn prune_deletions(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        // An entry stays while an endpoint not disabled has yet to receive its delete or its
        // restore. While any endpoint exists, the newest entry and the latest restored stay
        // too: new ids and restored_seqs follow the highest, and going back would put new
        // events behind the cursors. `LIMIT 500` is `PRUNE_BATCH` (the reason is given there).
        let done = sqlx::query!(
            "DELETE FROM plantstore_deletions WHERE id IN (
             SELECT d.id FROM plantstore_deletions AS d
             WHERE d.deleted_at < ?1
               AND ((d.id < (SELECT MAX(id) FROM plantstore_deletions)
                     AND (d.restored_seq IS NULL
                          OR d.restored_seq < (SELECT MAX(restored_seq) FROM plantstore_deletions)))
                    OR NOT EXISTS (SELECT 1 FROM plantstore_webhook_endpoints))
               AND NOT EXISTS (
                   SELECT 1 FROM plantstore_webhook_endpoints e
                   WHERE e.state <> 'disabled'
                     AND ((d.id, 0, d.id) > (e.cursor_pos, e.cursor_kind, e.cursor_id)
                          OR (d.restored_pos, 1, d.restored_seq)
                             > (e.cursor_pos, e.cursor_kind, e.cursor_id)))
             ORDER BY d.id LIMIT 500)",
            before
        )
        .execute(self.write_connection.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        Ok(done.rows_affected())
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn log_size(&self) -> Result<LogSize, StoreError> {
        // The lowest id is the oldest entry: ids are given in commit order, with the time.
        let size = sqlx::query!(
            r#"SELECT (SELECT count(*) FROM plantstore_deletions) AS "entries!: i64",
                      (SELECT deleted_at FROM plantstore_deletions ORDER BY id LIMIT 1)
                          AS "oldest?: DateTime<Utc>""#
        )
        .fetch_one(&self.readers)
        .await
        .map_err(classify)?;
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
        let now = Utc::now();
        let until = storable_after(now, length).unwrap_or(LAST_STORABLE_TIME);
        let held = sqlx::query_scalar!(
            "INSERT INTO plantstore_leases (name, owner, expires_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (name) DO UPDATE
             SET owner = excluded.owner, expires_at = excluded.expires_at
             WHERE plantstore_leases.owner = excluded.owner
                OR plantstore_leases.expires_at < ?4
             RETURNING owner",
            name,
            owner,
            until,
            now
        )
        .fetch_optional(self.write_connection.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        Ok(held.is_some())
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn release_chore(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        sqlx::query!(
            "DELETE FROM plantstore_leases WHERE name = ?1 AND owner = ?2",
            name,
            owner
        )
        .execute(self.write_connection.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        Ok(())
    }
}

/// Every refusal leaves `plants` and the entry as they were.
async fn restore_entry(
    conn: &mut SqliteConnection,
    entry: i64,
    by: &str,
) -> Result<i64, RestoreError> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(classify)?;
    let found = sqlx::query_as!(
        EntryState,
        r#"SELECT plant_id AS "plant_id!: i64", snapshot IS NOT NULL AS "has_snapshot!: bool",
                  restored_at AS "restored_at?: DateTime<Utc>", restored_by,
                  EXISTS (SELECT 1 FROM plants WHERE plants.id = log.plant_id) AS "plant_exists!: bool"
           FROM plantstore_deletions AS log WHERE id = ?"#,
        entry
    )
    .fetch_optional(&mut *tx)
    .await
    .map_err(classify)?
    .ok_or(RestoreError::NoSuchEntry(entry))?;
    let plant_id = found.plant_id;
    found.restorable()?;
    let table = snapshot::table_columns(&mut tx).await?;
    // Read by SQLite, not serde_json: SQLite writes an infinite REAL as 9e999, which
    // serde_json refuses as out of range.
    let held = sqlx::query_scalar!(
        r#"SELECT '' || entry.key AS "key!: String"
           FROM plantstore_deletions AS log, json_each(log.snapshot) AS entry
           WHERE log.id = ?"#,
        entry
    )
    .fetch_all(&mut *tx)
    .await
    .map_err(classify)?;
    column_changes(&table, &held)?;
    snapshot::insert_from_snapshot(&table, entry)
        .execute(&mut *tx)
        .await
        .map_err(|err| RestoreError::from_insert(classify(err)))?;
    sqlx::query!(
        "UPDATE plantstore_deletions
         SET restored_at = ?, restored_by = ?,
             restored_pos = (SELECT MAX(id) FROM plantstore_deletions),
             restored_seq = (SELECT COALESCE(MAX(restored_seq), 0) + 1 FROM plantstore_deletions)
         WHERE id = ?",
        Utc::now(),
        by,
        entry
    )
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    tx.commit()
        .await
        .map_err(|err| RestoreError::from_insert(classify(err)))?;
    Ok(plant_id)
}
