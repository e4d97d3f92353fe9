//! Every database wait of a delete bounded by its request's deadline, so that nothing
//! commits after its request was answered 503. The HTTP layer sets the deadline
//! (`PLANTSTORE_REQUEST_TIMEOUT`, `src/http/front_door.rs`, `answer`); below it:
//! - queued: a request answered meanwhile is left out of its batch, one with less than
//!   `MIN_TIME_LEFT` is answered `TimedOut` (`still_waited_for` in `batcher.rs`);
//! - a batch waits by its `earliest` deadline for its connection (PostgreSQL's
//!   `Database::within`, SQLite's `WriteConnection::lock_by`, its busy wait included);
//! - its statements run under a `WaitLimit` (PostgreSQL's `lock_timeout` and
//!   `statement_timeout`), per transaction for a deletion retried alone on a locked row;
//! - PostgreSQL sends a retried deletion's commit only while time is left (`remaining`). A
//!   commit already sent when the deadline falls may still land; the audit table has it.

use std::{future::Future, time::Duration};

use tokio::time::Instant;

use plantstore_store::{Deletion, StoreError};

/// Less than this left is as good as past: no commit fits in it, and in a batch it would
/// cut every other request of the batch short too.
const MIN_TIME_LEFT: Duration = Duration::from_millis(10);

/// `StoreError::TimedOut` once (nearly) nothing is left, so nothing is started for a
/// request that has been, or is about to be, answered.
pub fn remaining(deadline: Instant) -> Result<Duration, StoreError> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|left| *left >= MIN_TIME_LEFT)
        .ok_or(StoreError::TimedOut)
}

/// 9/10 of what is left, so that a statement's answer still arrives, and is acted on, before
/// the deadline. At least a millisecond (zero would mean no limit).
pub fn statement_share(left: Duration) -> Duration {
    let millis = (left.saturating_mul(9) / 10).as_millis().max(1);
    Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}

pub async fn wait_until<T>(
    deadline: Instant,
    wait: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout_at(deadline, wait)
        .await
        .unwrap_or(Err(StoreError::TimedOut))
}

/// A batch commits for all of its requests, so none of its waits may outlast the first of
/// them to be answered.
pub fn earliest(batch: &[Deletion]) -> Result<Instant, StoreError> {
    batch
        .iter()
        .map(|deletion| deletion.deadline)
        .min()
        .ok_or(StoreError::Broken("a batch has a deletion"))
}

/// The limit a kept connection's session puts on its lock and statement waits (SQLite: its
/// busy wait). Setting it costs a statement, so it is set anew only when a batch needs it:
/// when it would outlast what the batch has left, or would cut a batch off much earlier.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WaitLimit(Option<Duration>);

impl WaitLimit {
    /// The limit to set before a statement that may wait at most `allowed`, or `None` when
    /// the one in force serves: not beyond `allowed`, and at least 4/5 of it, so a steady
    /// stream sets `statement_share(allowed)` once.
    pub fn limit_to_set(&mut self, allowed: Duration) -> Option<Duration> {
        match self.0 {
            Some(limit)
                if limit <= allowed && limit.saturating_mul(5) >= allowed.saturating_mul(4) =>
            {
                None
            }
            _ => {
                let limit = statement_share(allowed);
                self.0 = Some(limit);
                Some(limit)
            }
        }
    }
}

/// A connection a writer keeps between batches, with its session's wait limit.
#[derive(Debug)]
pub struct LimitedConnection<C> {
    pub conn: C,
    pub limit: WaitLimit,
}

impl<C> LimitedConnection<C> {
    /// The session's limit is not known: the first batch sets one.
    pub fn new(conn: C) -> Self {
        Self {
            conn,
            limit: WaitLimit::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_limit_is_set_once_for_a_steady_stream_and_never_outlasts_a_batch() {
        let mut limit = WaitLimit::default();
        assert_eq!(limit.limit_to_set(5 * SECOND), Some(4500 * SECOND / 1000));
        assert_eq!(limit.limit_to_set(4900 * SECOND / 1000), None);
        assert_eq!(limit.limit_to_set(5 * SECOND), None);
        // Less left than the limit: it would outlast the request.
        assert_eq!(limit.limit_to_set(4 * SECOND), Some(3600 * SECOND / 1000));
        // Much more left: the old limit would cut the batch off early.
        assert_eq!(limit.limit_to_set(5 * SECOND), Some(4500 * SECOND / 1000));
        assert_eq!(
            limit.limit_to_set(Duration::ZERO),
            Some(Duration::from_millis(1))
        );
        // A setting too large to multiply saturates instead of panicking.
        assert!(limit.limit_to_set(Duration::MAX).is_some());
    }

    #[test]
    fn a_passed_deadline_leaves_nothing() {
        assert!(matches!(
            remaining(Instant::now() - SECOND),
            Err(StoreError::TimedOut)
        ));
        assert!(matches!(
            remaining(Instant::now() + Duration::from_millis(5)),
            Err(StoreError::TimedOut)
        ));
        assert!(remaining(Instant::now() + SECOND).is_ok_and(|left| left <= SECOND));
    }
}
