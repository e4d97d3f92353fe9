//! Which PostgreSQL failures are worth a retry: driver errors sorted by kind and
//! SQLSTATE, never by message text.

use std::sync::Arc;

use plantstore_store::StoreError;

/// SQLSTATE classes and codes after which the same request may well succeed later:
/// connection exceptions, insufficient resources, operator intervention (shutdowns,
/// `cannot_connect_now`), the serialization failures a retry resolves, and a server that
/// will not take writes now (`read_only_sql_transaction`: in recovery, or read-only after a
/// failover). Whatever fails while a connection is being got or opened is unavailable too,
/// whatever its code (see `connection`).
const TRANSIENT_CLASSES: [&str; 3] = ["08", "53", "57P"];
const TRANSIENT_CODES: [&str; 3] = ["25006", "40001", "40P01"];
/// What the limits set from a request's deadline raise (`limits`): lock_not_available
/// (`lock_timeout`) and query_canceled (`statement_timeout`, or a DBA's cancel).
const DEADLINE_CODES: [&str; 2] = ["55P03", "57014"];

/// Any failure to get a connection (refused, database gone or not accepting connections,
/// password rotated, too many clients, TLS refused, pool exhausted) means the database
/// cannot serve now: decided by where it happened, not by a list of codes.
pub(crate) fn unavailable(err: sqlx::Error) -> StoreError {
    StoreError::Unavailable(Arc::new(err))
}

pub(crate) fn classify(err: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(db) = &err
        && db
            .code()
            .is_some_and(|code| DEADLINE_CODES.contains(&code.as_ref()))
    {
        return StoreError::TimedOut;
    }
    StoreError::classify(err, |db| {
        db.code().is_some_and(|code| {
            TRANSIENT_CODES.contains(&code.as_ref())
                || TRANSIENT_CLASSES
                    .iter()
                    .any(|class| code.starts_with(class))
        })
    })
}
