//! Times computed from now, kept within what every backend can store.

use chrono::{DateTime, Utc};

/// `None` when `duration` before now is before any date the log can hold.
pub fn before_now(duration: std::time::Duration) -> Option<DateTime<Utc>> {
    chrono::Duration::from_std(duration)
        .ok()
        .and_then(|duration| Utc::now().checked_sub_signed(duration))
}

/// The last time every backend keeps in order: SQLite stores times as text, where a year
/// past 9999 (`+10000-…`) would sort before every other.
pub const LAST_STORABLE_TIME: DateTime<Utc> =
    match DateTime::<Utc>::from_timestamp_secs(253_402_300_799) {
        Some(time) => time,
        None => panic!("9999-12-31T23:59:59Z is a time"),
    };

/// `span` after `from`; `None` past [`LAST_STORABLE_TIME`].
pub fn storable_after(from: DateTime<Utc>, span: std::time::Duration) -> Option<DateTime<Utc>> {
    chrono::Duration::from_std(span)
        .ok()
        .and_then(|span| from.checked_add_signed(span))
        .filter(|time| *time <= LAST_STORABLE_TIME)
}
