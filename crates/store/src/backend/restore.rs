//! The refusals of a restore that both backends check the same way.

use chrono::{DateTime, Utc};

use crate::RestoreError;

/// What a backend read of a log entry before restoring it.
#[derive(Debug)]
pub struct EntryState {
    pub plant_id: i64,
    pub has_snapshot: bool,
    pub restored_at: Option<DateTime<Utc>>,
    pub restored_by: Option<String>,
    /// A plant with the entry's id is in `plants` now.
    pub plant_exists: bool,
}

impl EntryState {
    /// Refuses a restore that cannot be done whatever the table's columns are, checked in
    /// the order a user would fix them.
    pub fn restorable(self) -> Result<(), RestoreError> {
        if let Some(at) = self.restored_at {
            return Err(RestoreError::AlreadyRestored {
                at,
                by: self.restored_by.unwrap_or_default(),
            });
        }
        if !self.has_snapshot {
            return Err(RestoreError::NoSnapshot);
        }
        if self.plant_exists {
            return Err(RestoreError::PlantExists(self.plant_id));
        }
        Ok(())
    }
}

/// The columns of `plants` now (`table`) against those of a snapshot, each list sorted.
pub fn column_changes(table: &[String], snapshot: &[String]) -> Result<(), RestoreError> {
    let mut missing: Vec<String> = table
        .iter()
        .filter(|c| !snapshot.contains(c))
        .cloned()
        .collect();
    let mut unknown: Vec<String> = snapshot
        .iter()
        .filter(|c| !table.contains(c))
        .cloned()
        .collect();
    if missing.is_empty() && unknown.is_empty() {
        return Ok(());
    }
    missing.sort();
    unknown.sort();
    Err(RestoreError::ColumnsChanged { missing, unknown })
}
