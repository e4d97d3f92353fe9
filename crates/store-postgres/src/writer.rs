//! The writer: the batch lanes' kept connections, a deletion retried alone on a held row.

use std::sync::Arc;

use async_trait::async_trait;
use plantstore_store::{
    BatchWriter, Deletion, KeptConnections, LimitedConnection, Outcome, StoreError, earliest,
    keyed_outcome, wait_until,
};
use sqlx::{Connection, Executor, PgConnection, Postgres, pool::PoolConnection, postgres::PgPool};
use tokio::{sync::Semaphore, time::Instant};

use crate::{
    batch::{self, lock_keys},
    errors::{classify, unavailable},
    failover::Failover,
    limits::{LaneConnection, begin_limited, limit_session, may_commit, renew_local},
};

/// Commits the batches: each is one autocommit statement, so one round trip.
pub(crate) struct PgWriter {
    pool: PgPool,
    /// Connections the lanes keep between batches (see `KeptConnections`).
    kept: KeptConnections<LaneConnection>,
    /// `PLANTSTORE_IDEMPOTENCY_TTL` in seconds, for `make_interval`.
    idempotency_ttl: f64,
    /// Deletions waiting alone for a held row may take only the connections the batch
    /// lanes do not need.
    alone: Semaphore,
    /// Told when a batch finds the database unavailable or read-only.
    failover: Arc<Failover>,
}

impl PgWriter {
    /// `alone`: how many deletions may wait alone for a held row at once.
    pub(crate) fn new(
        pool: PgPool,
        idempotency_ttl: f64,
        alone: usize,
        failover: Arc<Failover>,
    ) -> Self {
        Self {
            pool,
            kept: KeptConnections::default(),
            idempotency_ttl,
            alone: Semaphore::new(alone),
            failover,
        }
    }

    /// A kept connection, else one from the pool by `deadline`.
    async fn lane(&self, deadline: Instant) -> Result<LaneConnection, StoreError> {
        match self.kept.take() {
            Some(lane) => Ok(lane),
            None => wait_until(deadline, async {
                self.pool.acquire().await.map_err(unavailable)
            })
            .await
            .map(LimitedConnection::new),
        }
    }

    /// Hands every kept connection back, so that closing the pool does not wait for them.
    pub(crate) fn release_all(&self) {
        self.kept.release_all();
    }

    #[tracing::instrument(level = "debug", skip_all, fields(size = batch.len()))]
    async fn commit_batch(&self, batch: &[Deletion]) -> Result<Vec<Outcome>, StoreError> {
        let deadline = earliest(batch)?;
        let mut lane = self.lane(deadline).await?;
        // Bounded here too, not only by the server's limits: a server that stopped
        // answering (a host gone without a reset, a network cut) would hold the lane,
        // and the request's answer, forever.
        let committed = wait_until(deadline, async {
            limit_session(&mut lane, deadline).await?;
            batch::run(&mut lane.conn, batch, self.idempotency_ttl, deadline).await
        })
        .await;
        match committed {
            Ok(outcomes) => {
                self.kept.keep(lane);
                Ok(outcomes)
            }
            Err(err) => {
                // Closed, not handed back to the pool: it may be broken, on a server that
                // turned read-only, or carry this batch's session limits.
                lane.conn.close_on_drop();
                Err(err)
            }
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(id = deletion.plant_id))]
    async fn commit_alone(&self, deletion: &Deletion) -> Result<Outcome, StoreError> {
        let deadline = deletion.deadline;
        let _permit = wait_until(deadline, async {
            self.alone.acquire().await.map_err(|_| StoreError::Stopped)
        })
        .await?;
        // Waits for a held row up to what the deadline leaves; a concurrent delete of the
        // same row commits first and this one then finds nothing: one 204. With a key, the
        // transaction first waits for any request holding the same key and looks for its
        // entry.
        let mut conn = wait_until(deadline, async {
            self.pool.acquire().await.map_err(unavailable)
        })
        .await?;
        let committed =
            wait_until(deadline, self.delete_limited(&mut conn, deadline, deletion)).await;
        if committed.is_err() {
            // It may be broken or on a server that turned read-only: not reused.
            conn.close_on_drop();
        }
        committed
    }

    /// The alone path's transaction on `conn`: every statement, and the commit, within the
    /// deadline.
    async fn delete_limited(
        &self,
        conn: &mut PoolConnection<Postgres>,
        deadline: Instant,
        deletion: &Deletion,
    ) -> Result<Outcome, StoreError> {
        let mut tx = conn
            .begin_with(begin_limited(deadline)?)
            .await
            .map_err(classify)?;
        let outcome = match &deletion.idempotency_key {
            None => delete_row(&mut tx, deletion).await?,
            Some(key) => {
                lock_keys(&mut tx, std::slice::from_ref(deletion)).await?;
                let earlier = earlier_use(&mut tx, deletion, key, self.idempotency_ttl).await?;
                match keyed_outcome(deletion, earlier) {
                    Some(outcome) => outcome,
                    None => {
                        tx.execute(renew_local(deadline)?).await.map_err(classify)?;
                        delete_row(&mut tx, deletion).await?
                    }
                }
            }
        };
        may_commit(deadline)?;
        tx.commit().await.map_err(classify)?;
        Ok(outcome)
    }
}

#[async_trait]
impl BatchWriter for PgWriter {
    async fn delete_batch(&self, batch: &[Deletion]) -> Result<Vec<Outcome>, StoreError> {
        self.failover.watch(self.commit_batch(batch).await)
    }

    async fn delete_one(&self, deletion: &Deletion) -> Result<Outcome, StoreError> {
        self.failover.watch(self.commit_alone(deletion).await)
    }
}

/// The plant this caller's `key` deleted within the replay window (`idempotency_ttl`
/// seconds), if it did.
async fn earlier_use(
    conn: &mut PgConnection,
    deletion: &Deletion,
    key: &str,
    idempotency_ttl: f64,
) -> Result<Option<i64>, StoreError> {
    sqlx::query_scalar!(
        "SELECT plant_id FROM plantstore_deletions
             WHERE token_name = $1 AND idempotency_key = $2
               AND deleted_at > now() - make_interval(secs => $3)
             ORDER BY id DESC LIMIT 1",
        deletion.caller.as_ref(),
        key,
        idempotency_ttl,
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(classify)
}

/// Deletes one plant, waiting for its row, and writes its audit row.
async fn delete_row(conn: &mut PgConnection, deletion: &Deletion) -> Result<Outcome, StoreError> {
    let deleted = sqlx::query_scalar!(
        "WITH deleted AS (DELETE FROM plants p WHERE p.id = $1::BIGINT
                          RETURNING p.id, to_jsonb(p) AS snapshot)
         INSERT INTO plantstore_deletions
             (plant_id, token_name, request_id, idempotency_key, snapshot, deleted_at)
         SELECT id, $2, $3, $4, snapshot, now() FROM deleted
         RETURNING plant_id",
        deletion.plant_id,
        deletion.caller.as_ref(),
        deletion.request_id,
        deletion.idempotency_key.as_deref(),
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(classify)?;
    Ok(if deleted.is_empty() {
        Outcome::NotFound
    } else {
        Outcome::Deleted
    })
}
