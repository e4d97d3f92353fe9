//! The storage interface on an SQLite file: WAL, foreign keys on, every commit synced,
//! one writer connection and a pool of readers. This file connects and says which file
//! serves each method of `Store`.

mod batch;
mod deletion_log;
mod errors;
mod schema;
mod seed;
mod snapshot;
mod stream;
mod tokens;
mod webhooks;
mod writer;

use std::{str::FromStr, sync::Arc, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use plantstore_store::{
    Announcements, Batcher, CommitObserver, Deleted, Deletion, DeletionFilter, DeletionRecord,
    DeliveryReport, EndpointRecord, Event, Lease, NewEndpoint, ReplayOutcome, RestoreError, Store,
    StoreError, StoreSettings, StoreStats, StreamPosition, TokenRecord, Webhooks, probe,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use batch::SqliteWriter;
use errors::classify;
use writer::WriteConnection;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: Arc<WriteConnection>,
    readers: SqlitePool,
    batcher: Batcher,
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
        let writer = Arc::new(WriteConnection::new(write_pool, settings.acquire_timeout));
        let batcher = Batcher::start(
            Arc::new(SqliteWriter::new(
                Arc::clone(&writer),
                settings.idempotency_ttl,
            )),
            1,
        );
        Ok(Self {
            writer,
            readers,
            batcher,
        })
    }
}

#[async_trait]
impl Store for SqliteStore {
    #[tracing::instrument(skip(self))]
    async fn migrate(&self) -> Result<(), StoreError> {
        self.writer.migrate().await
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

    async fn list_deletions(
        &self,
        filter: &DeletionFilter,
    ) -> Result<Vec<DeletionRecord>, StoreError> {
        deletion_log::list(&self.readers, filter).await
    }

    async fn restore_deletion(&self, entry: i64, by: &str) -> Result<i64, RestoreError> {
        deletion_log::restore(&self.writer, entry, by).await
    }

    async fn prune_deletions(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        deletion_log::prune(&self.writer, before).await
    }

    async fn seed_plants(&self, count: i64) -> Result<u64, StoreError> {
        seed::seed(&self.writer, count).await
    }

    async fn insert_token(&self, token: &TokenRecord) -> Result<(), StoreError> {
        tokens::insert(&self.writer, token).await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        tokens::list(&self.readers).await
    }

    async fn revoke_token(&self, name: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
        tokens::revoke(&self.writer, name, at).await
    }

    async fn count_tokens(&self) -> Result<i64, StoreError> {
        tokens::count(&self.readers).await
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            pool_size: self.readers.size(),
            pool_idle: self.readers.num_idle(),
            queued: self.batcher.queued(),
        }
    }

    fn observe(&self, observer: Arc<dyn CommitObserver>) {
        self.batcher.observe(observer);
    }

    async fn close(&self) {
        self.writer.close().await;
        self.readers.close().await;
    }
}

#[async_trait]
impl Webhooks for SqliteStore {
    async fn add_endpoint(&self, endpoint: &NewEndpoint) -> Result<i64, StoreError> {
        webhooks::add(&self.writer, endpoint).await
    }

    async fn rotate_secret(
        &self,
        id: i64,
        secret: &str,
        overlap: Duration,
    ) -> Result<DateTime<Utc>, StoreError> {
        webhooks::rotate_secret(&self.writer, id, secret, overlap).await
    }

    async fn list_endpoints(&self) -> Result<Vec<EndpointRecord>, StoreError> {
        webhooks::list(&self.readers).await
    }

    async fn remove_endpoint(&self, id: i64) -> Result<(), StoreError> {
        webhooks::remove(&self.writer, id).await
    }

    async fn enable_endpoint(&self, id: i64) -> Result<(), StoreError> {
        webhooks::enable(&self.writer, id).await
    }

    async fn replay_endpoint(&self, id: i64, from: i64) -> Result<ReplayOutcome, StoreError> {
        webhooks::replay(&self.writer, id, from).await
    }

    async fn claim_endpoints(
        &self,
        owner: &str,
        lease: Duration,
    ) -> Result<Vec<Lease>, StoreError> {
        webhooks::claim(&self.writer, owner, lease).await
    }

    async fn read_events(
        &self,
        after: StreamPosition,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        stream::read(&self.readers, after, limit).await
    }

    async fn report_delivery(
        &self,
        lease: &Lease,
        owner: &str,
        report: &DeliveryReport,
    ) -> Result<bool, StoreError> {
        webhooks::report(&self.writer, lease, owner, report).await
    }

    async fn release_endpoints(&self, owner: &str) -> Result<(), StoreError> {
        webhooks::release(&self.writer, owner).await
    }

    /// Another process's commits are found by delivery's poll.
    fn announcements(&self) -> Option<Arc<dyn Announcements>> {
        None
    }
}
