//! Which SQLite failures are worth a retry: driver errors sorted by kind and result code,
//! never by message text.

use plantstore_store::StoreError;

/// SQLite result codes (low byte of the extended code) after which the same request may
/// well succeed later: busy or locked by another connection, the file read-only or
/// unreadable now, a disk I/O error, the disk full, the file not openable.
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_READONLY: i32 = 8;
const SQLITE_IOERR: i32 = 10;
const SQLITE_FULL: i32 = 13;
const SQLITE_CANTOPEN: i32 = 14;

pub(crate) fn classify(err: sqlx::Error) -> StoreError {
    StoreError::classify(err, |db| {
        matches!(
            primary_code(db),
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

/// Whether another connection's write lock outlasted the busy wait.
pub(crate) fn is_busy(err: &StoreError) -> bool {
    let StoreError::Unavailable(cause) = err else {
        return false;
    };
    cause.as_database_error().and_then(primary_code) == Some(SQLITE_BUSY)
}

/// The primary result code: the low byte of the extended one.
fn primary_code(db: &(impl sqlx::error::DatabaseError + ?Sized)) -> Option<i32> {
    Some(db.code()?.parse::<i32>().ok()? & 0xff)
}
