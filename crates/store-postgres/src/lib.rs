//! The storage interface on PostgreSQL, over TLS (rustls) when the URL asks for it.

use std::{
    str::FromStr,
    sync::{Arc, Mutex, PoisonError},
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use plantstore_store::{
    BatchWriter, Batcher, Deleted, Deletion, DeletionFilter, DeletionRecord, EntryState, Histogram,
    Outcome, RestoreError, SchemaFacts, Store, StoreError, StoreSettings, StoreStats, TokenRecord,
    probe, schema_verdict,
};
use sqlx::{
    Acquire, PgConnection, Postgres,
    pool::PoolConnection,
    postgres::{PgConnectOptions, PgPool, PgPoolOptions},
};
use tokio::sync::Semaphore;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// SQLSTATE classes and codes after which the same request may well succeed later:
/// connection exceptions, insufficient resources, operator intervention (shutdowns,
/// `cannot_connect_now`), the serialization failures a retry resolves, and a server that
/// will not take writes now (`read_only_sql_transaction`: in recovery, or read-only after a
/// failover). Also lock_not_available and query_canceled: what `lock_timeout` (or a DBA's
/// timeout) raises when another session holds the row too long. Whatever fails while a
/// connection is being got or opened is unavailable too, whatever its code (see
/// `connection`).
const TRANSIENT_CLASSES: [&str; 3] = ["08", "53", "57P"];
const TRANSIENT_CODES: [&str; 5] = ["25006", "40001", "40P01", "55P03", "57014"];

/// How many group commits one instance keeps in flight, each on its own connection. Two
/// let one batch execute while the other waits for its WAL flush; more lanes made
/// smaller batches and cost more CPU per delete in the benchmark (bench/RESULTS.md).
pub fn batch_lanes(max_connections: u32) -> usize {
    (max_connections / 4).clamp(1, 2) as usize
}

#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    writer: Arc<PgWriter>,
    batcher: Batcher,
}

impl PostgresStore {
    async fn connection(&self) -> Result<PoolConnection<Postgres>, StoreError> {
        self.pool.acquire().await.map_err(unavailable)
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("pool", &self.pool)
            .field("batcher", &self.batcher)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Opens the pool and one connection, so a wrong host or password fails at start.
    pub async fn connect(url: &str, settings: StoreSettings) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|err| {
                StoreError::Config(format!(
                    "DATABASE_URL is not a usable PostgreSQL URL: {err}"
                ))
            })?
            .application_name("plantstore")
            // A delete blocked on a row another session holds gives up as a 503 after the
            // same wait as for a connection, instead of holding its connection forever.
            .options([(
                "lock_timeout",
                format!("{}ms", settings.acquire_timeout.as_millis()),
            )]);
        probe(&options, settings.acquire_timeout)
            .await
            .map_err(classify)?;
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout)
            // A dead connection fails its statement and is dropped; a ping before every
            // use would add a round trip to each request to find that out sooner.
            .test_before_acquire(false)
            .after_connect(|conn, _meta| Box::pin(prefer_generic_plans(conn)))
            .connect_with(options)
            .await
            .map_err(classify)?;
        let lanes = batch_lanes(settings.max_connections);
        let writer = Arc::new(PgWriter {
            pool: pool.clone(),
            kept: Mutex::new(Some(Vec::new())),
            idempotency_ttl: settings.idempotency_ttl.as_secs_f64(),
            alone: Semaphore::new(
                (settings.max_connections as usize)
                    .saturating_sub(lanes)
                    .max(1),
            ),
        });
        let batcher = Batcher::start(Arc::clone(&writer) as Arc<dyn BatchWriter>, lanes);
        Ok(Self {
            pool,
            writer,
            batcher,
        })
    }
}

/// The batch statement takes arrays, for which the planner never trusts a generic plan,
/// so by default it is planned anew on every execution: 0.1-0.25 ms of a delete that
/// otherwise takes 0.05 ms (`EXPLAIN ANALYZE`, PostgreSQL 15). The service's statements
/// are all point lookups by key, which a generic plan serves as well. A server too old to
/// know the setting (before 12) keeps planning each time; nothing else changes.
async fn prefer_generic_plans(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    use sqlx::Executor;
    if let Err(err) = conn
        .execute("SET plan_cache_mode = force_generic_plan")
        .await
    {
        tracing::debug!(error = %err, "this server plans every statement anew");
    }
    Ok(())
}

/// Any failure to get a connection (refused, database gone or not accepting connections,
/// password rotated, too many clients, TLS refused, pool exhausted) means the database
/// cannot serve now: decided by where it happened, not by a list of codes.
fn unavailable(err: sqlx::Error) -> StoreError {
    StoreError::Unavailable(Arc::new(err))
}

fn classify(err: sqlx::Error) -> StoreError {
    StoreError::classify(err, |db| {
        db.code().is_some_and(|code| {
            TRANSIENT_CODES.contains(&code.as_ref())
                || TRANSIENT_CLASSES
                    .iter()
                    .any(|class| code.starts_with(class))
        })
    })
}

/// Commits the batches: each is one autocommit statement, so one round trip.
struct PgWriter {
    pool: PgPool,
    /// Connections the lanes keep between batches. sqlx pings a connection every time it
    /// goes back to the pool (strace: a second round trip per batch); a kept one is not
    /// returned until a batch fails on it or the store closes. `None` once closing.
    kept: Mutex<Option<Vec<PoolConnection<Postgres>>>>,
    /// `PLANTSTORE_IDEMPOTENCY_TTL` in seconds, for `make_interval`.
    idempotency_ttl: f64,
    /// Deletions waiting alone for a held row may take only the connections the batch
    /// lanes do not need.
    alone: Semaphore,
}

impl PgWriter {
    async fn connection(&self) -> Result<PoolConnection<Postgres>, StoreError> {
        let kept = self
            .kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
            .and_then(Vec::pop);
        match kept {
            Some(conn) => Ok(conn),
            None => self.pool.acquire().await.map_err(unavailable),
        }
    }

    /// Keeps a connection that just served a batch, unless the store is closing.
    fn keep(&self, conn: PoolConnection<Postgres>) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kept) = kept.as_mut() {
            kept.push(conn);
        }
    }

    /// Hands every kept connection back, so that closing the pool does not wait for them.
    fn release_all(&self) {
        let kept = self
            .kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(kept);
    }
}

/// The advisory-lock class of idempotency keys (`pg_advisory_xact_lock(class, hash)`),
/// so they cannot collide with an owner's own one-number advisory locks.
const KEY_LOCK_CLASS: i32 = 0x706c_6e74;

/// Serialises, until the transaction ends, the requests of other instances that carry the
/// same callers' keys, so that the key lookup after it sees their commits. Keys are locked
/// in one order, so two batches never wait on each other.
async fn lock_keys(conn: &mut PgConnection, batch: &[Deletion]) -> Result<(), StoreError> {
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
    .map_err(classify)?;
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

impl PgWriter {
    /// One batch: one statement, and so one round trip, unless a request carries an
    /// idempotency key; then the keys are locked first, in the same transaction.
    async fn run_batch(
        &self,
        conn: &mut PgConnection,
        batch: &[Deletion],
    ) -> Result<Vec<Outcome>, StoreError> {
        let row = if batch.iter().any(|d| d.idempotency_key.is_some()) {
            let mut tx = conn.begin().await.map_err(classify)?;
            lock_keys(&mut tx, batch).await?;
            let row = self.batch_statement(&mut tx, batch).await?;
            tx.commit().await.map_err(classify)?;
            row
        } else {
            self.batch_statement(conn, batch).await?
        };
        Ok(batch
            .iter()
            .zip(1i64..)
            .map(|(d, n)| {
                let earlier = row
                    .earlier_at
                    .iter()
                    .position(|at| *at == n)
                    .and_then(|at| row.earlier_plant.get(at).copied());
                match earlier {
                    Some(plant_id) if plant_id == d.plant_id => Outcome::Replayed,
                    Some(plant_id) => Outcome::KeyReused(plant_id),
                    None if row.deleted.contains(&d.plant_id) => Outcome::Deleted,
                    None if row.present.contains(&d.plant_id) => Outcome::Held,
                    None => Outcome::NotFound,
                }
            })
            .collect())
    }

    async fn batch_statement(
        &self,
        conn: &mut PgConnection,
        batch: &[Deletion],
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
        let rows = sqlx::query!(
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
            self.idempotency_ttl,
        )
        .fetch_all(&mut *conn)
        .await
        .map_err(classify)?;
        let row = rows
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::Other(Arc::new(sqlx::Error::RowNotFound)))?;
        Ok(BatchRow {
            deleted: row.deleted,
            present: row.present,
            earlier_at: row.earlier_at,
            earlier_plant: row.earlier_plant,
        })
    }
}

#[async_trait]
impl BatchWriter for PgWriter {
    #[tracing::instrument(level = "debug", skip_all, fields(size = batch.len()))]
    async fn delete_batch(&self, batch: &[Deletion]) -> Result<Vec<Outcome>, StoreError> {
        let mut conn = self.connection().await?;
        // A connection a batch failed on goes back to the pool, which drops it if broken.
        let outcomes = self.run_batch(&mut conn, batch).await?;
        self.keep(conn);
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
        let outcome = match earlier {
            Some(plant_id) if plant_id == deletion.plant_id => Outcome::Replayed,
            Some(plant_id) => Outcome::KeyReused(plant_id),
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

#[async_trait]
impl Store for PostgresStore {
    #[tracing::instrument(skip(self))]
    async fn migrate(&self) -> Result<(), StoreError> {
        Ok(MIGRATOR.run(&self.pool).await?)
    }

    #[tracing::instrument(skip(self))]
    async fn check_schema(&self) -> Result<(), StoreError> {
        // to_regclass resolves through search_path, as the service's own queries do. A
        // unique index counts only on exactly (id) and without a WHERE clause.
        let found = sqlx::query!(
            r#"WITH id AS (
                   SELECT attnum, atttypid, format_type(atttypid, atttypmod) AS type_name
                   FROM pg_attribute
                   WHERE attrelid = to_regclass('plants') AND attname = 'id' AND NOT attisdropped
               )
               SELECT
                   (SELECT type_name FROM id) AS "id_type?",
                   COALESCE((SELECT atttypid IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype)
                             FROM id), false) AS "id_is_integer!",
                   EXISTS (SELECT 1 FROM pg_index i, id
                           WHERE i.indrelid = to_regclass('plants') AND i.indisunique
                             AND i.indnkeyatts = 1 AND i.indkey[0] = id.attnum
                             AND i.indpred IS NULL) AS "id_is_unique!",
                   (to_regclass('plantstore_tokens') IS NOT NULL
                    AND EXISTS (SELECT 1 FROM pg_attribute
                                WHERE attrelid = to_regclass('plantstore_deletions')
                                  AND attname = 'snapshot' AND NOT attisdropped)) AS "own_tables!""#
        )
        .fetch_one(&mut *self.connection().await?)
        .await
        .map_err(classify)?;
        schema_verdict(&SchemaFacts {
            plants_id_type: found.id_type,
            plants_id_is_integer: found.id_is_integer,
            plants_id_is_unique: found.id_is_unique,
            has_own_tables: found.own_tables,
        })
    }

    #[tracing::instrument(skip(self))]
    async fn ping(&self) -> Result<(), StoreError> {
        // Ready means able to delete: a server that takes no writes is not.
        let read_only = sqlx::query_scalar!(
            r#"SELECT current_setting('transaction_read_only') = 'on' AS "read_only!""#
        )
        .fetch_all(&mut *self.connection().await?)
        .await
        .map_err(classify)?;
        if read_only.first().copied().unwrap_or(true) {
            return Err(StoreError::ReadOnly);
        }
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(id = deletion.plant_id, request_id = deletion.request_id))]
    async fn delete_plant(&self, deletion: Deletion) -> Result<Deleted, StoreError> {
        self.batcher.delete(deletion).await
    }

    #[tracing::instrument(skip(self))]
    async fn list_deletions(
        &self,
        filter: &DeletionFilter,
    ) -> Result<Vec<DeletionRecord>, StoreError> {
        sqlx::query_as!(
            DeletionRecord,
            r#"SELECT id, plant_id, token_name AS caller, request_id, idempotency_key,
                      deleted_at, snapshot::TEXT AS snapshot, restored_at, restored_by
               FROM plantstore_deletions
               WHERE ($1::BIGINT IS NULL OR plant_id = $1)
                 AND ($2::TEXT IS NULL OR token_name = $2)
                 AND ($3::TIMESTAMPTZ IS NULL OR deleted_at >= $3)
               ORDER BY id DESC LIMIT $4"#,
            filter.plant_id,
            filter.caller,
            filter.since,
            filter.limit,
        )
        .fetch_all(&mut *self.connection().await?)
        .await
        .map_err(classify)
    }

    #[tracing::instrument(skip(self))]
    async fn restore_deletion(&self, entry: i64, by: &str) -> Result<i64, RestoreError> {
        let mut conn = self.connection().await?;
        let mut tx = conn.begin().await.map_err(classify)?;
        // FOR UPDATE: a second restore of the same entry waits, then sees it restored.
        let found = sqlx::query_as!(
            EntryState,
            r#"SELECT plant_id, snapshot IS NOT NULL AS "has_snapshot!", restored_at, restored_by,
                      EXISTS (SELECT 1 FROM plants WHERE plants.id = log.plant_id) AS "plant_exists!"
               FROM plantstore_deletions AS log WHERE id = $1
               FOR UPDATE"#,
            entry
        )
        .fetch_optional(&mut *tx)
        .await
        .map_err(classify)?
        .ok_or(RestoreError::NoSuchEntry(entry))?;
        let plant_id = found.plant_id;
        found.restorable()?;
        let columns = sqlx::query!(
            r#"SELECT ARRAY(SELECT attname::TEXT FROM pg_attribute
                            WHERE attrelid = to_regclass('plants') AND attnum > 0
                              AND NOT attisdropped AND attgenerated = ''
                            ORDER BY attnum) AS "table!",
                      ARRAY(SELECT jsonb_object_keys(snapshot)) AS "held!"
               FROM plantstore_deletions WHERE id = $1"#,
            entry
        )
        .fetch_one(&mut *tx)
        .await
        .map_err(classify)?;
        plantstore_store::column_changes(&columns.table, &columns.held)?;
        // OVERRIDING SYSTEM VALUE: the plant gets its own id back even where `plants.id`
        // is GENERATED ALWAYS AS IDENTITY.
        sqlx::query!(
            "INSERT INTO plants OVERRIDING SYSTEM VALUE
             SELECT * FROM jsonb_populate_record(NULL::plants,
                 (SELECT snapshot FROM plantstore_deletions WHERE id = $1))",
            entry
        )
        .execute(&mut *tx)
        .await
        .map_err(|err| RestoreError::from_insert(classify(err)))?;
        sqlx::query!(
            "UPDATE plantstore_deletions SET restored_at = now(), restored_by = $2 WHERE id = $1",
            entry,
            by
        )
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        tx.commit()
            .await
            .map_err(|err| RestoreError::from_insert(classify(err)))?;
        Ok(plant_id)
    }

    #[tracing::instrument(skip(self))]
    async fn prune_deletions(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            "DELETE FROM plantstore_deletions WHERE deleted_at < $1",
            before
        )
        .execute(&mut *self.connection().await?)
        .await
        .map_err(classify)?;
        Ok(done.rows_affected())
    }

    #[tracing::instrument(skip(self))]
    async fn seed_plants(&self, count: i64) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            "INSERT INTO plants (id, name, tag)
             SELECT n, 'Plant ' || n, 'demo' FROM generate_series(1::bigint, $1::bigint) AS n
             ON CONFLICT (id) DO NOTHING",
            count
        )
        .execute(&mut *self.connection().await?)
        .await
        .map_err(classify)?;
        Ok(done.rows_affected())
    }

    #[tracing::instrument(skip(self, token), fields(name = %token.name))]
    async fn insert_token(&self, token: &TokenRecord) -> Result<(), StoreError> {
        sqlx::query!(
            "INSERT INTO plantstore_tokens (name, lookup_id, secret_hash, created_at, expires_at, revoked_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
            token.name,
            token.lookup_id,
            token.secret_hash,
            token.created_at,
            token.expires_at,
            token.revoked_at,
        )
        .execute(&mut *self.connection().await?)
        .await
        .map_err(classify)?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        sqlx::query_as!(
            TokenRecord,
            "SELECT name, lookup_id, secret_hash, created_at, expires_at, revoked_at
             FROM plantstore_tokens ORDER BY created_at, name"
        )
        .fetch_all(&mut *self.connection().await?)
        .await
        .map_err(classify)
    }

    #[tracing::instrument(skip(self))]
    async fn revoke_token(&self, name: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
        let done = sqlx::query!(
            "UPDATE plantstore_tokens SET revoked_at = COALESCE(revoked_at, $1) WHERE name = $2",
            at,
            name
        )
        .execute(&mut *self.connection().await?)
        .await
        .map_err(classify)?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    #[tracing::instrument(skip(self))]
    async fn count_tokens(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar!(r#"SELECT COUNT(*) AS "count!" FROM plantstore_tokens"#)
            .fetch_one(&mut *self.connection().await?)
            .await
            .map_err(classify)
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            pool_size: self.pool.size(),
            pool_idle: self.pool.num_idle(),
            queued: self.batcher.queued(),
        }
    }

    fn observe(&self, batch_sizes: Histogram) {
        self.batcher.observe(batch_sizes);
    }

    async fn close(&self) {
        self.writer.release_all();
        self.pool.close().await;
    }
}
