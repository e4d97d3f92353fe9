//! What goes into each commit, and each request's outcome. Reading what a backend's batch
//! statement found into those outcomes is shared here too (`BatchResult`).

use std::{
    collections::{HashMap, HashSet, hash_map::Entry},
    fmt,
    sync::Arc,
};

use async_trait::async_trait;
use tokio::sync::{Mutex, mpsc, oneshot};

use plantstore_store::{CommitObserver, Deleted, Deletion, StoreError, backend::CommitNews};

use crate::deadline::remaining;

/// Most deletions in one transaction: bounds a statement's size and one batch's latency.
const MAX_BATCH: usize = 256;
/// Requests that may wait for a commit worker; past it, senders wait too.
const QUEUE_DEPTH: usize = 4 * MAX_BATCH;

/// Every wait of either method ends by its deletions' `earliest` deadline (`TimedOut` or the
/// database's own timeout error); nothing is sent once it has passed.
#[async_trait]
pub trait BatchWriter: Send + Sync + 'static {
    /// Distinct plants, no two sharing a key, in one transaction; one outcome per deletion,
    /// in order. After an error nothing is committed, unless it struck during the commit
    /// itself, when nobody can tell.
    async fn delete_batch(&self, batch: &[Deletion]) -> Result<Vec<DeletionOutcome>, StoreError>;

    /// In a transaction of its own, waiting for the row if another session holds it; never
    /// answers `DeletionOutcome::RowLocked`.
    async fn delete_one(&self, deletion: &Deletion) -> Result<DeletionOutcome, StoreError>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeletionOutcome {
    /// Gone and audited, in this batch.
    Removed,
    NotFound,
    /// Another session holds the row: retried alone, not holding up the rest of its batch.
    RowLocked,
    /// The caller's key already deleted this plant; nothing was done now.
    Replayed,
    /// The caller's key already deleted this other plant; nothing was done now.
    KeyReused(i64),
}

/// Any other count than one each is an error for the whole batch, never a guessed answer.
pub(crate) fn one_each(
    size: usize,
    outcomes: Vec<DeletionOutcome>,
) -> Result<Vec<DeletionOutcome>, StoreError> {
    if outcomes.len() == size {
        return Ok(outcomes);
    }
    tracing::error!(
        expected = size,
        got = outcomes.len(),
        "a backend answered a batch with the wrong number of outcomes"
    );
    Err(StoreError::Broken("one outcome per deletion of a batch"))
}

/// As `one_each` checks it.
pub fn only_outcome(outcomes: Vec<DeletionOutcome>) -> Result<DeletionOutcome, StoreError> {
    Ok(one_each(1, outcomes)?[0])
}

/// A replay when the caller's key already deleted this plant, a reused key when another.
pub fn replay_or_reuse(deletion: &Deletion, earlier: Option<i64>) -> Option<DeletionOutcome> {
    earlier.map(|plant_id| {
        if plant_id == deletion.plant_id {
            DeletionOutcome::Replayed
        } else {
            DeletionOutcome::KeyReused(plant_id)
        }
    })
}

#[derive(Debug, Default)]
pub struct BatchResult {
    pub removed: HashSet<i64>,
    /// Plants still there after the statement: another session holds them (PostgreSQL
    /// skips locked rows), so they are retried alone. Always empty on SQLite.
    pub present: HashSet<i64>,
    /// Batch positions (from 0) whose caller's key already deleted a plant, and that plant.
    pub earlier: HashMap<usize, i64>,
}

impl BatchResult {
    pub fn outcomes(&self, batch: &[Deletion]) -> Vec<DeletionOutcome> {
        batch
            .iter()
            .enumerate()
            .map(|(index, deletion)| {
                let earlier = self.earlier.get(&index).copied();
                replay_or_reuse(deletion, earlier).unwrap_or_else(|| {
                    if self.removed.contains(&deletion.plant_id) {
                        DeletionOutcome::Removed
                    } else if self.present.contains(&deletion.plant_id) {
                        DeletionOutcome::RowLocked
                    } else {
                        DeletionOutcome::NotFound
                    }
                })
            })
            .collect()
    }
}

type Reply = oneshot::Sender<Result<Deleted, StoreError>>;

struct Job {
    deletion: Deletion,
    reply: Reply,
}

/// The queue in front of a backend's writer; clones share it.
#[derive(Clone)]
pub struct Batcher {
    queue: mpsc::Sender<Job>,
}

#[derive(Clone)]
struct CommitWorker {
    writer: Arc<dyn BatchWriter>,
    receiver: Arc<Mutex<mpsc::Receiver<Job>>>,
    sizes: Option<Arc<dyn CommitObserver>>,
    news: CommitNews,
}

impl fmt::Debug for Batcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("queued", &self.queued())
            .finish()
    }
}

impl Batcher {
    /// No timer: a worker takes whatever queued while its previous commit ran, so a request
    /// alone waits for nothing extra. The workers end when the last clone is dropped.
    pub fn start(
        writer: Arc<dyn BatchWriter>,
        workers: usize,
        news: CommitNews,
        sizes: Option<Arc<dyn CommitObserver>>,
    ) -> Self {
        let (queue, receiver) = mpsc::channel(QUEUE_DEPTH);
        let worker = CommitWorker {
            writer,
            receiver: Arc::new(Mutex::new(receiver)),
            sizes,
            news,
        };
        for _ in 0..workers.max(1) {
            tokio::spawn(supervise(worker.clone()));
        }
        Self { queue }
    }

    pub fn queued(&self) -> usize {
        QUEUE_DEPTH - self.queue.capacity()
    }

    /// Dropping the future before its batch starts withdraws the request: nothing is
    /// deleted for a caller that is no longer waiting.
    pub async fn delete(&self, deletion: Deletion) -> Result<Deleted, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Job { deletion, reply })
            .await
            .map_err(|_closed| StoreError::Stopped)?;
        // The reply dropped unanswered: its worker ended during the commit.
        answer.await.unwrap_or(Err(StoreError::OutcomeUnknown))
    }
}

/// Keeps a worker running: a panic in one commit fails that batch's requests (their
/// replies are dropped, so they answer `OutcomeUnknown`), not every later one.
async fn supervise(worker: CommitWorker) {
    loop {
        match tokio::spawn(run_worker(worker.clone())).await {
            Ok(()) => return,
            Err(err) => {
                tracing::error!(error = %err, "a group-commit worker stopped; restarting it")
            }
        }
    }
}

async fn run_worker(worker: CommitWorker) {
    let mut jobs = Vec::with_capacity(MAX_BATCH);
    loop {
        // The lock is held only while waiting for work, so another worker takes the next
        // batch while this one commits.
        if worker
            .receiver
            .lock()
            .await
            .recv_many(&mut jobs, MAX_BATCH)
            .await
            == 0
        {
            return;
        }
        commit(&worker, jobs.drain(..)).await;
    }
}

/// The first request for each id, and for each caller's key, goes into the transaction;
/// repeats learn from its outcome where that settles theirs (the row gone; the same key a
/// replay) and are tried alone after it where it does not.
#[tracing::instrument(level = "debug", skip_all, fields(size))]
async fn commit(worker: &CommitWorker, jobs: impl Iterator<Item = Job>) {
    let mut deletions: Vec<Deletion> = Vec::new();
    let mut replies = Vec::new();
    let mut repeats: Vec<(usize, Job)> = Vec::new();
    let mut position = HashMap::new();
    let mut key_position = HashMap::new();
    for job in jobs.filter_map(still_waited_for) {
        let key = job
            .deletion
            .idempotency_key
            .clone()
            .map(|key| (Arc::clone(&job.deletion.caller), key));
        let same_key = key.as_ref().and_then(|key| key_position.get(key).copied());
        match (same_key, position.entry(job.deletion.plant_id)) {
            (Some(first), _) => repeats.push((first, job)),
            (None, Entry::Occupied(first)) => repeats.push((*first.get(), job)),
            (None, Entry::Vacant(slot)) => {
                slot.insert(deletions.len());
                if let Some(key) = key {
                    key_position.insert(key, deletions.len());
                }
                deletions.push(job.deletion);
                replies.push(job.reply);
            }
        }
    }
    if deletions.is_empty() {
        return;
    }
    tracing::Span::current().record("size", deletions.len());

    let outcomes = worker.writer.delete_batch(&deletions).await;
    match outcomes.and_then(|outcomes| one_each(deletions.len(), outcomes)) {
        Ok(outcomes) => {
            if let Some(sizes) = &worker.sizes {
                sizes.batch_committed(deletions.len());
            }
            if outcomes.contains(&DeletionOutcome::Removed) {
                worker.news.bump();
            }
            for (index, job) in repeats {
                match repeat_outcome(&deletions[index], outcomes[index], &job.deletion) {
                    Some(outcome) => {
                        let _ = job.reply.send(answer(outcome));
                    }
                    None => retry_alone(worker, job.deletion, job.reply),
                }
            }
            for ((deletion, reply), outcome) in deletions.into_iter().zip(replies).zip(outcomes) {
                match outcome {
                    DeletionOutcome::RowLocked => retry_alone(worker, deletion, reply),
                    outcome => {
                        let _ = reply.send(answer(outcome));
                    }
                }
            }
        }
        // Which row is still referenced is not knowable from the error without reading its
        // text: every deletion of the batch is tried again alone, and only that row fails.
        Err(StoreError::Referenced) if deletions.len() > 1 => {
            for (deletion, reply) in deletions.into_iter().zip(replies) {
                retry_alone(worker, deletion, reply);
            }
            for (_, job) in repeats {
                retry_alone(worker, job.deletion, job.reply);
            }
        }
        Err(err) => {
            let repeated = repeats.into_iter().map(|(_, job)| job.reply);
            for reply in replies.into_iter().chain(repeated) {
                let _ = reply.send(Err(err.clone()));
            }
        }
    }
}

/// `None` when `first`'s outcome does not settle the repeat's: it must be tried alone.
fn repeat_outcome(
    first: &Deletion,
    outcome: DeletionOutcome,
    repeat: &Deletion,
) -> Option<DeletionOutcome> {
    let deleted_by_key = matches!(
        outcome,
        DeletionOutcome::Removed | DeletionOutcome::Replayed
    );
    if first.same_key_as(repeat) && deleted_by_key {
        return replay_or_reuse(repeat, Some(first.plant_id));
    }
    let row_gone = matches!(
        outcome,
        DeletionOutcome::Removed | DeletionOutcome::NotFound
    );
    if first.plant_id == repeat.plant_id && row_gone && repeat.idempotency_key.is_none() {
        return Some(DeletionOutcome::NotFound);
    }
    None
}

/// The job, unless its request is answered already (withdrawn, or its deadline passed).
fn still_waited_for(job: Job) -> Option<Job> {
    if job.reply.is_closed() {
        return None;
    }
    if let Err(err) = remaining(job.deletion.deadline) {
        let _ = job.reply.send(Err(err));
        return None;
    }
    Some(job)
}

/// Runs a deletion on its own task, so a wait for one row never holds up the worker.
fn retry_alone(worker: &CommitWorker, deletion: Deletion, reply: Reply) {
    let (writer, news) = (Arc::clone(&worker.writer), worker.news.clone());
    tokio::spawn(async move {
        let Some(Job { deletion, reply }) = still_waited_for(Job { deletion, reply }) else {
            return;
        };
        let outcome = writer.delete_one(&deletion).await;
        if matches!(outcome, Ok(DeletionOutcome::Removed)) {
            news.bump();
        }
        let _ = reply.send(outcome.and_then(answer));
    });
}

fn answer(outcome: DeletionOutcome) -> Result<Deleted, StoreError> {
    match outcome {
        DeletionOutcome::Removed => Ok(Deleted::Now),
        DeletionOutcome::Replayed => Ok(Deleted::Replayed),
        DeletionOutcome::NotFound => Err(StoreError::NotFound),
        DeletionOutcome::KeyReused(plant_id) => Err(StoreError::KeyReused { plant_id }),
        // `delete_one` never answers it; should a backend do so, the outcome is unknown.
        DeletionOutcome::RowLocked => Err(StoreError::OutcomeUnknown),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_answered_with_the_wrong_number_of_outcomes_is_an_error() {
        assert!(matches!(
            one_each(2, vec![DeletionOutcome::Removed]),
            Err(StoreError::Broken(_))
        ));
        assert!(matches!(only_outcome(vec![]), Err(StoreError::Broken(_))));
        assert!(matches!(
            only_outcome(vec![DeletionOutcome::NotFound, DeletionOutcome::Removed]),
            Err(StoreError::Broken(_))
        ));
        assert_eq!(
            only_outcome(vec![DeletionOutcome::NotFound]).ok(),
            Some(DeletionOutcome::NotFound)
        );
    }
}
