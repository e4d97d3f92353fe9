//! PostgreSQL's own limits on how long a statement may wait for a lock and run, set from
//! a request's deadline: a statement cut off by them rolls back instead of committing
//! after its request was answered 503.

use std::time::Duration;

use plantstore_group_commit::{LimitedConnection, remaining, statement_share};
use plantstore_store::StoreError;
use sqlx::{AssertSqlSafe, Executor, Postgres, pool::PoolConnection};
use tokio::time::Instant;

use crate::database::Database;

/// A commit worker's kept connection and the limits its session has.
pub(crate) type WorkerConnection = LimitedConnection<PoolConnection<Postgres>>;

/// Bounds the session's lock and statement waits by what `deadline` leaves, when the
/// limits in force do not already (see `WaitLimit::limit_to_set`): in a steady stream
/// one statement per connection, not one per batch.
///
/// The limits stay with the session, so a worker's connection that fails is closed, never
/// handed back to the pool where other queries would inherit them.
pub(crate) async fn limit_session(
    db: &Database,
    kept: &mut WorkerConnection,
    deadline: Instant,
) -> Result<(), StoreError> {
    if let Some(limit) = kept.limit.limit_to_set(remaining(deadline)?) {
        kept.conn
            .execute(AssertSqlSafe(set_wait_limits("SET", limit)))
            .await
            .map_err(|err| db.error(err))?;
    }
    // The SET took a round trip; the statement is sent only if there is still time.
    remaining(deadline).map(drop)
}

/// `BEGIN` with both limits set, for this transaction only, to a statement's share of what
/// `deadline` leaves.
pub(crate) fn begin_limited(deadline: Instant) -> Result<AssertSqlSafe<String>, StoreError> {
    Ok(AssertSqlSafe(format!(
        "BEGIN; {}",
        set_wait_limits("SET LOCAL", statement_share(remaining(deadline)?))
    )))
}

/// Both limits set again, for the rest of this transaction, to what `deadline` leaves now:
/// each limit counts from its statement's start, so a second waiting statement must not
/// get the whole of it again.
pub(crate) fn renew_local(deadline: Instant) -> Result<AssertSqlSafe<String>, StoreError> {
    Ok(AssertSqlSafe(set_wait_limits(
        "SET LOCAL",
        statement_share(remaining(deadline)?),
    )))
}

/// A COMMIT is sent only while the deadline has not passed: past it the request has been
/// answered 503, and the transaction is rolled back instead (by dropping it).
pub(crate) fn may_commit(deadline: Instant) -> Result<(), StoreError> {
    remaining(deadline).map(drop)
}

/// `lock_timeout` and `statement_timeout` both set to `limit`, with `set` (`SET` for the
/// session, `SET LOCAL` for the transaction), in whole milliseconds, at least one: zero
/// would mean no limit at all.
fn set_wait_limits(set: &str, limit: Duration) -> String {
    let millis = limit.as_millis().max(1);
    format!("{set} lock_timeout = {millis}; {set} statement_timeout = {millis}")
}
