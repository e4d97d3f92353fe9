//! The storage interface, the same for every database backend. What only the backends
//! share to implement it is in [`backend`].

use std::{fmt::Debug, sync::Arc};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::watch;

pub mod backend;
pub mod destinations;
mod error;
mod log;
pub mod time;

pub use destinations::Destinations;
pub use error::StoreError;
pub use log::{DeletionFilter, DeletionRecord, RestoreError};

/// A request to delete one plant, with what its audit row records; the store stamps the time.
#[derive(Debug, Clone)]
pub struct Deletion {
    pub plant_id: i64,
    /// The token's name, or `jwt:<subject>`.
    pub caller: Arc<str>,
    pub request_id: String,
    /// The client's `Idempotency-Key`, scoped to the caller: a retry replays the first 204.
    pub idempotency_key: Option<Arc<str>>,
    /// When the request is answered 503: no database wait of this deletion may outlast it.
    pub deadline: tokio::time::Instant,
}

impl Deletion {
    pub fn same_key_as(&self, other: &Deletion) -> bool {
        self.idempotency_key.is_some()
            && self.idempotency_key == other.idempotency_key
            && self.caller == other.caller
    }
}

/// Done now, or earlier by a request with the same idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    Now,
    Replayed,
}

/// A stored API token: everything but the secret, which is never stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    pub name: String,
    /// Public half of the token, used to find the row before the constant-time check.
    pub lookup_id: String,
    /// SHA-256 of the secret half.
    pub secret_hash: Vec<u8>,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// One database the service can run on (a trait per concern, each implemented where its
/// queries are). Each method is one unit of work; driver errors are mapped into
/// [`StoreError`] by kind, so callers never see database text.
#[async_trait]
pub trait Store: DeletionLog + Tokens + Destinations + Send + Sync + Debug + 'static {
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Read-only: `plants.id` is an integer naming one row, and the service's tables exist.
    async fn check_schema(&self) -> Result<(), StoreError>;

    async fn ping(&self) -> Result<(), StoreError>;

    /// Deletes one plant and writes its audit row (key, JSON snapshot), committed together
    /// and durably before it returns; concurrent calls share commits. `NotFound` without the
    /// plant, `Referenced` when another table points at it. A key used within the replay
    /// window: `Deleted::Replayed` if it deleted this plant, `KeyReused` if another.
    async fn delete_plant(&self, deletion: Deletion) -> Result<Deleted, StoreError>;

    /// Inserts demo plants with ids 1..=count that are missing; returns how many it added.
    async fn seed_plants(&self, count: i64) -> Result<u64, StoreError>;

    fn stats(&self) -> StoreStats;

    /// News after each commit that wrote to the deletion log: this process's, and on
    /// PostgreSQL any process's while a receiver is kept (a lost connection counts as news:
    /// what was said meanwhile went unheard). One change may stand for many commits.
    fn commits(&self) -> CommitNewsReceiver;

    /// Waits for in-flight work and closes every connection.
    async fn close(&self);
}

/// One short prune statement, so a delete waits at most that long behind it. Spelt `LIMIT 500`:
/// as a parameter, PostgreSQL's generic plan guesses a tenth of the table and JIT-compiles
/// every batch (bench/JOURNAL.md, "retention on PostgreSQL, profiled and paced").
pub const PRUNE_BATCH: u64 = 500;

#[async_trait]
pub trait DeletionLog: Send + Sync {
    /// Entries of the deletion log, newest first.
    async fn list_deletions(
        &self,
        filter: &DeletionFilter,
    ) -> Result<Vec<DeletionRecord>, StoreError>;

    /// Puts the plant back from its snapshot and marks the entry restored, in one transaction.
    async fn restore_deletion(&self, entry: i64, by: &str) -> Result<i64, RestoreError>;

    /// Removes up to `PRUNE_BATCH` entries deleted before `before`, oldest first, but none a
    /// destination has yet to receive; their keys stop replaying. Fewer: no more can go now.
    async fn prune_deletions(&self, before: DateTime<Utc>) -> Result<u64, StoreError>;

    async fn log_size(&self) -> Result<LogSize, StoreError>;

    /// Takes or renews `owner`'s lease on a chore (the database's clock where it has one);
    /// whether `owner` holds it now. Another owner's lease is taken only once it ran out.
    async fn claim_chore(
        &self,
        name: &str,
        owner: &str,
        length: std::time::Duration,
    ) -> Result<bool, StoreError>;

    /// Gives it up so another instance takes the chore at once, not when the lease runs out.
    async fn release_chore(&self, name: &str, owner: &str) -> Result<(), StoreError>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSize {
    pub entries: i64,
    /// When the entry with the lowest id was deleted; `None` for an empty log.
    pub oldest: Option<DateTime<Utc>>,
}

/// The service's own API tokens; only hashes are stored.
#[async_trait]
pub trait Tokens: Send + Sync {
    /// Stores a new token; `StoreError::Duplicate` when the name is taken.
    async fn insert_token(&self, token: &TokenRecord) -> Result<(), StoreError>;

    /// Every token, oldest first.
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError>;

    /// `StoreError::NotFound` without that name; revoking again keeps the first time.
    async fn revoke_token(&self, name: &str, at: DateTime<Utc>) -> Result<(), StoreError>;

    async fn count_tokens(&self) -> Result<i64, StoreError>;
}

/// What [`Store::commits`] hands out: only that there were commits since the last look, never
/// how many, so a reader reads everything new.
#[derive(Debug, Clone)]
pub struct CommitNewsReceiver(watch::Receiver<u64>);

impl CommitNewsReceiver {
    /// Resolves once there is news since the last look; never, once the store is gone.
    pub async fn changed(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Takes what was said so far as seen: only a commit after this is news.
    pub fn mark_seen(&mut self) {
        self.0.mark_unchanged();
    }
}

/// For whatever keeps figures (the service's `/metrics`); the store keeps none.
pub trait CommitObserver: Send + Sync + Debug + 'static {
    fn batch_committed(&self, size: usize);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreStats {
    /// Connections open in the pool (SQLite: the readers; its one writer is apart).
    pub pool_size: u32,
    pub pool_idle: usize,
    pub queued: usize,
    /// Hosts the database URL names (1 for SQLite).
    pub database_hosts: usize,
    /// Since start: moves of new connections to another host (a failover).
    pub host_changes: u64,
}

#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub max_connections: u32,
    /// For a free connection (on SQLite also the write lock), then `StoreError::Unavailable`.
    pub acquire_timeout: std::time::Duration,
    /// How long after a delete a retry with its key is answered from the log.
    pub idempotency_ttl: std::time::Duration,
    /// `None` for a command.
    pub commit_observer: Option<Arc<dyn CommitObserver>>,
}
