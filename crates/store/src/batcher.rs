//! Group commit: deletes that queue while a commit is in flight go out together in the
//! next one, and each request is told its own outcome.

use std::{
    collections::{HashMap, hash_map::Entry},
    fmt,
    sync::{Arc, OnceLock},
};

use async_trait::async_trait;
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::{CommitObserver, Deleted, Deletion, StoreError, remaining};

/// Most deletions in one transaction: bounds a statement's size and one batch's latency.
const MAX_BATCH: usize = 256;
/// Requests that may wait for a lane; past it, senders wait too.
const QUEUE_DEPTH: usize = 4 * MAX_BATCH;

/// What a backend says about one deletion of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Deleted,
    NotFound,
    /// Another session holds the row: it is retried alone, waiting for the row, so the
    /// rest of its batch is not held up.
    Held,
    /// The caller's idempotency key already deleted this plant; nothing was done now.
    Replayed,
    /// The caller's idempotency key already deleted another plant, this one; nothing was
    /// done now.
    KeyReused(i64),
}

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
    async fn delete_batch(&self, batch: &[Deletion]) -> Result<Vec<Outcome>, StoreError>;

    /// Deletes one plant in a transaction of its own, waiting for its row if another
    /// session holds it; never answers `Outcome::Held`.
    async fn delete_one(&self, deletion: &Deletion) -> Result<Outcome, StoreError>;
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
    /// Where each batch's size is recorded, once the service asks (`Store::observe`).
    sizes: Arc<OnceLock<Arc<dyn CommitObserver>>>,
}

impl fmt::Debug for Batcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("queued", &self.queued())
            .finish()
    }
}

impl Batcher {
    /// Starts `lanes` workers on one queue. No timer: a lane takes whatever queued while
    /// its previous commit ran, so a request alone waits for nothing extra. The workers
    /// end when the last clone of the batcher is dropped.
    pub fn start(writer: Arc<dyn BatchWriter>, lanes: usize) -> Self {
        let (queue, receiver) = mpsc::channel(QUEUE_DEPTH);
        let receiver = Arc::new(Mutex::new(receiver));
        let sizes = Arc::new(OnceLock::new());
        for _ in 0..lanes.max(1) {
            let lane = Lane {
                writer: Arc::clone(&writer),
                receiver: Arc::clone(&receiver),
                sizes: Arc::clone(&sizes),
            };
            tokio::spawn(supervise(lane));
        }
        Self { queue, sizes }
    }

    /// Tells `sizes` the size of every batch from now on.
    pub fn observe(&self, sizes: Arc<dyn CommitObserver>) {
        let _ = self.sizes.set(sizes);
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
        answer.await.unwrap_or(Err(StoreError::Stopped))
    }
}

/// Keeps a lane running: a panic in one commit fails that batch's requests (their replies
/// are dropped, so they answer `Stopped`), not every later one.
async fn supervise(lane: Lane) {
    loop {
        match tokio::spawn(run_lane(lane.clone())).await {
            Ok(()) => return,
            Err(err) => tracing::error!(error = %err, "a group-commit lane stopped; restarting it"),
        }
    }
}

/// What one worker of the queue holds.
#[derive(Clone)]
struct Lane {
    writer: Arc<dyn BatchWriter>,
    receiver: Arc<Mutex<mpsc::Receiver<Job>>>,
    sizes: Arc<OnceLock<Arc<dyn CommitObserver>>>,
}

async fn run_lane(
    Lane {
        writer,
        receiver,
        sizes,
    }: Lane,
) {
    let mut jobs = Vec::with_capacity(MAX_BATCH);
    loop {
        // The lock is held only while waiting for work, so another lane takes the next
        // batch while this one commits.
        if receiver.lock().await.recv_many(&mut jobs, MAX_BATCH).await == 0 {
            return;
        }
        commit(&writer, jobs.drain(..), sizes.get()).await;
    }
}

/// One batch: the first request for each id, and for each caller's idempotency key, goes
/// into the transaction; repeats learn from its outcome where that settles theirs (after a
/// delete the row is gone for them; the same key is a replay) and are tried alone after it
/// where it does not.
#[tracing::instrument(level = "debug", skip_all, fields(size))]
async fn commit(
    writer: &Arc<dyn BatchWriter>,
    jobs: impl Iterator<Item = Job>,
    sizes: Option<&Arc<dyn CommitObserver>>,
) {
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
    if let Some(sizes) = sizes {
        sizes.batch_committed(deletions.len());
    }

    let outcomes = writer.delete_batch(&deletions).await;
    match outcomes.and_then(|outcomes| one_each(deletions.len(), outcomes)) {
        Ok(outcomes) => {
            for (index, job) in repeats {
                match repeat_outcome(&deletions[index], outcomes[index], &job.deletion) {
                    Some(outcome) => {
                        let _ = job.reply.send(answer(outcome));
                    }
                    None => retry_alone(writer, job.deletion, job.reply),
                }
            }
            for ((deletion, reply), outcome) in deletions.into_iter().zip(replies).zip(outcomes) {
                match outcome {
                    Outcome::Held => retry_alone(writer, deletion, reply),
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
                retry_alone(writer, deletion, reply);
            }
            for (_, job) in repeats {
                retry_alone(writer, job.deletion, job.reply);
            }
        }
        Err(err) => fail_all(replies, repeats, &err),
    }
}

/// A backend's outcomes for a batch of `size`: one each, in order. Any other count is a
/// broken promise and an error for the whole batch, never a guessed answer.
fn one_each(size: usize, outcomes: Vec<Outcome>) -> Result<Vec<Outcome>, StoreError> {
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

/// The outcome of a batch of one deletion, as `one_each` checks it.
pub fn sole_outcome(outcomes: Vec<Outcome>) -> Result<Outcome, StoreError> {
    let mut outcomes = one_each(1, outcomes)?.into_iter();
    outcomes
        .next()
        .ok_or(StoreError::Broken("one outcome per deletion of a batch"))
}

/// What a repeat of `first` in the same batch is answered, given `first`'s outcome; `None`
/// when that does not settle it and it must be tried alone.
fn repeat_outcome(first: &Deletion, outcome: Outcome, repeat: &Deletion) -> Option<Outcome> {
    let deleted_by_key = matches!(outcome, Outcome::Deleted | Outcome::Replayed);
    if first.same_key_as(repeat) && deleted_by_key {
        return Some(if first.plant_id == repeat.plant_id {
            Outcome::Replayed
        } else {
            Outcome::KeyReused(first.plant_id)
        });
    }
    let row_gone = matches!(outcome, Outcome::Deleted | Outcome::NotFound);
    if first.plant_id == repeat.plant_id && row_gone && repeat.idempotency_key.is_none() {
        return Some(Outcome::NotFound);
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

/// Runs a deletion on its own task, so a wait for one row never holds up the lane.
fn retry_alone(writer: &Arc<dyn BatchWriter>, deletion: Deletion, reply: Reply) {
    let writer = Arc::clone(writer);
    tokio::spawn(async move {
        let Some(Job { deletion, reply }) = still_waited_for(Job { deletion, reply }) else {
            return;
        };
        let outcome = writer.delete_one(&deletion).await;
        let _ = reply.send(outcome.and_then(answer));
    });
}

fn answer(outcome: Outcome) -> Result<Deleted, StoreError> {
    match outcome {
        Outcome::Deleted => Ok(Deleted::Now),
        Outcome::Replayed => Ok(Deleted::Replayed),
        Outcome::NotFound => Err(StoreError::NotFound),
        Outcome::KeyReused(plant_id) => Err(StoreError::KeyReused { plant_id }),
        // `delete_one` never answers it; should a backend do so, the outcome is unknown.
        Outcome::Held => Err(StoreError::Stopped),
    }
}

fn fail_all(replies: Vec<Reply>, repeats: Vec<(usize, Job)>, err: &StoreError) {
    let repeated = repeats.into_iter().map(|(_, job)| job.reply);
    for reply in replies.into_iter().chain(repeated) {
        let _ = reply.send(Err(err.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_answered_with_the_wrong_number_of_outcomes_is_an_error() {
        assert!(matches!(
            one_each(2, vec![Outcome::Deleted]),
            Err(StoreError::Broken(_))
        ));
        assert!(matches!(sole_outcome(vec![]), Err(StoreError::Broken(_))));
        assert!(matches!(
            sole_outcome(vec![Outcome::NotFound, Outcome::Deleted]),
            Err(StoreError::Broken(_))
        ));
        assert_eq!(
            sole_outcome(vec![Outcome::NotFound]).ok(),
            Some(Outcome::NotFound)
        );
    }
}
