//! The group commit's writer on PostgreSQL: the commit workers' kept connections, a
//! deletion retried alone on a locked row, and word to the other instances after each
//! commit that deleted.

use async_trait::async_trait;
use plantstore_group_commit::{
    BatchWriter, DeletionOutcome, KeptConnections, LimitedConnection, earliest, replay_or_reuse,
    wait_until,
};
use plantstore_store::{Deletion, StoreError};
use sqlx::{Connection, Executor, PgConnection, Postgres, pool::PoolConnection};
use tokio::{sync::Semaphore, time::Instant};

use crate::{
    announcements::{Announcer, AnnouncerId},
    batch_statement::{self, lock_keys},
    database::Database,
    wait_limits::{WorkerConnection, begin_limited, limit_session, may_commit, renew_local},
};

/// Commits the batches: each is one autocommit statement, so one round trip.
pub(crate) struct PgBatchWriter {
    db: Database,
    /// Connections the commit workers keep between batches (see `KeptConnections`); all
    /// handed back at shutdown, so that closing the pool does not wait for them.
    pub(crate) kept: KeptConnections<WorkerConnection>,
    /// `PLANTSTORE_IDEMPOTENCY_TTL` in seconds, for `make_interval`.
    idempotency_ttl: f64,
    /// Deletions waiting alone for a locked row may take only the connections the commit
    /// workers do not need.
    lone_retry_slots: Semaphore,
    announcer: Announcer,
}

impl PgBatchWriter {
    /// `lone_retries`: how many deletions may wait alone for a locked row at once.
    pub(crate) fn new(
        db: Database,
        idempotency_ttl: f64,
        lone_retries: usize,
        announcer: AnnouncerId,
    ) -> Self {
        Self {
            announcer: Announcer::start(db.clone(), announcer),
            db,
            kept: KeptConnections::default(),
            idempotency_ttl,
            lone_retry_slots: Semaphore::new(lone_retries),
        }
    }

    /// A lone retry's transaction on `conn`: every statement, and the commit, within the
    /// deadline.
    async fn delete_limited(
        &self,
        conn: &mut PoolConnection<Postgres>,
        deadline: Instant,
        deletion: &Deletion,
    ) -> Result<DeletionOutcome, StoreError> {
        let db = &self.db;
        let mut tx = conn
            .begin_with(begin_limited(deadline)?)
            .await
            .map_err(|err| db.error(err))?;
        let outcome = match &deletion.idempotency_key {
            None => delete_row(db, &mut tx, deletion).await?,
            Some(key) => {
                lock_keys(db, &mut tx, std::slice::from_ref(deletion)).await?;
                let earlier = earlier_use(db, &mut tx, deletion, key, self.idempotency_ttl).await?;
                match replay_or_reuse(deletion, earlier) {
                    Some(outcome) => outcome,
                    None => {
                        tx.execute(renew_local(deadline)?)
                            .await
                            .map_err(|err| db.error(err))?;
                        delete_row(db, &mut tx, deletion).await?
                    }
                }
            }
        };
        may_commit(deadline)?;
        tx.commit().await.map_err(|err| db.error(err))?;
        Ok(outcome)
    }
}

#[async_trait]
impl BatchWriter for PgBatchWriter {
    #[tracing::instrument(level = "debug", skip_all, fields(size = batch.len()))]
    async fn delete_batch(&self, batch: &[Deletion]) -> Result<Vec<DeletionOutcome>, StoreError> {
        let deadline = earliest(batch)?;
        let mut kept = match self.kept.take() {
            Some(kept) => kept,
            None => LimitedConnection::new(self.db.conn_by(deadline).await?),
        };
        // Bounded here too, not only by the server's limits: a server that stopped
        // answering (a host gone without a reset, a network cut) would hold the worker,
        // and the request's answer, forever.
        let committed = self
            .db
            .within(deadline, async {
                limit_session(&self.db, &mut kept, deadline).await?;
                let conn = &mut kept.conn;
                batch_statement::run(&self.db, conn, batch, self.idempotency_ttl, deadline).await
            })
            .await;
        match committed {
            Ok(outcomes) => {
                self.kept.keep(kept);
                if outcomes.contains(&DeletionOutcome::Removed) {
                    self.announcer.announce();
                }
                Ok(outcomes)
            }
            Err(err) => {
                // Closed, not handed back to the pool: it may be broken, on a server that
                // turned read-only, or carry this batch's session limits.
                kept.conn.close_on_drop();
                Err(err)
            }
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(id = deletion.plant_id))]
    async fn delete_one(&self, deletion: &Deletion) -> Result<DeletionOutcome, StoreError> {
        let deadline = deletion.deadline;
        let _permit = wait_until(deadline, async {
            self.lone_retry_slots
                .acquire()
                .await
                .map_err(|_| StoreError::Stopped)
        })
        .await?;
        // Waits for a locked row up to what the deadline leaves; a concurrent delete of the
        // same row commits first and this one then finds nothing: one 204. With a key, the
        // transaction first waits for any request holding the same key and looks for its
        // entry.
        let mut conn = self.db.conn_by(deadline).await?;
        let committed = self
            .db
            .within(deadline, self.delete_limited(&mut conn, deadline, deletion))
            .await;
        match committed {
            Ok(DeletionOutcome::Removed) => self.announcer.announce(),
            Ok(_) => {}
            // It may be broken or on a server that turned read-only: not reused.
            Err(_) => conn.close_on_drop(),
        }
        committed
    }
}

/// The plant this caller's `key` deleted within the replay window (`idempotency_ttl`
/// seconds), if it did.
async fn earlier_use(
    db: &Database,
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
    .map_err(|err| db.error(err))
}

/// Deletes one plant, waiting for its row, and writes its audit row.
async fn delete_row(
    db: &Database,
    conn: &mut PgConnection,
    deletion: &Deletion,
) -> Result<DeletionOutcome, StoreError> {
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
    .map_err(|err| db.error(err))?;
    Ok(if deleted.is_empty() {
        DeletionOutcome::NotFound
    } else {
        DeletionOutcome::Removed
    })
}
