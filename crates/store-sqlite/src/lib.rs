//! The storage interface on an SQLite file: WAL, foreign keys on, every commit synced,
//! one writer connection and a pool of readers.

use std::{collections::HashMap, str::FromStr, sync::Arc, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use plantstore_store::{
    BatchWriter, Batcher, Deleted, Deletion, DeletionFilter, DeletionRecord, EntryState, Histogram,
    Outcome, RestoreError, SchemaFacts, Store, StoreError, StoreSettings, StoreStats, TokenRecord,
    before_now, probe, schema_verdict,
};
use sqlx::{
    Connection, Sqlite, SqliteConnection,
    pool::PoolConnection,
    sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
    },
};
use tokio::sync::{Mutex, MutexGuard};

mod snapshot;

use snapshot::PlantColumns;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// SQLite result codes (low byte of the extended code) after which the same request may
/// well succeed later: busy or locked by another connection, the file read-only or
/// unreadable now, a disk I/O error, the disk full, the file not openable.
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_READONLY: i32 = 8;
const SQLITE_IOERR: i32 = 10;
const SQLITE_FULL: i32 = 13;
const SQLITE_CANTOPEN: i32 = 14;

#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: Arc<WriteConnection>,
    readers: SqlitePool,
    batcher: Batcher,
}

/// The one connection this process writes with: its own writes never wait on each
/// other's locks, and the group commit shares its syncs. It is kept rather than returned
/// to its pool after each use, because sqlx pings a connection on every return (one more
/// hop to the connection's thread per batch).
#[derive(Debug)]
struct WriteConnection {
    pool: SqlitePool,
    kept: Mutex<Option<PoolConnection<Sqlite>>>,
}

impl WriteConnection {
    /// Waits for the writer: whoever holds it holds this process's write access.
    async fn lock(&self) -> Result<Writer<'_>, StoreError> {
        let mut kept = self.kept.lock().await;
        if kept.is_none() {
            *kept = Some(self.pool.acquire().await.map_err(classify)?);
        }
        Ok(Writer(kept))
    }

    /// sqlx's migrator takes a pool; the kept connection goes back to it for the run,
    /// and nobody else writes meanwhile.
    async fn migrate(&self) -> Result<(), StoreError> {
        let mut kept = self.kept.lock().await;
        drop(kept.take());
        Ok(MIGRATOR.run(&self.pool).await?)
    }

    async fn close(&self) {
        drop(self.kept.lock().await.take());
        self.pool.close().await;
    }
}

/// Holding the writer. A batch that failed closes it rather than keeping it: a commit that
/// failed (a full disk) left sqlx believing a transaction was still open on it, and every
/// later `BEGIN` on that connection was refused.
struct Writer<'a>(MutexGuard<'a, Option<PoolConnection<Sqlite>>>);

impl Writer<'_> {
    fn conn(&mut self) -> Result<&mut SqliteConnection, StoreError> {
        self.0.as_deref_mut().ok_or(StoreError::Stopped)
    }

    async fn discard(mut self) {
        if let Some(conn) = self.0.take() {
            let _closed = conn.close().await;
        }
    }
}

/// The connection settings of the service, also used by the benchmark's raw SQLite loop
/// so that both pay for exactly the same durability.
pub fn connect_options(
    url: &str,
    settings: StoreSettings,
) -> Result<SqliteConnectOptions, StoreError> {
    Ok(SqliteConnectOptions::from_str(url)
        .map_err(|err| {
            StoreError::Config(format!("DATABASE_URL is not a usable SQLite URL: {err}"))
        })?
        .journal_mode(SqliteJournalMode::Wal)
        // FULL: a 204 is only sent after the delete is synced to disk.
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        // Another process's writer holds the lock at most this long before a 503.
        .busy_timeout(settings.acquire_timeout))
}

impl SqliteStore {
    /// Opens the writer and one connection, so a bad path fails at start, not on a request.
    pub async fn connect(url: &str, settings: StoreSettings) -> Result<Self, StoreError> {
        let options = connect_options(url, settings)?;
        probe(&options, settings.acquire_timeout)
            .await
            .map_err(classify)?;
        let write_pool = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(settings.acquire_timeout)
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await
            .map_err(classify)?;
        let readers = SqlitePoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout)
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .map_err(classify)?;
        let writer = Arc::new(WriteConnection {
            pool: write_pool,
            kept: Mutex::new(None),
        });
        let batcher = Batcher::start(
            Arc::new(SqliteWriter {
                connection: Arc::clone(&writer),
                idempotency_ttl: settings.idempotency_ttl,
                columns: tokio::sync::OnceCell::new(),
            }),
            1,
        );
        Ok(Self {
            writer,
            readers,
            batcher,
        })
    }
}

fn classify(err: sqlx::Error) -> StoreError {
    StoreError::classify(err, |db| {
        let primary = db
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            .map(|code| code & 0xff);
        matches!(
            primary,
            Some(
                SQLITE_BUSY
                    | SQLITE_LOCKED
                    | SQLITE_READONLY
                    | SQLITE_IOERR
                    | SQLITE_FULL
                    | SQLITE_CANTOPEN
            )
        )
    })
}

/// Commits the batches on the writer connection: one transaction, two statements (three
/// when a request carries an idempotency key).
struct SqliteWriter {
    connection: Arc<WriteConnection>,
    idempotency_ttl: Duration,
    /// The columns of `plants`, read at the first delete: what the snapshot statement is
    /// built from.
    columns: tokio::sync::OnceCell<PlantColumns>,
}

#[async_trait]
impl BatchWriter for SqliteWriter {
    #[tracing::instrument(level = "debug", skip_all, fields(size = batch.len()))]
    async fn delete_batch(&self, batch: &[Deletion]) -> Result<Vec<Outcome>, StoreError> {
        let mut writer = self.connection.lock().await?;
        let conn = writer.conn()?;
        let columns = self
            .columns
            .get_or_try_init(|| PlantColumns::read(&mut *conn))
            .await?;
        // The replay window of idempotency keys opens this long ago.
        let since = before_now(self.idempotency_ttl).unwrap_or(DateTime::<Utc>::MIN_UTC);
        let committed = commit_batch(conn, columns, since, batch).await;
        if committed.is_err() {
            writer.discard().await;
        }
        committed
    }

    /// SQLite has no row locks to wait for: one deletion alone is a batch of one.
    async fn delete_one(&self, deletion: &Deletion) -> Result<Outcome, StoreError> {
        let outcomes = self.delete_batch(std::slice::from_ref(deletion)).await?;
        Ok(outcomes.first().copied().unwrap_or(Outcome::NotFound))
    }
}

/// One batch on the writer: which keys already deleted a plant, then the delete and the
/// audit rows, in one transaction.
async fn commit_batch(
    conn: &mut SqliteConnection,
    columns: &PlantColumns,
    since: DateTime<Utc>,
    batch: &[Deletion],
) -> Result<Vec<Outcome>, StoreError> {
    // IMMEDIATE takes the write lock up front: another process's writer makes this wait on
    // the busy timeout instead of failing to upgrade a read lock. Holding it, the keys
    // read below cannot be used by another writer before this commit.
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(classify)?;
    let earlier = earlier_deletions(&mut tx, since, batch).await?;
    let ids = to_json(
        &batch
            .iter()
            .enumerate()
            .filter(|(index, _)| !earlier.contains_key(index))
            .map(|(_, d)| d.plant_id)
            .collect::<Vec<_>>(),
    )?;
    let deleted: HashMap<i64, String> = columns
        .delete_returning_snapshots(&ids)
        .fetch_all(&mut *tx)
        .await
        .map_err(classify)?
        .into_iter()
        .collect();
    let outcomes: Vec<Outcome> = batch
        .iter()
        .enumerate()
        .map(|(index, d)| match earlier.get(&index) {
            Some(&plant_id) if plant_id == d.plant_id => Outcome::Replayed,
            Some(&plant_id) => Outcome::KeyReused(plant_id),
            None if deleted.contains_key(&d.plant_id) => Outcome::Deleted,
            None => Outcome::NotFound,
        })
        .collect();
    if !deleted.is_empty() {
        let audit: Vec<AuditRow<'_>> = batch
            .iter()
            .zip(&outcomes)
            .filter(|(_, outcome)| **outcome == Outcome::Deleted)
            .map(|(d, _)| {
                (
                    d.plant_id,
                    d.caller.as_ref(),
                    d.request_id.as_str(),
                    d.idempotency_key.as_deref(),
                    deleted.get(&d.plant_id),
                )
            })
            .collect();
        let audit = to_json(&audit)?;
        let now = Utc::now();
        sqlx::query!(
            "INSERT INTO plantstore_deletions
                 (plant_id, token_name, request_id, idempotency_key, snapshot, deleted_at)
             SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, ?
             FROM json_each(?)",
            now,
            audit,
        )
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    }
    // Deferred foreign keys are checked here; `classify` still reports them by kind.
    tx.commit().await.map_err(classify)?;
    Ok(outcomes)
}

/// For each deletion of `batch` whose caller used its idempotency key since `since`: its
/// position, and the plant that key deleted. No statement when no deletion has a key.
async fn earlier_deletions(
    conn: &mut SqliteConnection,
    since: DateTime<Utc>,
    batch: &[Deletion],
) -> Result<HashMap<usize, i64>, StoreError> {
    let keyed: Vec<(usize, &str, &str)> = batch
        .iter()
        .enumerate()
        .filter_map(|(index, d)| {
            let key = d.idempotency_key.as_deref()?;
            Some((index, d.caller.as_ref(), key))
        })
        .collect();
    if keyed.is_empty() {
        return Ok(HashMap::new());
    }
    let keyed = to_json(&keyed)?;
    let found = sqlx::query!(
        r#"SELECT b.value ->> 0 AS "index!: i64", MAX(d.id) AS "entry!: i64", d.plant_id AS "plant_id!: i64"
           FROM json_each(?) AS b
           JOIN plantstore_deletions AS d
             ON d.token_name = b.value ->> 1 AND d.idempotency_key = b.value ->> 2
           WHERE d.deleted_at > ?
           GROUP BY b.value ->> 0"#,
        keyed,
        since,
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(classify)?;
    Ok(found
        .into_iter()
        .filter_map(|row| Some((usize::try_from(row.index).ok()?, row.plant_id)))
        .collect())
}

/// Puts the snapshot of log entry `entry` back into `plants` and marks the entry
/// restored, in one transaction on the writer; every refusal leaves both as they were.
async fn restore(conn: &mut SqliteConnection, entry: i64, by: &str) -> Result<i64, RestoreError> {
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
    plantstore_store::column_changes(&table, &held)?;
    snapshot::insert_from_snapshot(&table, entry)
        .execute(&mut *tx)
        .await
        .map_err(|err| RestoreError::from_insert(classify(err)))?;
    let now = Utc::now();
    sqlx::query!(
        "UPDATE plantstore_deletions SET restored_at = ?, restored_by = ? WHERE id = ?",
        now,
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

/// One audit row as the insert reads it from JSON: plant id, caller, request id,
/// idempotency key, snapshot.
type AuditRow<'a> = (i64, &'a str, &'a str, Option<&'a str>, Option<&'a String>);

/// Batches travel as JSON arrays: SQLite has no array parameters, and `json_each` keeps
/// each statement a single checked query whatever the batch's size.
fn to_json(value: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|err| StoreError::Other(Arc::new(sqlx::Error::Encode(err.into()))))
}

#[async_trait]
impl Store for SqliteStore {
    #[tracing::instrument(skip(self))]
    async fn migrate(&self) -> Result<(), StoreError> {
        self.writer.migrate().await
    }

    #[tracing::instrument(skip(self))]
    async fn check_schema(&self) -> Result<(), StoreError> {
        // INTEGER affinity is any declared type containing "INT" (SQLite's own rule). Unique:
        // the whole primary key, or a unique index on exactly (id) without a WHERE clause.
        let found = sqlx::query!(
            r#"SELECT
                (SELECT '' || type FROM pragma_table_info('plants') WHERE name = 'id') AS "id_type?: String",
                (SELECT instr(upper(type), 'INT') > 0 FROM pragma_table_info('plants') WHERE name = 'id') AS "id_is_integer?: bool",
                ((SELECT pk FROM pragma_table_info('plants') WHERE name = 'id') = 1
                 AND (SELECT COUNT(*) FROM pragma_table_info('plants') WHERE pk > 0) = 1)
                OR EXISTS (SELECT 1 FROM pragma_index_list('plants') AS il
                           WHERE il."unique" = 1 AND il.partial = 0
                             AND (SELECT COUNT(*) FROM pragma_index_info(il.name)) = 1
                             AND (SELECT name FROM pragma_index_info(il.name)) = 'id') AS "id_is_unique!: bool",
                (SELECT COUNT(*) FROM sqlite_master
                  WHERE type = 'table' AND name IN ('plantstore_tokens', 'plantstore_deletions'))
                + (SELECT COUNT(*) FROM pragma_table_info('plantstore_deletions')
                    WHERE name = 'snapshot') AS "own_tables!: i64""#
        )
        .fetch_one(&self.readers)
        .await
        .map_err(classify)?;
        schema_verdict(&SchemaFacts {
            plants_id_type: found.id_type.map(|declared| {
                if declared.is_empty() {
                    "(no declared type)".to_owned()
                } else {
                    declared
                }
            }),
            plants_id_is_integer: found.id_is_integer.unwrap_or(false),
            plants_id_is_unique: found.id_is_unique,
            has_own_tables: found.own_tables == 3,
        })
    }

    #[tracing::instrument(skip(self))]
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query!("SELECT 1 AS one")
            .fetch_one(&self.readers)
            .await
            .map_err(classify)?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(id = deletion.plant_id, request_id = deletion.request_id))]
    async fn delete_plant(&self, deletion: Deletion) -> Result<Deleted, StoreError> {
        self.batcher.delete(deletion).await
    }

    #[tracing::instrument(skip(self))]
    async fn list_deletions(
        &self,
        filter: &DeletionFilter,
    ) -> Result<Vec<DeletionRecord>, StoreError> {
        let since = filter.since.unwrap_or(DateTime::<Utc>::MIN_UTC);
        sqlx::query_as!(
            DeletionRecord,
            r#"SELECT id AS "id!: i64", plant_id AS "plant_id!: i64", token_name AS caller,
                      request_id, idempotency_key, deleted_at AS "deleted_at!: DateTime<Utc>",
                      snapshot, restored_at AS "restored_at?: DateTime<Utc>", restored_by
               FROM plantstore_deletions
               WHERE (? IS NULL OR plant_id = ?) AND (? IS NULL OR token_name = ?)
                 AND deleted_at >= ?
               ORDER BY id DESC LIMIT ?"#,
            filter.plant_id,
            filter.plant_id,
            filter.caller,
            filter.caller,
            since,
            filter.limit,
        )
        .fetch_all(&self.readers)
        .await
        .map_err(classify)
    }

    #[tracing::instrument(skip(self))]
    async fn restore_deletion(&self, entry: i64, by: &str) -> Result<i64, RestoreError> {
        let mut writer = self.writer.lock().await?;
        let restored = restore(writer.conn()?, entry, by).await;
        if let Err(RestoreError::Store(_)) = restored {
            writer.discard().await;
        }
        restored
    }

    #[tracing::instrument(skip(self))]
    async fn prune_deletions(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            "DELETE FROM plantstore_deletions WHERE deleted_at < ?",
            before
        )
        .execute(self.writer.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        Ok(done.rows_affected())
    }

    #[tracing::instrument(skip(self))]
    async fn seed_plants(&self, count: i64) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            "WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < ?)
             INSERT INTO plants (id, name, tag)
             SELECT n, 'Plant ' || n, 'demo' FROM seq WHERE true
             ON CONFLICT (id) DO NOTHING",
            count
        )
        .execute(self.writer.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        Ok(done.rows_affected())
    }

    #[tracing::instrument(skip(self, token), fields(name = %token.name))]
    async fn insert_token(&self, token: &TokenRecord) -> Result<(), StoreError> {
        sqlx::query!(
            "INSERT INTO plantstore_tokens (name, lookup_id, secret_hash, created_at, expires_at, revoked_at)
             VALUES (?, ?, ?, ?, ?, ?)",
            token.name,
            token.lookup_id,
            token.secret_hash,
            token.created_at,
            token.expires_at,
            token.revoked_at,
        )
        .execute(self.writer.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        sqlx::query_as!(
            TokenRecord,
            r#"SELECT name AS "name!", lookup_id AS "lookup_id!", secret_hash AS "secret_hash!",
                      created_at AS "created_at!: DateTime<Utc>",
                      expires_at AS "expires_at?: DateTime<Utc>",
                      revoked_at AS "revoked_at?: DateTime<Utc>"
               FROM plantstore_tokens ORDER BY created_at, name"#
        )
        .fetch_all(&self.readers)
        .await
        .map_err(classify)
    }

    #[tracing::instrument(skip(self))]
    async fn revoke_token(&self, name: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
        let done = sqlx::query!(
            "UPDATE plantstore_tokens SET revoked_at = COALESCE(revoked_at, ?) WHERE name = ?",
            at,
            name
        )
        .execute(self.writer.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    #[tracing::instrument(skip(self))]
    async fn count_tokens(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar!(r#"SELECT COUNT(*) AS "count!: i64" FROM plantstore_tokens"#)
            .fetch_one(&self.readers)
            .await
            .map_err(classify)
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            pool_size: self.readers.size(),
            pool_idle: self.readers.num_idle(),
            queued: self.batcher.queued(),
        }
    }

    fn observe(&self, batch_sizes: Histogram) {
        self.batcher.observe(batch_sizes);
    }

    async fn close(&self) {
        self.writer.close().await;
        self.readers.close().await;
    }
}
