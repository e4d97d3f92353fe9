//! The storage interface the service talks to, the same for every database backend: the
//! traits, the records they take and give, and the one error. What only the backends
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

/// A request to delete one plant, with what its audit row records: who asked, and in
/// answer to which HTTP request. The store stamps the time when it commits.
#[derive(Debug, Clone)]
pub struct Deletion {
    pub plant_id: i64,
    /// The token's name, or `jwt:<subject>`.
    pub caller: Arc<str>,
    pub request_id: String,
    /// The client's `Idempotency-Key`, the caller's own: a retry with it replays the
    /// first try's 204 instead of deleting again.
    pub idempotency_key: Option<Arc<str>>,
    /// When the request is answered 503 if it has not been answered yet: no wait of this
    /// deletion on the database may last past it.
    pub deadline: tokio::time::Instant,
}

impl Deletion {
    /// Whether `other` carries the same idempotency key from the same caller.
    pub fn same_key_as(&self, other: &Deletion) -> bool {
        self.idempotency_key.is_some()
            && self.idempotency_key == other.idempotency_key
            && self.caller == other.caller
    }
}

/// A successful delete: done now, or done earlier by a request with the same
/// idempotency key.
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

/// One database the service can run on: plants and the schema here, the deletion log,
/// tokens and destinations in a trait each, so that a backend implements each where its
/// queries are.
///
/// Every method is one unit of work on the database; an implementation maps its driver's
/// errors into [`StoreError`] by kind so callers never see database text.
#[async_trait]
pub trait Store: DeletionLog + Tokens + Destinations + Send + Sync + Debug + 'static {
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Checks, without changing anything, that the schema the service needs is present
    /// and usable: `plants.id` an integer that names one row, and the service's tables.
    async fn check_schema(&self) -> Result<(), StoreError>;

    /// Answers once the database answers a trivial query.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Deletes one plant and writes its audit row, committed together and durably before
    /// it returns; concurrent calls share commits (the group commit, `plantstore-group-commit`).
    ///
    /// `StoreError::NotFound` when no such plant exists, `StoreError::Referenced` when
    /// another table still points at it (then nothing is deleted). With an idempotency
    /// key the caller used within the replay window: `Deleted::Replayed` when it deleted
    /// this plant, `StoreError::KeyReused` when it deleted another (nothing is deleted).
    /// The audit row keeps the key and a JSON snapshot of the deleted row.
    async fn delete_plant(&self, deletion: Deletion) -> Result<Deleted, StoreError>;

    /// Inserts demo plants with ids 1..=count that are missing; returns how many it added.
    async fn seed_plants(&self, count: i64) -> Result<u64, StoreError>;

    /// The connection pool and the group-commit queue right now, for `/metrics`.
    fn stats(&self) -> StoreStats;

    /// Changes after each commit that wrote to the deletion log (deletes, restores,
    /// replays) in this process, and on PostgreSQL in any process on the same database
    /// (heard while a receiver is kept; a lost connection counts as a change, since what
    /// was said meanwhile went unheard). One change may stand for many commits.
    fn commits(&self) -> CommitNewsReceiver;

    /// Waits for in-flight work and closes every connection.
    async fn close(&self);
}

/// The most entries one `prune_deletions` removes: one short statement, so that a delete
/// waits at most that long behind it. The statements spell it as the literal `LIMIT 500`: as
/// a parameter, PostgreSQL's generic plan guesses a tenth of the table instead, a cost that
/// has it JIT-compile every batch (bench/JOURNAL.md, "retention on PostgreSQL, profiled and
/// paced").
pub const PRUNE_BATCH: u64 = 500;

/// The deletion log: what was deleted, by whom, and putting it back.
#[async_trait]
pub trait DeletionLog: Send + Sync {
    /// Entries of the deletion log, newest first.
    async fn list_deletions(
        &self,
        filter: &DeletionFilter,
    ) -> Result<Vec<DeletionRecord>, StoreError>;

    /// Puts a deleted plant back from its snapshot and marks the entry restored `by`, in
    /// one transaction; returns the plant's id.
    async fn restore_deletion(&self, entry: i64, by: &str) -> Result<i64, RestoreError>;

    /// Removes up to `PRUNE_BATCH` log entries deleted before `before`, oldest first,
    /// keeping those a destination has yet to receive; their idempotency keys stop
    /// replaying. Returns how many went: fewer than `PRUNE_BATCH` when no more can go now.
    async fn prune_deletions(&self, before: DateTime<Utc>) -> Result<u64, StoreError>;

    /// How many entries the log holds, and when the oldest of them was deleted.
    async fn log_size(&self) -> Result<LogSize, StoreError>;

    /// Takes, or renews, the lease on the chore `name` for `owner` until `length` from now
    /// (the database's clock where it has one); whether `owner` holds it now. Another
    /// owner's lease is taken only once it has run out.
    async fn claim_chore(
        &self,
        name: &str,
        owner: &str,
        length: std::time::Duration,
    ) -> Result<bool, StoreError>;

    /// Gives up `owner`'s lease on the chore `name`, if it holds it, so that another
    /// instance takes the chore at once instead of when the lease runs out.
    async fn release_chore(&self, name: &str, owner: &str) -> Result<(), StoreError>;
}

/// The deletion log's size, as `/metrics` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSize {
    pub entries: i64,
    /// When the entry with the lowest id was deleted; `None` for an empty log.
    pub oldest: Option<DateTime<Utc>>,
}

/// The service's own API tokens; only their hashes are stored.
#[async_trait]
pub trait Tokens: Send + Sync {
    /// Stores a new token; `StoreError::Duplicate` when the name is taken.
    async fn insert_token(&self, token: &TokenRecord) -> Result<(), StoreError>;

    /// Every token, oldest first.
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError>;

    /// Marks a token revoked; `StoreError::NotFound` when no token has that name.
    /// Revoking a revoked token keeps its first revocation time.
    async fn revoke_token(&self, name: &str, at: DateTime<Utc>) -> Result<(), StoreError>;

    async fn count_tokens(&self) -> Result<i64, StoreError>;
}

/// News of commits that wrote to the deletion log, as [`Store::commits`] hands it out: it
/// says only that there were some since the last look, never how many, so a reader reads
/// everything new.
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

/// Told the size of each group commit once it committed, for whatever keeps such figures
/// (the service's `/metrics`); the store itself keeps none. Given when the store is opened
/// (`StoreSettings::commit_observer`).
pub trait CommitObserver: Send + Sync + Debug + 'static {
    fn batch_committed(&self, size: usize);
}

/// A backend's connections and queue at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreStats {
    /// Connections open in the pool (SQLite: the readers; its one writer is apart).
    pub pool_size: u32,
    /// Of those, how many wait unused.
    pub pool_idle: usize,
    /// Deletes waiting for a commit.
    pub queued: usize,
    /// Hosts the database URL names (1 for SQLite).
    pub database_hosts: usize,
    /// Times new connections were moved to another host since start (a failover).
    pub host_changes: u64,
}

/// How a backend sizes and waits on its connection pool, how long it replays idempotency
/// keys, and whom it tells of its group commits.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub max_connections: u32,
    /// Longest wait for a free connection (and, on SQLite, for the write lock) before the
    /// caller gets `StoreError::Unavailable`.
    pub acquire_timeout: std::time::Duration,
    /// How long after a delete a retry with its idempotency key is answered from the log.
    pub idempotency_ttl: std::time::Duration,
    /// Told each group commit's size (the service's `/metrics`); none for a command.
    pub commit_observer: Option<Arc<dyn CommitObserver>>,
}
