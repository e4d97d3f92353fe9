//! The storage interface on an SQLite file: WAL, foreign keys on, every commit synced,
//! one write connection and a pool of readers. This file connects and serves `Store`;
//! `deletion_log.rs`, `tokens.rs` and `webhooks.rs` each implement their trait.

mod deletion_log;
mod errors;
mod group_commit;
mod schema;
mod snapshot;
mod tokens;
mod webhooks;
mod write_connection;

use std::{str::FromStr, sync::Arc};

use async_trait::async_trait;
use plantstore_group_commit::Batcher;
use plantstore_store::{
    CommitNewsReceiver, Deleted, Deletion, Store, StoreError, StoreSettings, StoreStats,
    backend::{CommitNews, probe},
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use errors::classify;
use group_commit::SqliteBatchWriter;
use write_connection::WriteConnection;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

#[derive(Debug, Clone)]
pub struct SqliteStore {
    write_connection: Arc<WriteConnection>,
    readers: SqlitePool,
    batcher: Batcher,
    news: CommitNews,
}

/// The connection settings of the service, also used by the benchmark's raw SQLite loop
/// so that both pay for exactly the same durability.
pub fn connect_options(
    url: &str,
    settings: &StoreSettings,
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
    /// Opens the write connection and one reader, so a bad path fails at start, not on a request.
    pub async fn connect(url: &str, settings: StoreSettings) -> Result<Self, StoreError> {
        let options = connect_options(url, &settings)?;
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
        let write_connection = Arc::new(WriteConnection::new(write_pool, settings.acquire_timeout));
        let news = CommitNews::default();
        let batch_writer =
            SqliteBatchWriter::new(Arc::clone(&write_connection), settings.idempotency_ttl);
        let batcher = Batcher::start(
            Arc::new(batch_writer),
            1,
            news.clone(),
            settings.commit_observer,
        );
        Ok(Self {
            write_connection,
            readers,
            batcher,
            news,
        })
    }
}

#[async_trait]
impl Store for SqliteStore {
    #[tracing::instrument(skip(self))]
    async fn migrate(&self) -> Result<(), StoreError> {
        self.write_connection.migrate().await
    }

    async fn check_schema(&self) -> Result<(), StoreError> {
        schema::check(&self.readers).await
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
    async fn seed_plants(&self, count: i64) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            "WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < ?)
             INSERT INTO plants (id, name, tag)
             SELECT n, 'Plant ' || n, 'demo' FROM seq WHERE true
             ON CONFLICT (id) DO NOTHING",
            count
        )
        .execute(self.write_connection.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        Ok(done.rows_affected())
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            pool_size: self.readers.size(),
            pool_idle: self.readers.num_idle(),
            queued: self.batcher.queued(),
        }
    }

    /// Another process's commits are found by delivery's poll.
    fn commits(&self) -> CommitNewsReceiver {
        self.news.subscribe()
    }

    async fn close(&self) {
        self.write_connection.close().await;
        self.readers.close().await;
    }
}
