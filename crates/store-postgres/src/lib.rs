//! The storage interface on PostgreSQL, over TLS (rustls) when the URL asks for it.
//! This file says which file serves each method of `Store`.

mod announcements;
mod batch;
mod connection;
mod deletion_log;
mod errors;
mod failover;
mod hosts;
mod limits;
mod schema;
mod seed;
mod tokens;
mod webhooks;
mod writer;

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use plantstore_store::{
    Announcements, BatchWriter, Batcher, CommitObserver, Deleted, Deletion, DeletionFilter,
    DeletionRecord, DeliveryReport, EndpointRecord, Event, Lease, NewEndpoint, ReplayOutcome,
    RestoreError, Store, StoreError, StoreSettings, StoreStats, StreamPosition, TokenRecord,
    Webhooks,
};
use sqlx::postgres::PgPool;

use announcements::PgAnnouncements;
use connection::connection;
use errors::classify;
use failover::Failover;
use writer::PgWriter;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// How many group commits one instance keeps in flight, each on its own connection. Two
/// let one batch execute while the other waits for its WAL flush; more lanes made
/// smaller batches and cost more CPU per delete in the benchmark (bench/RESULTS.md).
pub fn batch_lanes(max_connections: u32) -> usize {
    (max_connections / 4).clamp(1, 2) as usize
}

#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    writer: Arc<PgWriter>,
    batcher: Batcher,
    /// Where new connections go when the URL names several hosts.
    failover: Arc<Failover>,
    announcements: Arc<PgAnnouncements>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("pool", &self.pool)
            .field("batcher", &self.batcher)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Opens the pool and one connection, so a wrong host or password fails at start.
    pub async fn connect(url: &str, settings: StoreSettings) -> Result<Self, StoreError> {
        let (pool, failover) = connection::open_pool(url, settings).await?;
        let lanes = batch_lanes(settings.max_connections);
        // Deletions waiting alone for a held row may take only the connections the batch
        // lanes do not need.
        let alone = (settings.max_connections as usize)
            .saturating_sub(lanes)
            .max(1);
        let writer = Arc::new(PgWriter::new(
            pool.clone(),
            settings.idempotency_ttl.as_secs_f64(),
            alone,
            Arc::clone(&failover),
        ));
        let batcher = Batcher::start(Arc::clone(&writer) as Arc<dyn BatchWriter>, lanes);
        Ok(Self {
            announcements: Arc::new(PgAnnouncements::new(pool.clone())),
            pool,
            writer,
            batcher,
            failover,
        })
    }
}

/// Ready means able to delete: a server that takes no writes is not.
/// A connection that fails it, or finds the server read-only, is closed rather than reused.
async fn ping(pool: &PgPool) -> Result<(), StoreError> {
    let mut conn = connection(pool).await?;
    let read_only = sqlx::query_scalar!(
        r#"SELECT current_setting('transaction_read_only') = 'on' AS "read_only!""#
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(classify);
    match read_only.map(|rows| rows.first().copied().unwrap_or(true)) {
        Ok(false) => Ok(()),
        Ok(true) => {
            conn.close_on_drop();
            Err(StoreError::ReadOnly)
        }
        Err(err) => {
            conn.close_on_drop();
            Err(err)
        }
    }
}

#[async_trait]
impl Store for PostgresStore {
    #[tracing::instrument(skip(self))]
    async fn migrate(&self) -> Result<(), StoreError> {
        Ok(MIGRATOR.run(&self.pool).await?)
    }

    async fn check_schema(&self) -> Result<(), StoreError> {
        schema::check(&self.pool).await
    }

    #[tracing::instrument(skip(self))]
    async fn ping(&self) -> Result<(), StoreError> {
        self.failover.watch(ping(&self.pool).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(id = deletion.plant_id, request_id = deletion.request_id))]
    async fn delete_plant(&self, deletion: Deletion) -> Result<Deleted, StoreError> {
        self.batcher.delete(deletion).await
    }

    async fn list_deletions(
        &self,
        filter: &DeletionFilter,
    ) -> Result<Vec<DeletionRecord>, StoreError> {
        self.failover
            .watch(deletion_log::list(&self.pool, filter).await)
    }

    async fn restore_deletion(&self, entry: i64, by: &str) -> Result<i64, RestoreError> {
        let restored = deletion_log::restore(&self.pool, entry, by).await;
        if let Err(RestoreError::Store(err)) = &restored {
            self.failover.notice(err);
        }
        restored
    }

    async fn prune_deletions(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        self.failover
            .watch(deletion_log::prune(&self.pool, before).await)
    }

    async fn seed_plants(&self, count: i64) -> Result<u64, StoreError> {
        self.failover.watch(seed::seed(&self.pool, count).await)
    }

    async fn insert_token(&self, token: &TokenRecord) -> Result<(), StoreError> {
        self.failover.watch(tokens::insert(&self.pool, token).await)
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        self.failover.watch(tokens::list(&self.pool).await)
    }

    async fn revoke_token(&self, name: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.failover
            .watch(tokens::revoke(&self.pool, name, at).await)
    }

    async fn count_tokens(&self) -> Result<i64, StoreError> {
        self.failover.watch(tokens::count(&self.pool).await)
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            pool_size: self.pool.size(),
            pool_idle: self.pool.num_idle(),
            queued: self.batcher.queued(),
        }
    }

    fn observe(&self, observer: Arc<dyn CommitObserver>) {
        self.batcher.observe(observer);
    }

    async fn close(&self) {
        self.writer.release_all();
        self.pool.close().await;
    }
}

#[async_trait]
impl Webhooks for PostgresStore {
    async fn add_endpoint(&self, endpoint: &NewEndpoint) -> Result<i64, StoreError> {
        self.failover
            .watch(webhooks::add(&self.pool, endpoint).await)
    }

    async fn rotate_secret(
        &self,
        id: i64,
        secret: &str,
        overlap: Duration,
    ) -> Result<DateTime<Utc>, StoreError> {
        self.failover
            .watch(webhooks::rotate_secret(&self.pool, id, secret, overlap).await)
    }

    async fn list_endpoints(&self) -> Result<Vec<EndpointRecord>, StoreError> {
        self.failover.watch(webhooks::list(&self.pool).await)
    }

    async fn remove_endpoint(&self, id: i64) -> Result<(), StoreError> {
        self.failover.watch(webhooks::remove(&self.pool, id).await)
    }

    async fn enable_endpoint(&self, id: i64) -> Result<(), StoreError> {
        self.failover.watch(webhooks::enable(&self.pool, id).await)
    }

    async fn replay_endpoint(&self, id: i64, from: i64) -> Result<ReplayOutcome, StoreError> {
        self.failover
            .watch(webhooks::replay(&self.pool, id, from).await)
    }

    async fn claim_endpoints(
        &self,
        owner: &str,
        lease: Duration,
    ) -> Result<Vec<Lease>, StoreError> {
        self.failover
            .watch(webhooks::claim(&self.pool, owner, lease).await)
    }

    async fn read_events(
        &self,
        after: StreamPosition,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        self.failover
            .watch(webhooks::read(&self.pool, after, limit).await)
    }

    async fn report_delivery(
        &self,
        lease: &Lease,
        owner: &str,
        report: &DeliveryReport,
    ) -> Result<bool, StoreError> {
        self.failover
            .watch(webhooks::report(&self.pool, lease, owner, report).await)
    }

    async fn release_endpoints(&self, owner: &str) -> Result<(), StoreError> {
        self.failover
            .watch(webhooks::release(&self.pool, owner).await)
    }

    fn announcements(&self) -> Option<Arc<dyn Announcements>> {
        Some(Arc::clone(&self.announcements) as Arc<dyn Announcements>)
    }
}
