//! The group commit on PostgreSQL: one statement per batch (one round trip), with the
//! callers' idempotency keys locked first when a request carries one; the commit workers'
//! kept connections, a deletion retried alone on a locked row, and word to the other
//! instances after each commit that deleted. PostgreSQL's own limits on how long a
//! statement may wait for a lock and run are set from a request's deadline: a statement cut
//! off by them rolls back instead of committing after its request was answered 503.

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
        // Bounded here too, not only by the server's limits: a server that stopped
        // answering (a host gone without a reset, a network cut) would hold the worker,
        // and the request's answer, forever.
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
        // same row commits first and this one then finds nothing: one 204. With a key, the
        // transaction first waits for any request holding the same key and looks for its
        // entry.
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

/// The advisory-lock class of idempotency keys (`pg_advisory_xact_lock(class, hash)`),
/// so they cannot collide with an owner's own one-number advisory locks.
const KEY_LOCK_CLASS: i32 = 0x706c_6e74;

/// Serialises, until the transaction ends, the requests of other instances that carry the
/// same callers' keys, so that the key lookup after it sees their commits. Keys are locked
/// in one order, so two batches never wait on each other.
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

/// What the batch statement found, per list: plants deleted, plants still present, and
/// the batch positions (from 1) whose keys already deleted a plant, with that plant.
struct BatchRow {
    deleted: Vec<i64>,
    present: Vec<i64>,
    earlier_at: Vec<i64>,
    earlier_plant: Vec<i64>,
}

/// One batch: one statement, and so one round trip, unless a request carries an
/// idempotency key; then the keys are locked first, in the same transaction.
/// `idempotency_ttl`: the replay window in seconds. `deadline`: the batch's earliest; the
/// session's limits bound each statement by it, and after waiting for keys the statement
/// gets only what is left.
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
    // Positions in the statement count from 1.
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
    // `earlier`: the entries whose keys the same callers used within the replay
    // window; those deletions do nothing now. Rows no other session holds are locked
    // and deleted; `present` reads the statement's snapshot, taken before the delete.
    // A row present but not deleted is held elsewhere (or was deleted by a commit after
    // the snapshot): it is retried alone rather than waited for here. Casts keep the
    // parameters BIGINT whatever the type of an existing `plants.id`.
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

/// Bounds the session's lock and statement waits by what `deadline` leaves, when the
/// limits in force do not already (see `WaitLimit::limit_to_set`): in a steady stream
/// one statement per connection, not one per batch.
///
/// The limits stay with the session, so a worker's connection that fails is closed, never
/// handed back to the pool where other queries would inherit them.
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

/// Both limits set, for the rest of this transaction, to a statement's share of what
/// `deadline` leaves now (sent with `BEGIN`, and again before a second waiting statement:
/// each limit counts from its statement's start, so that one must not get the whole again).
fn local_limits(deadline: Instant) -> Result<String, StoreError> {
    Ok(set_wait_limits(
        "SET LOCAL",
        statement_share(remaining(deadline)?),
    ))
}

/// `lock_timeout` and `statement_timeout` both set to `limit`, with `set` (`SET` for the
/// session, `SET LOCAL` for the transaction), in whole milliseconds, at least one: zero
/// would mean no limit at all.
fn set_wait_limits(set: &str, limit: Duration) -> String {
    let millis = limit.as_millis().max(1);
    format!("{set} lock_timeout = {millis}; {set} statement_timeout = {millis}")
}
