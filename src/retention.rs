//! The deletion log kept to its retention: one instance at a time, by a lease on the chore,
//! prunes in small batches with a pause between them, so that deletes never wait long
//! behind a prune. `plantstore deletions prune` uses the same batches.

use std::{future::Future, sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use plantstore_store::{PRUNE_BATCH, Store, StoreError, time::before_now};

use crate::telemetry::Metrics;

/// The lease's name in `plantstore_leases`.
const CHORE: &str = "deletion_log_retention";
const EVERY: Duration = Duration::from_secs(60);
/// How long a lease lasts unrenewed; the holder renews it before each batch and round.
const CHORE_LEASE: Duration = Duration::from_secs(180);
/// The pause between batches, in which deletes commit: a shorter one let pruning a backlog
/// on PostgreSQL raise deletes' p99 at full load past the guard (bench/JOURNAL.md,
/// "retention on PostgreSQL, profiled and paced").
const PAUSE: Duration = Duration::from_millis(200);

/// Prunes entries deleted before `before` in batches while `may_go_on`; how many went.
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
        let batch = store.prune_deletions(before).await?;
        pruned += batch;
        if batch < PRUNE_BATCH {
            break;
        }
        tokio::time::sleep(PAUSE).await;
    }
    Ok(pruned)
}

pub(crate) struct Pruning {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) kept: Duration,
    pub(crate) owner: Arc<str>,
    pub(crate) metrics: Arc<Metrics>,
}

impl Pruning {
    /// Prunes each `EVERY` while holding the chore's lease, until `stop`, then releases it
    /// for the next instance at once. A batch cut short by `stop` commits nothing.
    pub(crate) async fn run(self, stop: impl Future<Output = ()>) {
        tokio::select! {
            () = self.prune_each_round() => {}
            () = stop => {}
        }
        if let Err(err) = self.store.release_chore(CHORE, &self.owner).await {
            tracing::warn!(error = %err, "cannot give back the deletion log's pruning lease");
        }
    }

    async fn prune_each_round(&self) {
        let mut rounds = tokio::time::interval(EVERY);
        rounds.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            rounds.tick().await;
            let Some(before) = before_now(self.kept) else {
                // A retention reaching back before any date: nothing is that old.
                continue;
            };
            let holds = || self.store.claim_chore(CHORE, &self.owner, CHORE_LEASE);
            match prune(self.store.as_ref(), before, holds).await {
                Ok(0) => {}
                Ok(pruned) => {
                    self.metrics.pruned(pruned);
                    tracing::info!(pruned, %before, "pruned the deletion log to its retention");
                    // Read now: the gauges' own read is a minute away.
                    match self.store.log_size().await {
                        Ok(size) => self.metrics.log_size(size),
                        Err(err) => {
                            tracing::debug!(error = %err, "cannot read the deletion log's size")
                        }
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "cannot prune the deletion log to its retention")
                }
            }
        }
    }
}
