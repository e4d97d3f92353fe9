//! The one error type every backend reports, sorted by what a caller can do about it.

use sqlx::error::ErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,

    /// A foreign key elsewhere still points at the row.
    #[error("the row is still referenced by another table")]
    Referenced,

    /// A unique key (such as a token name) is already taken.
    #[error("already exists")]
    Duplicate,

    /// The database cannot be reached now, or no connection freed up in time; retrying
    /// later may succeed.
    #[error("the database is unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),

    /// The connection settings cannot be used (for example a malformed URL).
    #[error("{0}")]
    Config(String),

    /// The database lacks what the service needs (for example `plants.id`).
    #[error("{0}")]
    Schema(String),

    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),

    #[error("database error: {0}")]
    Other(#[source] sqlx::Error),
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
                _ if is_transient(db.as_ref()) => StoreError::Unavailable(err),
                _ => StoreError::Other(err),
            },
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => StoreError::Unavailable(err),
            sqlx::Error::RowNotFound => StoreError::NotFound,
            _ => StoreError::Other(err),
        }
    }
}
