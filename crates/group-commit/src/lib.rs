//! The group commit under every delete: deletes that queue while a commit is in flight go
//! out together in the next one, each request is told its own outcome, and no wait outlasts
//! the request's deadline. A backend commits through `BatchWriter` (its `group_commit.rs`).

mod batcher;
mod deadline;
mod kept_connections;

pub use batcher::{
    BatchResult, BatchWriter, Batcher, DeletionOutcome, only_outcome, replay_or_reuse,
};
pub use deadline::{
    LimitedConnection, WaitLimit, earliest, remaining, statement_share, wait_until,
};
pub use kept_connections::KeptConnections;
