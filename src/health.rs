//! Whether this instance is ready, and the deletion log's size, both read in the background
//! for `/metrics` (the size seldom: on PostgreSQL counting reads the whole table).

use std::time::Duration;

use plantstore_store::StoreError;

use crate::state::AppState;

const CHECK_EVERY: Duration = Duration::from_secs(5);
/// Every how many checks the log's size is read.
const LOG_SIZE_EVERY: u32 = 12;

/// What `/readyz` answers from: a shutdown asked for, and the database's answer to a ping.
pub(crate) struct Readiness {
    pub(crate) draining: bool,
    pub(crate) database: Result<(), StoreError>,
}

impl Readiness {
    pub(crate) async fn check(state: &AppState) -> Self {
        Self {
            draining: state.draining.is_on(),
            database: state.store.ping().await,
        }
    }

    pub(crate) fn is_ready(&self) -> bool {
        !self.draining && self.database.is_ok()
    }
}

/// Sets the readiness and log-size gauges, for ever (aborted when the instance stops).
pub(crate) async fn sample(state: AppState) {
    let mut every = tokio::time::interval(CHECK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for round in 0u32.. {
        every.tick().await;
        let readiness = Readiness::check(&state).await;
        state
            .metrics
            .health(readiness.is_ready(), readiness.database.is_ok());
        if round % LOG_SIZE_EVERY == 0 {
            match state.store.log_size().await {
                Ok(size) => state.metrics.log_size(size),
                Err(err) => tracing::debug!(error = %err, "cannot read the deletion log's size"),
            }
        }
    }
}
