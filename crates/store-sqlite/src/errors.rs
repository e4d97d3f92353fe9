//! Which SQLite failures are worth a retry: by kind and result code, never by message text.

use plantstore_store::StoreError;

/// SQLite result codes (low byte of the extended code) after which the same request may
/// well succeed later: busy (5) or locked (6) by another connection, the file read-only (8)
/// or unreadable now, a disk I/O error (10), the disk full (13), the file not openable (14).
const TRANSIENT_CODES: [i32; 6] = [5, 6, 8, 10, 13, 14];
const SQLITE_BUSY: i32 = 5;

pub(crate) fn classify(err: sqlx::Error) -> StoreError {
    StoreError::classify(err, |db| {
        primary_code(db).is_some_and(|code| TRANSIENT_CODES.contains(&code))
    })
}

/// Whether another connection's write lock outlasted the busy wait.
pub(crate) fn is_busy(err: &StoreError) -> bool {
    let StoreError::Unavailable(cause) = err else {
        return false;
    };
    cause.as_database_error().and_then(primary_code) == Some(SQLITE_BUSY)
}

fn primary_code(db: &(impl sqlx::error::DatabaseError + ?Sized)) -> Option<i32> {
    Some(db.code()?.parse::<i32>().ok()? & 0xff)
}
