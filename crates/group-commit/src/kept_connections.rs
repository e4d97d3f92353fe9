//! Connections a writer keeps between its batches instead of returning them to the pool:
//! sqlx pings a connection on every return to its pool, one more round trip (PostgreSQL)
//! or thread hop (SQLite) per batch.

use std::sync::{Mutex, PoisonError};

/// The kept connections; `None` once the store closes, so none is kept after that.
#[derive(Debug)]
pub struct KeptConnections<C> {
    kept: Mutex<Option<Vec<C>>>,
}

impl<C> Default for KeptConnections<C> {
    fn default() -> Self {
        Self {
            kept: Mutex::new(Some(Vec::new())),
        }
    }
}

impl<C> KeptConnections<C> {
    pub fn take(&self) -> Option<C> {
        self.kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
            .and_then(Vec::pop)
    }

    /// Unless the store is closing. Backends close, never keep, one a batch failed on: its
    /// session may hold a failed transaction or a wait limit no other query should inherit.
    pub fn keep(&self, conn: C) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kept) = kept.as_mut() {
            kept.push(conn);
        }
    }

    /// Keeps none from now on, so that closing the pool does not wait for them.
    pub fn release_all(&self) {
        let released = self
            .kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(released);
    }
}
