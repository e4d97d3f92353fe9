//! What the backends share to implement the interface, and the service never uses: commit
//! news, the rows both select, and the checks both make. The group commit has a crate of
//! its own, `plantstore-group-commit`.

mod commit_news;
mod restore;
mod rows;
mod schema;

pub use commit_news::CommitNews;
pub use restore::{EntryState, column_changes};
pub use rows::{EndpointRow, EventRow, LeaseRow, event_list};
pub use schema::{SchemaFacts, probe, schema_verdict};

/// `StoreError::NotFound` when a statement that names one row by its key changed none.
pub fn not_found_if_none(rows_affected: u64) -> Result<(), crate::StoreError> {
    if rows_affected == 0 {
        Err(crate::StoreError::NotFound)
    } else {
        Ok(())
    }
}
