//! What a backend's batch statement found, and the one reading of it into each
//! deletion's outcome that every backend shares.

use std::collections::{HashMap, HashSet};

use super::{DeletionOutcome, replay_or_reuse};
use crate::Deletion;

/// Facts about one batch, as a backend's statement reports them.
#[derive(Debug, Default)]
pub struct BatchResult {
    /// Plants the statement deleted (and audited).
    pub deleted: HashSet<i64>,
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
                    if self.deleted.contains(&deletion.plant_id) {
                        DeletionOutcome::Deleted
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
    fn each_deletion_reads_its_own_finding() {
        let batch: Vec<Deletion> = (1..=5).map(deletion).collect();
        let result = BatchResult {
            deleted: HashSet::from([1]),
            present: HashSet::from([2]),
            earlier: HashMap::from([(3, 4), (4, 9)]),
        };
        assert_eq!(
            result.outcomes(&batch),
            [
                DeletionOutcome::Deleted,
                DeletionOutcome::RowLocked,
                DeletionOutcome::NotFound,
                DeletionOutcome::Replayed,
                DeletionOutcome::KeyReused(9),
            ]
        );
    }
}
