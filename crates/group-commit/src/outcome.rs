//! What became of each deletion of a batch: as a backend's batch statement found it, and
//! the one reading of that into each deletion's outcome that every backend shares.

use std::collections::{HashMap, HashSet};

use plantstore_store::{Deletion, StoreError};

/// What a backend says about one deletion of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeletionOutcome {
    /// The row is gone and its audit row written, in this batch.
    Removed,
    NotFound,
    /// Another session holds the row: it is retried alone, waiting for the row, so the
    /// rest of its batch is not held up.
    RowLocked,
    /// The caller's idempotency key already deleted this plant; nothing was done now.
    Replayed,
    /// The caller's idempotency key already deleted another plant, this one; nothing was
    /// done now.
    KeyReused(i64),
}

/// A backend's outcomes for a batch of `size`: one each, in order. Any other count is a
/// broken promise and an error for the whole batch, never a guessed answer.
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

/// The outcome of a batch of one deletion, as `one_each` checks it.
pub fn only_outcome(outcomes: Vec<DeletionOutcome>) -> Result<DeletionOutcome, StoreError> {
    Ok(one_each(1, outcomes)?[0])
}

/// A deletion whose caller's key already deleted `earlier`: a replay when that was this
/// plant, a reused key when it was another. `None` when the key deleted nothing yet.
pub fn replay_or_reuse(deletion: &Deletion, earlier: Option<i64>) -> Option<DeletionOutcome> {
    earlier.map(|plant_id| {
        if plant_id == deletion.plant_id {
            DeletionOutcome::Replayed
        } else {
            DeletionOutcome::KeyReused(plant_id)
        }
    })
}

/// Facts about one batch, as a backend's statement reports them.
#[derive(Debug, Default)]
pub struct BatchResult {
    /// Plants the statement deleted (and audited).
    pub removed: HashSet<i64>,
    /// Plants still there after the statement: another session holds them (PostgreSQL
    /// skips locked rows), so they are retried alone. Always empty on SQLite.
    pub present: HashSet<i64>,
    /// Batch positions (from 0) whose caller's idempotency key already deleted a plant
    /// within the replay window, and that plant.
    pub earlier: HashMap<usize, i64>,
}

impl BatchResult {
    /// Each deletion's outcome, in batch order.
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn deletion(plant_id: i64) -> Deletion {
        Deletion {
            plant_id,
            caller: Arc::from("t"),
            request_id: String::new(),
            idempotency_key: None,
            deadline: tokio::time::Instant::now(),
        }
    }

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

    #[test]
    fn each_deletion_reads_its_own_finding() {
        let batch: Vec<Deletion> = (1..=5).map(deletion).collect();
        let result = BatchResult {
            removed: HashSet::from([1]),
            present: HashSet::from([2]),
            earlier: HashMap::from([(3, 4), (4, 9)]),
        };
        assert_eq!(
            result.outcomes(&batch),
            [
                DeletionOutcome::Removed,
                DeletionOutcome::RowLocked,
                DeletionOutcome::NotFound,
                DeletionOutcome::Replayed,
                DeletionOutcome::KeyReused(9),
            ]
        );
    }
}
