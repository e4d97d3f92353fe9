//! The one error every backend reports, sorted by what a caller can do about it.

use std::sync::Arc;

use sqlx::error::ErrorKind;

/// Cloneable, so one failed group commit can answer every request in it; the driver's
/// error is shared, not copied.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,

    #[error("the row is still referenced by another table")]
    Referenced,

    #[error("the idempotency key was used for plant {plant_id}")]
    KeyReused { plant_id: i64 },

    #[error("already exists")]
    Duplicate,

    /// Unreachable now, or no connection freed up in time: a retry later may succeed.
    #[error("the database is unavailable: {0}")]
    Unavailable(#[source] Arc<sqlx::Error>),

    #[error("{0}")]
    Config(String),

    #[error("{0}")]
    Schema(String),

    #[error("migration failed: {0}")]
    Migrate(#[source] Arc<sqlx::migrate::MigrateError>),

    /// In recovery, or read-only after a failover.
    #[error("the database accepts no writes now")]
    ReadOnly,

    /// Nothing was sent, or what was sent was cut off before it committed.
    #[error("the request's deadline passed before the database answered")]
    TimedOut,

    /// Shutting down: the request was not started.
    #[error("the store stopped before answering")]
    Stopped,

    /// A group-commit worker ended (a panic) or a backend broke its word while the
    /// request's delete was under way: it may or may not have committed.
    #[error("the outcome of the delete is unknown")]
    OutcomeUnknown,

    /// Cancelled by, say, a pooler's query timeout (docs/operations.md, synchronous standbys).
    #[error(
        "the commit's wait for the synchronous standbys was cancelled: committed here, but a failover may take it back"
    )]
    NotReplicated,

    #[error("database error: {0}")]
    Other(#[source] Arc<sqlx::Error>),

    /// A backend's bug (say, not one outcome per deletion), answered as an error, not a guess.
    #[error("a backend broke its promise: {0}")]
    Broken(&'static str),
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(err: sqlx::migrate::MigrateError) -> Self {
        StoreError::Migrate(Arc::new(err))
    }
}

impl StoreError {
    /// Sorts a driver error by kind, never by its message text. `is_transient` lets a
    /// backend name its own "busy, try again" codes (such as SQLite's `SQLITE_BUSY`).
    pub fn classify(
        err: sqlx::Error,
        is_transient: impl Fn(&dyn sqlx::error::DatabaseError) -> bool,
    ) -> Self {
        match &err {
            sqlx::Error::Database(db) => match db.kind() {
                ErrorKind::ForeignKeyViolation => StoreError::Referenced,
                ErrorKind::UniqueViolation => StoreError::Duplicate,
                _ if is_transient(db.as_ref()) => StoreError::Unavailable(Arc::new(err)),
                _ => StoreError::Other(Arc::new(err)),
            },
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => StoreError::Unavailable(Arc::new(err)),
            sqlx::Error::RowNotFound => StoreError::NotFound,
            _ => StoreError::Other(Arc::new(err)),
        }
    }
}
