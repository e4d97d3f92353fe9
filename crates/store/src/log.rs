//! The deletion log as the admin commands see it: entries, filters, refused restores.

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;

use crate::StoreError;

/// A row of `plantstore_deletions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletionRecord {
    pub id: i64,
    pub plant_id: i64,
    /// The token's name, or `jwt:<subject>`.
    pub caller: String,
    pub request_id: String,
    pub idempotency_key: Option<String>,
    pub deleted_at: DateTime<Utc>,
    /// The deleted row as a JSON object; `None` for entries from before snapshots were kept.
    pub snapshot: Option<String>,
    pub restored_at: Option<DateTime<Utc>>,
    pub restored_by: Option<String>,
}

impl DeletionRecord {
    /// The snapshot as the database stored it, not parsed: parsing would round a NUMERIC
    /// of many digits to a double, and refuse the 9e999 SQLite writes for an infinite
    /// REAL. Should it not be JSON, a JSON string of it.
    pub fn snapshot_json(&self) -> Option<Box<RawValue>> {
        let text = self.snapshot.as_deref()?;
        Some(
            RawValue::from_string(text.to_owned())
                .or_else(|_| serde_json::value::to_raw_value(text))
                .unwrap_or_default(),
        )
    }
}

/// `None` matches all.
#[derive(Debug, Clone, Default)]
pub struct DeletionFilter {
    pub plant_id: Option<i64>,
    pub caller: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub limit: i64,
}

/// Each reads as the end of one line: "cannot restore deletion 12: …".
#[derive(Debug, Clone, thiserror::Error)]
pub enum RestoreError {
    #[error("no deletion log entry has id {0}")]
    NoSuchEntry(i64),

    #[error("it was already restored at {at} by '{by}'")]
    AlreadyRestored { at: DateTime<Utc>, by: String },

    #[error(
        "it was logged before the deletion log kept snapshots, so there is nothing to put back"
    )]
    NoSnapshot,

    #[error("a plant with id {0} exists again; delete or renumber it first")]
    PlantExists(i64),

    /// Restoring would drop a value or leave a column the snapshot cannot fill.
    #[error("the plants table changed since the delete ({})", columns_changed(.missing, .unknown))]
    ColumnsChanged {
        /// Columns of the table now that the snapshot has no value for.
        missing: Vec<String>,
        /// Columns of the snapshot the table no longer has.
        unknown: Vec<String>,
    },

    #[error("a row the plant referred to (a foreign key) no longer exists")]
    ForeignKeyGone,

    #[error("another plant already holds one of its unique values")]
    UniqueConflict,

    #[error(transparent)]
    Store(#[from] StoreError),
}

fn columns_changed(missing: &[String], unknown: &[String]) -> String {
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("no value for {}", missing.join(", ")));
    }
    if !unknown.is_empty() {
        parts.push(format!("no column for {}", unknown.join(", ")));
    }
    parts.join("; ")
}

impl RestoreError {
    /// Sorts a failed insert of the snapshot: a foreign key gone, a unique value taken since.
    pub fn from_insert(err: StoreError) -> Self {
        match err {
            StoreError::Referenced => RestoreError::ForeignKeyGone,
            StoreError::Duplicate => RestoreError::UniqueConflict,
            other => RestoreError::Store(other),
        }
    }
}
