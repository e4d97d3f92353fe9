//! The group commit on PostgreSQL: one statement per batch (one round trip), with the
//! callers' idempotency keys locked first when a request carries one.

use std::collections::HashMap;

use plantstore_group_commit::{BatchResult, DeletionOutcome};
use plantstore_store::{Deletion, StoreError};
use sqlx::{Acquire, Executor, PgConnection};
use tokio::time::Instant;

use crate::{
    database::Database,
    wait_limits::{may_commit, renew_local},
};

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
        tx.execute(renew_local(deadline)?)
            .await
            .map_err(|err| db.error(err))?;
        let row = statement(db, &mut tx, batch, idempotency_ttl).await?;
        may_commit(deadline)?;
        tx.commit().await.map_err(|err| db.error(err))?;
        row
    } else {
        statement(db, conn, batch, idempotency_ttl).await?
    };
    // Positions in the statement count from 1.
    let earlier: HashMap<usize, i64> = row
        .earlier_at
        .iter()
        .zip(&row.earlier_plant)
        .filter_map(|(at, plant)| Some((usize::try_from(*at).ok()?.checked_sub(1)?, *plant)))
        .collect();
    Ok(BatchResult {
        removed: row.deleted.into_iter().collect(),
        present: row.present.into_iter().collect(),
        earlier,
    }
    .outcomes(batch))
}

async fn statement(
    db: &Database,
    conn: &mut PgConnection,
    batch: &[Deletion],
    idempotency_ttl: f64,
) -> Result<BatchRow, StoreError> {
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
        .map_err(|err| db.error(err))
}
