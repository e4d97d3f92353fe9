//! The deletion log kept to `PLANTSTORE_DELETION_RETENTION`: one instance at a time, by a
//! lease on the chore, prunes the entries older than the retention that no destination still
//! needs, in small batches with a pause between them, so that deletes never wait long behind
//! a prune. `plantstore deletions prune` uses the same batches.

use std::{future::Future, sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use plantstore_store::{Store, StoreError, time::before_now};

use crate::telemetry::Metrics;

/// The lease's name in `plantstore_leases`.
const CHORE: &str = "deletion_log_retention";
/// How often the holder prunes, starting at the instance's start.
const EVERY: Duration = Duration::from_secs(60);
/// How long a lease lasts unrenewed: past it, after a crash, another instance takes over.
/// The holder renews it before each batch and each round.
const LEASE: Duration = Duration::from_secs(180);
/// Entries per batch: one short statement, so a delete waits at most that long for it.
const BATCH: i64 = 500;
/// The pause between batches, in which deletes commit.
const PAUSE: Duration = Duration::from_millis(50);

/// Prunes the entries deleted before `before` in batches, while `may_go_on` says so before
/// each; how many went.
pub(crate) async fn prune<F, Next>(
    store: &dyn Store,
    before: DateTime<Utc>,
    mut may_go_on: F,
) -> Result<u64, StoreError>
where
    F: FnMut() -> Next,
    Next: Future<Output = Result<bool, StoreError>>,
{
    let mut pruned = 0;
    while may_go_on().await? {
        let batch = store.prune_deletions(before, BATCH).await?;
        pruned += batch;
        if batch < BATCH.unsigned_abs() {
            break;
        }
        tokio::time::sleep(PAUSE).await;
    }
    Ok(pruned)
}

/// This instance's part in keeping the log to its retention.
pub(crate) struct Retention {
    pub(crate) store: Arc<dyn Store>,
    /// How long an entry is kept.
    pub(crate) kept: Duration,
    /// This instance's name in the lease, as in the webhook leases.
    pub(crate) owner: Arc<str>,
    pub(crate) metrics: Arc<Metrics>,
}

impl Retention {
    /// Prunes every `EVERY` while this instance holds the chore's lease, for ever (the task
    /// is aborted when the instance stops; a batch cut short commits nothing).
    pub(crate) async fn run(self) {
        let mut rounds = tokio::time::interval(EVERY);
        rounds.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            rounds.tick().await;
            let Some(before) = before_now(self.kept) else {
                // A retention reaching back before any date: nothing is that old.
                continue;
            };
            let holds = || self.store.claim_chore(CHORE, &self.owner, LEASE);
            match prune(self.store.as_ref(), before, holds).await {
                Ok(0) => {}
                Ok(pruned) => {
                    self.metrics.pruned(pruned);
                    tracing::info!(pruned, %before, "pruned the deletion log to its retention")
                }
                Err(err) => {
                    tracing::warn!(error = %err, "cannot prune the deletion log to its retention")
                }
            }
        }
    }
}
