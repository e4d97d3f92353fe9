//! Group commit: deletes that queue while a commit is in flight go out together in the
//! next one, and each request is told its own outcome.

use std::{
    collections::{HashMap, hash_map::Entry},
    fmt,
    sync::Arc,
};

use async_trait::async_trait;
use tokio::sync::{Mutex, mpsc, oneshot};

use plantstore_store::{CommitObserver, Deleted, Deletion, StoreError, backend::CommitNews};

use crate::{
    deadline::remaining,
    outcome::{DeletionOutcome, one_each, replay_or_reuse},
};

/// Most deletions in one transaction: bounds a statement's size and one batch's latency.
const MAX_BATCH: usize = 256;
/// Requests that may wait for a commit worker; past it, senders wait too.
const QUEUE_DEPTH: usize = 4 * MAX_BATCH;

/// How one backend commits; the batcher decides what goes into each commit.
///
/// Every wait of either method, for a connection, a lock or a statement, ends by the
/// earliest deadline of its deletions (`earliest`), with `StoreError::TimedOut` or the
/// database's own timeout error; nothing is sent once it has passed.
#[async_trait]
pub trait BatchWriter: Send + Sync + 'static {
    /// Deletes distinct plants and writes their audit rows in one transaction, returning
    /// one outcome per deletion, in order. No two deletions share an idempotency key.
    /// After an error nothing of the batch is committed, unless it struck during the
    /// commit itself, when nobody can tell.
    async fn delete_batch(&self, batch: &[Deletion]) -> Result<Vec<DeletionOutcome>, StoreError>;

    /// Deletes one plant in a transaction of its own, waiting for its row if another
    /// session holds it; never answers `DeletionOutcome::RowLocked`.
    async fn delete_one(&self, deletion: &Deletion) -> Result<DeletionOutcome, StoreError>;
}

type Reply = oneshot::Sender<Result<Deleted, StoreError>>;

struct Job {
    deletion: Deletion,
    reply: Reply,
}

/// The queue in front of a backend's writer. Cloning it shares the queue.
#[derive(Clone)]
pub struct Batcher {
    queue: mpsc::Sender<Job>,
}

/// What every commit worker shares: the writer, the queue, and whom it tells of commits.
#[derive(Clone)]
struct CommitWorker {
    writer: Arc<dyn BatchWriter>,
    receiver: Arc<Mutex<mpsc::Receiver<Job>>>,
    /// Told each batch's size, when the store was opened with an observer.
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
    /// Starts `workers` commit workers on one queue; `news` is bumped after each commit
    /// that deleted a plant, and `sizes` told each batch's size. No timer: a worker takes
    /// whatever queued while its previous commit ran, so a request alone waits for
    /// nothing extra. The workers end when the last clone of the batcher is dropped.
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

    /// How many requests wait for a commit now.
    pub fn queued(&self) -> usize {
        QUEUE_DEPTH - self.queue.capacity()
    }

    /// Deletes one plant with the next commit; `StoreError::NotFound` when it is not there.
    ///
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

/// One batch: the first request for each id, and for each caller's idempotency key, goes
/// into the transaction; repeats learn from its outcome where that settles theirs (after a
/// delete the row is gone for them; the same key is a replay) and are tried alone after it
/// where it does not.
#[tracing::instrument(level = "debug", skip_all, fields(size))]
async fn commit(worker: &CommitWorker, jobs: impl Iterator<Item = Job>) {
    let writer = &worker.writer;
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

    let outcomes = writer.delete_batch(&deletions).await;
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
        Err(err) => fail_all(replies, repeats, &err),
    }
}

/// What a repeat of `first` in the same batch is answered, given `first`'s outcome; `None`
/// when that does not settle it and it must be tried alone.
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

/// The job, unless its request is answered already (withdrawn, or its deadline passed):
/// nothing is deleted for a caller that is no longer waiting.
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

fn fail_all(replies: Vec<Reply>, repeats: Vec<(usize, Job)>, err: &StoreError) {
    let repeated = repeats.into_iter().map(|(_, job)| job.reply);
    for reply in replies.into_iter().chain(repeated) {
        let _ = reply.send(Err(err.clone()));
    }
}
