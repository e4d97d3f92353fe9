//! The one connection this process writes with, and holding it.

use std::time::Duration;

use plantstore_group_commit::{KeptConnections, LimitedConnection, remaining, wait_until};
use plantstore_store::StoreError;
use sqlx::{AssertSqlSafe, Executor, Sqlite, SqliteConnection, SqlitePool, pool::PoolConnection};
use tokio::{
    sync::{Mutex, MutexGuard},
    time::Instant,
};

use crate::{
    MIGRATOR,
    errors::{classify, is_busy},
};

type KeptWriteConnection = LimitedConnection<PoolConnection<Sqlite>>;

/// The one connection this process writes with: its own writes never wait on each
/// other's locks, and the group commit shares its syncs. It is kept rather than returned
/// to its pool after each use (see `KeptConnections`).
#[derive(Debug)]
pub(crate) struct WriteConnection {
    pool: SqlitePool,
    kept: KeptConnections<KeptWriteConnection>,
    /// Whoever holds it holds this process's write access.
    turn: Mutex<()>,
    /// `PLANTSTORE_DB_ACQUIRE_TIMEOUT`: the longest wait for another process's write lock.
    busy_wait: Duration,
}

impl WriteConnection {
    /// `pool` holds one connection at most.
    pub(crate) fn new(pool: SqlitePool, busy_wait: Duration) -> Self {
        Self {
            pool,
            kept: KeptConnections::default(),
            turn: Mutex::new(()),
            busy_wait,
        }
    }

    /// Waits for a turn to write, for a command: as long as for another process's write lock.
    pub(crate) async fn lock(&self) -> Result<WriteTurn<'_>, StoreError> {
        self.lock_by(Instant::now() + self.busy_wait).await
    }

    /// Waits for a turn to write, by `deadline`; its busy wait for another process's write
    /// lock then ends by `deadline` too, so a batch never begins after its request was
    /// answered.
    pub(crate) async fn lock_by(&self, deadline: Instant) -> Result<WriteTurn<'_>, StoreError> {
        let turn = wait_until(deadline, async { Ok(self.turn.lock().await) }).await?;
        let mut kept = match self.kept.take() {
            Some(kept) => kept,
            None => wait_until(deadline, async {
                self.pool.acquire().await.map_err(classify)
            })
            .await
            .map(LimitedConnection::new)?,
        };
        let left = remaining(deadline)?;
        let allowed = left.min(self.busy_wait);
        if let Some(limit) = kept.limit.limit_to_set(allowed) {
            kept.conn
                .execute(AssertSqlSafe(format!(
                    "PRAGMA busy_timeout = {}",
                    limit.as_millis()
                )))
                .await
                .map_err(classify)?;
        }
        Ok(WriteTurn {
            _turn: turn,
            conn: Some(kept),
            kept: &self.kept,
            ends_with_deadline: left < self.busy_wait,
        })
    }

    /// sqlx's migrator takes a pool; the kept connection goes back to it for the run,
    /// and nobody else writes meanwhile.
    pub(crate) async fn migrate(&self) -> Result<(), StoreError> {
        let _turn = self.turn.lock().await;
        drop(self.kept.take());
        Ok(MIGRATOR.run(&self.pool).await?)
    }

    pub(crate) async fn close(&self) {
        let _turn = self.turn.lock().await;
        self.kept.release_all();
        self.pool.close().await;
    }
}

/// This process's turn to write, holding the write connection; the connection is kept
/// again when the turn ends. A batch that failed closes it rather than keeping it: a
/// commit that failed (a full disk) left sqlx believing a transaction was still open on
/// it, and every later `BEGIN` on that connection was refused.
pub(crate) struct WriteTurn<'a> {
    _turn: MutexGuard<'a, ()>,
    conn: Option<KeptWriteConnection>,
    kept: &'a KeptConnections<KeptWriteConnection>,
    /// The busy wait ends with the deadline, not before: a busy error means it passed.
    ends_with_deadline: bool,
}

impl WriteTurn<'_> {
    /// `err` as the caller should see it: a busy wait cut off by the deadline is the
    /// deadline's error.
    pub(crate) fn caller_error(&self, err: StoreError) -> StoreError {
        if self.ends_with_deadline && is_busy(&err) {
            StoreError::TimedOut
        } else {
            err
        }
    }

    pub(crate) fn conn(&mut self) -> Result<&mut SqliteConnection, StoreError> {
        self.conn
            .as_mut()
            .map(|kept| &mut *kept.conn)
            .ok_or(StoreError::Stopped)
    }

    pub(crate) async fn discard(mut self) {
        if let Some(kept) = self.conn.take() {
            let _closed = kept.conn.close().await;
        }
    }
}

impl Drop for WriteTurn<'_> {
    fn drop(&mut self) {
        if let Some(kept) = self.conn.take() {
            self.kept.keep(kept);
        }
    }
}
