//! The group commit, the service's core machinery under every delete: deletes that queue
//! while a commit is in flight go out together in the next one, each request is told its
//! own outcome, and no wait outlasts the request's deadline.
//!
//! `batcher.rs` decides what goes into each commit, and reads what a batch statement found
//! into each deletion's outcome; a backend says how it commits one by implementing
//! `BatchWriter` (each backend's `group_commit.rs`). `deadline.rs` bounds every wait and
//! says where; `kept_connections.rs` keeps the writers' connections between batches.

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
