//! The storage interface the service talks to, the same for every database backend.

use std::{fmt::Debug, sync::Arc};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

mod batch_result;
mod batcher;
mod deadline;
mod error;
mod kept_connections;
mod log;
mod webhooks;

pub use batch_result::{BatchResult, keyed_outcome};
pub use batcher::{BatchWriter, Batcher, Outcome, sole_outcome};
pub use deadline::{
    LimitedConnection, WaitLimit, earliest, remaining, statement_share, wait_until,
};
pub use error::{StoreError, found};
pub use kept_connections::KeptConnections;
pub use log::{
    DeletionFilter, DeletionRecord, EntryState, RestoreError, before_now, column_changes,
};
pub use webhooks::{
    Announcements, DeliveryReport, EndpointRecord, Event, EventKind, EventRow, Lease, LeaseRow,
    NewEndpoint, ReplayOutcome, Signing, StreamPosition, Webhooks,
};

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

/// One database the service can run on.
///
/// Every method is one unit of work on the database; an implementation maps its driver's
/// errors into [`StoreError`] by kind so callers never see database text.
#[async_trait]
pub trait Store: Webhooks + Send + Sync + Debug + 'static {
    /// Applies this backend's migrations.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Checks, without changing anything, that the schema the service needs is present
    /// and usable: `plants.id` an integer that names one row, and the service's tables.
    async fn check_schema(&self) -> Result<(), StoreError>;

    /// Answers once the database answers a trivial query.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Deletes one plant and writes its audit row, committed together and durably before
    /// it returns; concurrent calls share commits (see [`Batcher`]).
    ///
    /// `StoreError::NotFound` when no such plant exists, `StoreError::Referenced` when
    /// another table still points at it (then nothing is deleted). With an idempotency
    /// key the caller used within the replay window: `Deleted::Replayed` when it deleted
    /// this plant, `StoreError::KeyReused` when it deleted another (nothing is deleted).
    /// The audit row keeps the key and a JSON snapshot of the deleted row.
    async fn delete_plant(&self, deletion: Deletion) -> Result<Deleted, StoreError>;

    /// Entries of the deletion log, newest first.
    async fn list_deletions(
        &self,
        filter: &DeletionFilter,
    ) -> Result<Vec<DeletionRecord>, StoreError>;

    /// Puts a deleted plant back from its snapshot and marks the entry restored `by`, in
    /// one transaction; returns the plant's id.
    async fn restore_deletion(&self, entry: i64, by: &str) -> Result<i64, RestoreError>;

    /// Removes log entries deleted before `before`; their idempotency keys stop
    /// replaying. Returns how many went.
    async fn prune_deletions(&self, before: DateTime<Utc>) -> Result<u64, StoreError>;

    /// Inserts demo plants with ids 1..=count that are missing; returns how many it added.
    async fn seed_plants(&self, count: i64) -> Result<u64, StoreError>;

    /// Stores a new token; `StoreError::Duplicate` when the name is taken.
    async fn insert_token(&self, token: &TokenRecord) -> Result<(), StoreError>;

    /// Every token, oldest first.
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError>;

    /// Marks a token revoked; `StoreError::NotFound` when no token has that name.
    /// Revoking a revoked token keeps its first revocation time.
    async fn revoke_token(&self, name: &str, at: DateTime<Utc>) -> Result<(), StoreError>;

    async fn count_tokens(&self) -> Result<i64, StoreError>;

    /// The connection pool and the group-commit queue right now, for `/metrics`.
    fn stats(&self) -> StoreStats;

    /// Tells `observer` the size of every group-commit batch from now on.
    fn observe(&self, observer: Arc<dyn CommitObserver>);

    /// Waits for in-flight work and closes every connection.
    async fn close(&self);
}

/// Told the size of each group commit as it goes out, for whatever keeps such figures
/// (the service's `/metrics`); the store itself keeps none.
pub trait CommitObserver: Send + Sync + 'static {
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
}

/// How a backend sizes and waits on its connection pool, and how long it replays
/// idempotency keys.
#[derive(Debug, Clone, Copy)]
pub struct StoreSettings {
    pub max_connections: u32,
    /// Longest wait for a free connection (and, on SQLite, for the write lock) before the
    /// caller gets `StoreError::Unavailable`.
    pub acquire_timeout: std::time::Duration,
    /// How long after a delete a retry with its idempotency key is answered from the log.
    pub idempotency_ttl: std::time::Duration,
}

/// What a backend found in its catalog about the tables the service uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaFacts {
    /// The declared type of `plants.id`; `None` when there is no such column.
    pub plants_id_type: Option<String>,
    /// An integer type: smallint, integer or bigint (SQLite: INTEGER affinity).
    pub plants_id_is_integer: bool,
    /// A primary key or unique index on exactly `(id)`, with no condition: one id can
    /// never name, and so never delete, several rows.
    pub plants_id_is_unique: bool,
    /// The service's tables, as its latest migration leaves them.
    pub has_own_tables: bool,
}

/// What `Store::check_schema` reports, given what a backend found in its catalog.
pub fn schema_verdict(facts: &SchemaFacts) -> Result<(), StoreError> {
    let Some(id_type) = &facts.plants_id_type else {
        return Err(StoreError::Schema(
            "the database has no plants.id column: create the plants table, or start with PLANTSTORE_MIGRATE=true".into(),
        ));
    };
    if !facts.plants_id_is_integer {
        return Err(StoreError::Schema(format!(
            "plants.id is of type {id_type}: the service needs an integer column (smallint, integer or bigint) to delete plants by id"
        )));
    }
    if !facts.plants_id_is_unique {
        return Err(StoreError::Schema(format!(
            "plants.id ({id_type}) is not unique: add a primary key or a unique index on plants (id), so that one id can never delete several rows"
        )));
    }
    if !facts.has_own_tables {
        return Err(StoreError::Schema(
            "the service's own tables are missing or older than this version: run `plantstore migrate` once, or start with PLANTSTORE_MIGRATE=true".into(),
        ));
    }
    Ok(())
}

/// Opens and closes one connection, waiting at most `wait`.
///
/// Backends call it before building their pool: the pool retries a refused connection
/// until its timeout and then reports only that it timed out, while a user needs the
/// cause ("connection refused", "password authentication failed", "unable to open file").
pub async fn probe<O>(options: &O, wait: std::time::Duration) -> Result<(), sqlx::Error>
where
    O: sqlx::ConnectOptions,
    O::Connection: Sized,
{
    use sqlx::Connection;
    match tokio::time::timeout(wait, options.connect()).await {
        Ok(connection) => connection?.close().await,
        Err(_elapsed) => Err(sqlx::Error::PoolTimedOut),
    }
}
