//! What the backends share to implement the interface, and the service never uses: the
//! group commit, deadlines on database waits, kept connections, commit news, the rows
//! both select, and the checks both make.

mod batch_connections;
mod batch_result;
mod batcher;
mod commit_news;
mod deadline;
mod restore;
mod rows;
mod schema;

pub use batch_connections::BatchConnections;
pub use batch_result::BatchResult;
pub use batcher::{BatchWriter, Batcher, DeletionOutcome, only_outcome, replay_or_reuse};
pub use commit_news::CommitNews;
pub use deadline::{
    LimitedConnection, WaitLimit, earliest, remaining, statement_share, wait_until,
};
pub use restore::{EntryState, column_changes};
pub use rows::{EndpointRow, EventRow, LeaseRow, event_list};
pub use schema::{SchemaFacts, probe, schema_verdict};

/// `StoreError::NotFound` when a statement that names one row by its key changed none.
pub fn found(rows_affected: u64) -> Result<(), crate::StoreError> {
    if rows_affected == 0 {
        Err(crate::StoreError::NotFound)
    } else {
        Ok(())
    }
}
