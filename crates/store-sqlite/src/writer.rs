//! The one connection this process writes with, and holding it.

use plantstore_store::{KeptConnections, StoreError};
use sqlx::{Sqlite, SqliteConnection, SqlitePool, pool::PoolConnection};
use tokio::sync::{Mutex, MutexGuard};

use crate::{MIGRATOR, errors::classify};

/// The one connection this process writes with: its own writes never wait on each
/// other's locks, and the group commit shares its syncs. It is kept rather than returned
/// to its pool after each use (see `KeptConnections`).
#[derive(Debug)]
pub(crate) struct WriteConnection {
    pool: SqlitePool,
    kept: KeptConnections<PoolConnection<Sqlite>>,
    /// Whoever holds it holds this process's write access.
    turn: Mutex<()>,
}

impl WriteConnection {
    /// `pool` holds one connection at most.
    pub(crate) fn new(pool: SqlitePool) -> Self {
        Self {
            pool,
            kept: KeptConnections::default(),
            turn: Mutex::new(()),
        }
    }

    /// Waits for the writer.
    pub(crate) async fn lock(&self) -> Result<Writer<'_>, StoreError> {
        let turn = self.turn.lock().await;
        let conn = match self.kept.take() {
            Some(conn) => conn,
            None => self.pool.acquire().await.map_err(classify)?,
        };
        Ok(Writer {
            _turn: turn,
            conn: Some(conn),
            kept: &self.kept,
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

/// Holding the writer; the connection is kept again when it is let go. A batch that
/// failed closes it rather than keeping it: a commit that failed (a full disk) left sqlx
/// believing a transaction was still open on it, and every later `BEGIN` on that
/// connection was refused.
pub(crate) struct Writer<'a> {
    _turn: MutexGuard<'a, ()>,
    conn: Option<PoolConnection<Sqlite>>,
    kept: &'a KeptConnections<PoolConnection<Sqlite>>,
}

impl Writer<'_> {
    pub(crate) fn conn(&mut self) -> Result<&mut SqliteConnection, StoreError> {
        self.conn.as_deref_mut().ok_or(StoreError::Stopped)
    }

    pub(crate) async fn discard(mut self) {
        if let Some(conn) = self.conn.take() {
            let _closed = conn.close().await;
        }
    }
}

impl Drop for Writer<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.kept.keep(conn);
        }
    }
}
