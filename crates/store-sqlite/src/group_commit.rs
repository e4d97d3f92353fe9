//! The group commit on SQLite: one transaction on the write connection per batch.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use plantstore_group_commit::{
    BatchResult, BatchWriter, DeletionOutcome, earliest, only_outcome, remaining,
};
use plantstore_store::{Deletion, StoreError, time::before_now};
use sqlx::{AssertSqlSafe, Connection, SqliteConnection};

use crate::{WriteConnection, errors::classify, snapshot};

/// Two statements per batch, three when a request carries an idempotency key.
pub(crate) struct SqliteBatchWriter {
    connection: Arc<WriteConnection>,
    idempotency_ttl: Duration,
    /// Built from the columns of `plants` at the first delete.
    delete_statement: tokio::sync::OnceCell<String>,
}

impl SqliteBatchWriter {
    pub(crate) fn new(connection: Arc<WriteConnection>, idempotency_ttl: Duration) -> Self {
        Self {
            connection,
            idempotency_ttl,
            delete_statement: tokio::sync::OnceCell::new(),
        }
    }
}

#[async_trait]
impl BatchWriter for SqliteBatchWriter {
    #[tracing::instrument(level = "debug", skip_all, fields(size = batch.len()))]
    async fn delete_batch(&self, batch: &[Deletion]) -> Result<Vec<DeletionOutcome>, StoreError> {
        let mut turn = self.connection.lock_by(earliest(batch)?).await?;
        let conn = turn.conn()?;
        let delete_statement = self
            .delete_statement
            .get_or_try_init(|| snapshot::delete_statement(&mut *conn))
            .await?;
        let since = before_now(self.idempotency_ttl).unwrap_or(DateTime::<Utc>::MIN_UTC);
        match commit_batch(conn, delete_statement, since, batch).await {
            Ok(outcomes) => Ok(outcomes),
            Err(err) => {
                let err = turn.caller_error(err);
                turn.discard().await;
                Err(err)
            }
        }
    }

    /// SQLite has no row locks to wait for: one deletion alone is a batch of one.
    async fn delete_one(&self, deletion: &Deletion) -> Result<DeletionOutcome, StoreError> {
        only_outcome(self.delete_batch(std::slice::from_ref(deletion)).await?)
    }
}

async fn commit_batch(
    conn: &mut SqliteConnection,
    delete_statement: &str,
    since: DateTime<Utc>,
    batch: &[Deletion],
) -> Result<Vec<DeletionOutcome>, StoreError> {
    // IMMEDIATE takes the write lock up front: another process's writer makes this wait on
    // the busy timeout instead of failing to upgrade a read lock. Holding it, the keys
    // read below cannot be used by another writer before this commit.
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(classify)?;
    let earlier = earlier_deletions(&mut tx, since, batch).await?;
    let ids = to_json(
        &batch
            .iter()
            .enumerate()
            .filter(|(index, _)| !earlier.contains_key(index))
            .map(|(_, d)| d.plant_id)
            .collect::<Vec<_>>(),
    )?;
    let deleted: HashMap<i64, String> =
        sqlx::query_as::<_, (i64, String)>(AssertSqlSafe(delete_statement))
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(classify)?
            .into_iter()
            .collect();
    let outcomes = BatchResult {
        removed: deleted.keys().copied().collect(),
        present: HashSet::new(),
        earlier,
    }
    .outcomes(batch);
    if !deleted.is_empty() {
        let audit: Vec<AuditRow<'_>> = batch
            .iter()
            .zip(&outcomes)
            .filter(|(_, outcome)| **outcome == DeletionOutcome::Removed)
            .map(|(d, _)| {
                (
                    d.plant_id,
                    d.caller.as_ref(),
                    d.request_id.as_str(),
                    d.idempotency_key.as_deref(),
                    deleted.get(&d.plant_id),
                )
            })
            .collect();
        let audit = to_json(&audit)?;
        sqlx::query!(
            "INSERT INTO plantstore_deletions
                 (plant_id, token_name, request_id, idempotency_key, snapshot, deleted_at)
             SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, ?
             FROM json_each(?)",
            Utc::now(),
            audit,
        )
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    }
    // Deferred foreign keys are checked here; `classify` still reports them by kind.
    // Past the batch's deadline a request of it has been answered 503: roll back (drop).
    remaining(earliest(batch)?)?;
    tx.commit().await.map_err(classify)?;
    Ok(outcomes)
}

/// Batch positions whose caller used its key since `since`, and the plant it deleted. No
/// statement when no deletion has a key.
async fn earlier_deletions(
    conn: &mut SqliteConnection,
    since: DateTime<Utc>,
    batch: &[Deletion],
) -> Result<HashMap<usize, i64>, StoreError> {
    let keyed: Vec<(usize, &str, &str)> = batch
        .iter()
        .enumerate()
        .filter_map(|(index, d)| {
            let key = d.idempotency_key.as_deref()?;
            Some((index, d.caller.as_ref(), key))
        })
        .collect();
    if keyed.is_empty() {
        return Ok(HashMap::new());
    }
    let keyed = to_json(&keyed)?;
    let found = sqlx::query!(
        r#"SELECT b.value ->> 0 AS "index!: i64", MAX(d.id) AS "entry!: i64", d.plant_id AS "plant_id!: i64"
           FROM json_each(?) AS b
           JOIN plantstore_deletions AS d
             ON d.token_name = b.value ->> 1 AND d.idempotency_key = b.value ->> 2
           WHERE d.deleted_at > ?
           GROUP BY b.value ->> 0"#,
        keyed,
        since,
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(classify)?;
    Ok(found
        .into_iter()
        .filter_map(|row| Some((usize::try_from(row.index).ok()?, row.plant_id)))
        .collect())
}

/// Plant id, caller, request id, idempotency key, snapshot.
type AuditRow<'a> = (i64, &'a str, &'a str, Option<&'a str>, Option<&'a String>);

/// Batches travel as JSON arrays: SQLite has no array parameters, and `json_each` keeps
/// each statement a single checked query whatever the batch's size.
fn to_json(value: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|err| StoreError::Other(Arc::new(sqlx::Error::Encode(err.into()))))
}
