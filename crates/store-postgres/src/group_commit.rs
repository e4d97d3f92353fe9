//! The group commit on PostgreSQL: one statement per batch (one round trip), and a deletion
//! retried alone on a locked row. Lock and statement timeouts are set from the request's
//! deadline, so a statement cut off rolls back instead of committing after a 503.

use std::{collections::HashMap, time::Duration};

use async_trait::async_trait;
use plantstore_group_commit::{
    BatchResult, BatchWriter, DeletionOutcome, KeptConnections, LimitedConnection, earliest,
    remaining, replay_or_reuse, statement_share, wait_until,
};
use plantstore_store::{Deletion, StoreError};
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection, Postgres, pool::PoolConnection};
use tokio::{sync::Semaphore, time::Instant};

use crate::{
    announcements::{Announcer, AnnouncerId},
    database::Database,
    sync_replication::{barrier, replicated},
};

pub(crate) struct PgBatchWriter {
    db: Database,
    pub(crate) kept: KeptConnections<WorkerConnection>,
    /// `PLANTSTORE_IDEMPOTENCY_TTL` in seconds, for `make_interval`.
    idempotency_ttl: f64,
    /// Lone retries may take only the connections the commit workers do not need.
    lone_retry_slots: Semaphore,
    announcer: Announcer,
}

impl PgBatchWriter {
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

    /// A lone retry's transaction: every statement, and the commit, within the deadline.
    async fn delete_limited(
        &self,
        conn: &mut PoolConnection<Postgres>,
        deadline: Instant,
        deletion: &Deletion,
    ) -> Result<DeletionOutcome, StoreError> {
        let db = &self.db;
        let mut tx = conn
            .begin_with(AssertSqlSafe(format!("BEGIN; {}", local_limits(deadline)?)))
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
                        tx.execute(AssertSqlSafe(local_limits(deadline)?))
                            .await
                            .map_err(|err| db.error(err))?;
                        delete_row(db, &mut tx, deletion).await?
                    }
                }
            }
        };
        // Past the deadline the request was answered 503: roll back (drop) instead.
        remaining(deadline)?;
        replicated(db, tx.commit()).await?;
        // A replayed 204 vouches for an earlier commit: see `run`.
        if outcome == DeletionOutcome::Replayed {
            barrier(db, conn).await?;
        }
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
            None => LimitedConnection::new(self.db.within(deadline, self.db.conn()).await?),
        };
        // Bounded here too, not only by the server's limits: a server that stopped answering
        // (a host gone without a reset, a network cut) would hold the worker forever.
        let committed = self
            .db
            .within(deadline, async {
                limit_session(&self.db, &mut kept, deadline).await?;
                let conn = &mut kept.conn;
                run(&self.db, conn, batch, self.idempotency_ttl, deadline).await
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
        // same row commits first and this one then finds nothing: one 204. With a key, it
        // first waits for any request holding the same key.
        let mut conn = self.db.within(deadline, self.db.conn()).await?;
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

/// The plant this caller's `key` deleted within the replay window, if any.
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

/// Waits for the row if it is locked.
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

/// So keys cannot collide with an owner's own one-number advisory locks.
const KEY_LOCK_CLASS: i32 = 0x706c_6e74;

/// Serialises, until the transaction ends, other instances' requests with the same callers'
/// keys, so the key lookup after it sees their commits. Locked in one order, so two batches
/// never wait on each other.
pub(crate) async fn lock_keys(
    db: &Database,
    conn: &mut PgConnection,
    batch: &[Deletion],
) -> Result<(), StoreError> {
    let keys: Vec<String> = batch
        .iter()
        .filter_map(|d| Some(format!("{}\n{}", d.caller, d.idempotency_key.as_deref()?)))
        .collect();
    sqlx::query!(
        "SELECT pg_advisory_xact_lock($1, h)::TEXT FROM (
             SELECT DISTINCT hashtext(k) AS h FROM UNNEST($2::TEXT[]) AS k ORDER BY 1
         ) AS keys",
        KEY_LOCK_CLASS,
        &keys,
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(|err| db.error(err))?;
    Ok(())
}

/// `earlier_at`: batch positions (from 1) whose keys already deleted `earlier_plant`.
struct BatchRow {
    deleted: Vec<i64>,
    present: Vec<i64>,
    earlier_at: Vec<i64>,
    earlier_plant: Vec<i64>,
}

/// One autocommit statement, unless a request carries a key: then the keys are locked first
/// in one transaction, and the statement gets only what that wait left of `deadline`.
pub(crate) async fn run(
    db: &Database,
    conn: &mut PgConnection,
    batch: &[Deletion],
    idempotency_ttl: f64,
    deadline: Instant,
) -> Result<Vec<DeletionOutcome>, StoreError> {
    let row = if batch.iter().any(|d| d.idempotency_key.is_some()) {
        let mut tx = conn.begin().await.map_err(|err| db.error(err))?;
        lock_keys(db, &mut tx, batch).await?;
        tx.execute(AssertSqlSafe(local_limits(deadline)?))
            .await
            .map_err(|err| db.error(err))?;
        let row = statement(&mut tx, batch, idempotency_ttl)
            .await
            .map_err(|err| db.error(err))?;
        // Past the deadline the request was answered 503: roll back (drop) instead.
        remaining(deadline)?;
        replicated(db, tx.commit()).await?;
        row
    } else {
        // Autocommit: the statement's answer is its commit's.
        replicated(db, statement(conn, batch, idempotency_ttl)).await?
    };
    let earlier: HashMap<usize, i64> = row
        .earlier_at
        .iter()
        .zip(&row.earlier_plant)
        .filter_map(|(at, plant)| Some((usize::try_from(*at).ok()?.checked_sub(1)?, *plant)))
        .collect();
    let outcomes = BatchResult {
        removed: row.deleted.into_iter().collect(),
        present: row.present.into_iter().collect(),
        earlier,
    }
    .outcomes(batch);
    // A replayed 204 vouches for an earlier commit, which may have become visible before
    // the standbys had it. A batch that deleted waited for them in its own commit, after
    // it saw that one; a batch that wrote nothing did not wait at all.
    if outcomes.contains(&DeletionOutcome::Replayed)
        && !outcomes.contains(&DeletionOutcome::Removed)
    {
        barrier(db, conn).await?;
    }
    Ok(outcomes)
}

async fn statement(
    conn: &mut PgConnection,
    batch: &[Deletion],
    idempotency_ttl: f64,
) -> Result<BatchRow, sqlx::Error> {
    let ids: Vec<i64> = batch.iter().map(|d| d.plant_id).collect();
    let callers: Vec<&str> = batch.iter().map(|d| d.caller.as_ref()).collect();
    let request_ids: Vec<&str> = batch.iter().map(|d| d.request_id.as_str()).collect();
    let keys: Vec<Option<&str>> = batch.iter().map(|d| d.idempotency_key.as_deref()).collect();
    // `earlier`: keys the same callers used within the replay window (those deletions do
    // nothing now). `present` reads the snapshot from before the delete: a row present but
    // not deleted is held elsewhere (or deleted by a later commit), and is retried alone
    // rather than waited for. Casts keep parameters BIGINT whatever type `plants.id` has.
    sqlx::query_as!(
            BatchRow,
            r#"WITH batch AS (
                   SELECT * FROM UNNEST($1::BIGINT[], $2::TEXT[], $3::TEXT[], $4::TEXT[])
                       WITH ORDINALITY AS b (plant_id, caller, request_id, idempotency_key, n)
               ),
               earlier AS (
                   SELECT b.n, e.plant_id
                   FROM batch b
                   CROSS JOIN LATERAL (
                       SELECT d.plant_id FROM plantstore_deletions d
                       WHERE d.token_name = b.caller AND d.idempotency_key = b.idempotency_key
                         AND d.deleted_at > now() - make_interval(secs => $5)
                       ORDER BY d.id DESC LIMIT 1
                   ) e
                   WHERE b.idempotency_key IS NOT NULL
               ),
               fresh AS (
                   SELECT * FROM batch WHERE n NOT IN (SELECT n FROM earlier)
               ),
               deleted AS (
                   DELETE FROM plants p
                   WHERE p.id IN (SELECT id FROM plants
                                  WHERE id = ANY (ARRAY(SELECT plant_id FROM fresh))
                                  FOR UPDATE SKIP LOCKED)
                   RETURNING p.id, to_jsonb(p) AS snapshot
               ),
               audited AS (
                   INSERT INTO plantstore_deletions
                       (plant_id, token_name, request_id, idempotency_key, snapshot, deleted_at)
                   SELECT f.plant_id, f.caller, f.request_id, f.idempotency_key, deleted.snapshot, now()
                   FROM fresh f JOIN deleted ON deleted.id = f.plant_id
                   RETURNING plant_id
               )
               SELECT ARRAY(SELECT plant_id FROM audited) AS "deleted!",
                      ARRAY(SELECT id::BIGINT FROM plants WHERE id = ANY ($1::BIGINT[])) AS "present!",
                      ARRAY(SELECT n FROM earlier ORDER BY n) AS "earlier_at!",
                      ARRAY(SELECT plant_id FROM earlier ORDER BY n) AS "earlier_plant!""#,
            &ids,
            &callers as &[&str],
            &request_ids as &[&str],
            &keys as &[Option<&str>],
            idempotency_ttl,
        )
        .fetch_one(&mut *conn)
        .await
}

type WorkerConnection = LimitedConnection<PoolConnection<Postgres>>;

/// Sets them only when those in force do not serve (`WaitLimit::limit_to_set`). They stay
/// with the session, so a worker's connection that fails is closed, never handed back to the
/// pool where other queries would inherit them.
async fn limit_session(
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

/// For the rest of the transaction; sent with `BEGIN`, and again before a second waiting
/// statement: each limit counts from its statement's start, so it must not get the whole again.
fn local_limits(deadline: Instant) -> Result<String, StoreError> {
    Ok(set_wait_limits(
        "SET LOCAL",
        statement_share(remaining(deadline)?),
    ))
}

/// In whole milliseconds, at least one: zero would mean no limit at all.
fn set_wait_limits(set: &str, limit: Duration) -> String {
    let millis = limit.as_millis().max(1);
    format!("{set} lock_timeout = {millis}; {set} statement_timeout = {millis}")
}
