//! The writer: the batch lanes' kept connections, a deletion retried alone on a held row.

use async_trait::async_trait;
use plantstore_store::{
    BatchWriter, Deletion, KeptConnections, Outcome, StoreError, keyed_outcome,
};
use sqlx::{Acquire, PgConnection, Postgres, pool::PoolConnection, postgres::PgPool};
use tokio::sync::Semaphore;

use crate::{
    batch::{self, lock_keys},
    errors::{classify, unavailable},
};

/// Commits the batches: each is one autocommit statement, so one round trip.
pub(crate) struct PgWriter {
    pool: PgPool,
    /// Connections the lanes keep between batches (see `KeptConnections`).
    kept: KeptConnections<PoolConnection<Postgres>>,
    /// `PLANTSTORE_IDEMPOTENCY_TTL` in seconds, for `make_interval`.
    idempotency_ttl: f64,
    /// Deletions waiting alone for a held row may take only the connections the batch
    /// lanes do not need.
    alone: Semaphore,
}

impl PgWriter {
    /// `alone`: how many deletions may wait alone for a held row at once.
    pub(crate) fn new(pool: PgPool, idempotency_ttl: f64, alone: usize) -> Self {
        Self {
            pool,
            kept: KeptConnections::default(),
            idempotency_ttl,
            alone: Semaphore::new(alone),
        }
    }

    async fn connection(&self) -> Result<PoolConnection<Postgres>, StoreError> {
        match self.kept.take() {
            Some(conn) => Ok(conn),
            None => self.pool.acquire().await.map_err(unavailable),
        }
    }

    /// Hands every kept connection back, so that closing the pool does not wait for them.
    pub(crate) fn release_all(&self) {
        self.kept.release_all();
    }
}

#[async_trait]
#[async_trait]
impl BatchWriter for PgWriter {
    #[tracing::instrument(level = "debug", skip_all, fields(size = batch.len()))]
    async fn delete_batch(&self, batch: &[Deletion]) -> Result<Vec<Outcome>, StoreError> {
        let mut conn = self.connection().await?;
        // A connection a batch failed on goes back to the pool, which drops it if broken.
        let outcomes = batch::run(&mut conn, batch, self.idempotency_ttl).await?;
        self.kept.keep(conn);
        Ok(outcomes)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(id = deletion.plant_id))]
    async fn delete_one(&self, deletion: &Deletion) -> Result<Outcome, StoreError> {
        let _permit = self
            .alone
            .acquire()
            .await
            .map_err(|_| StoreError::Stopped)?;
        // Waits for a held row up to `lock_timeout`; a concurrent delete of the same row
        // commits first and this one then finds nothing: one 204. Without a key that is
        // one autocommit statement; with one, a transaction that first waits for any
        // request holding the same key and looks for its entry.
        let mut conn = self.pool.acquire().await.map_err(unavailable)?;
        if deletion.idempotency_key.is_none() {
            return delete_row(&mut conn, deletion).await;
        }
        let mut tx = conn.begin().await.map_err(classify)?;
        lock_keys(&mut tx, std::slice::from_ref(deletion)).await?;
        let earlier = sqlx::query_scalar!(
            "SELECT plant_id FROM plantstore_deletions
             WHERE token_name = $1 AND idempotency_key = $2
               AND deleted_at > now() - make_interval(secs => $3)
             ORDER BY id DESC LIMIT 1",
            deletion.caller.as_ref(),
            deletion.idempotency_key.as_deref(),
            self.idempotency_ttl,
        )
        .fetch_optional(&mut *tx)
        .await
        .map_err(classify)?;
        let outcome = match keyed_outcome(deletion, earlier) {
            Some(outcome) => outcome,
            None => delete_row(&mut tx, deletion).await?,
        };
        tx.commit().await.map_err(classify)?;
        Ok(outcome)
    }
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
