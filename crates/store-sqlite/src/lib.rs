//! The storage interface on an SQLite file: WAL, foreign keys on, every commit synced, one
//! write connection and a pool of readers.

mod deletion_log;
mod destinations;
mod errors;
mod group_commit;
mod snapshot;
mod tokens;

use std::{str::FromStr, sync::Arc, time::Duration};

use async_trait::async_trait;
use plantstore_group_commit::{Batcher, KeptConnections, LimitedConnection, remaining, wait_until};
use plantstore_store::{
    CommitNewsReceiver, Deleted, Deletion, Store, StoreError, StoreSettings, StoreStats,
    backend::{CommitNews, SchemaFacts, schema_verdict},
};
use sqlx::{
    AssertSqlSafe, ConnectOptions, Connection, Executor, Sqlite, SqliteConnection,
    pool::PoolConnection,
    sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
    },
};
use tokio::{
    sync::{Mutex, MutexGuard},
    time::Instant,
};

use errors::{classify, is_busy};
use group_commit::SqliteBatchWriter;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

#[derive(Debug, Clone)]
pub struct SqliteStore {
    write_connection: Arc<WriteConnection>,
    readers: SqlitePool,
    batcher: Batcher,
    news: CommitNews,
}

/// Also used by the benchmark's raw SQLite loop, so that both pay for the same durability.
pub fn connect_options(
    url: &str,
    settings: &StoreSettings,
) -> Result<SqliteConnectOptions, StoreError> {
    Ok(SqliteConnectOptions::from_str(url)
        .map_err(|err| {
            StoreError::Config(format!("DATABASE_URL is not a usable SQLite URL: {err}"))
        })?
        .journal_mode(SqliteJournalMode::Wal)
        // FULL: a 204 is only sent after the delete is synced to disk.
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        // Another process's writer holds the lock at most this long before a 503.
        .busy_timeout(settings.acquire_timeout))
}

/// The file a SQLite URL names, made absolute, when it does not exist (in-memory always does).
pub fn missing_file(url: &str) -> Option<std::path::PathBuf> {
    let options = SqliteConnectOptions::from_str(url).ok()?;
    let file = options.get_filename();
    if file.as_os_str() == ":memory:" || file.exists() {
        return None;
    }
    Some(std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf()))
}

impl SqliteStore {
    /// A bad path fails here, not on a request.
    pub async fn connect(url: &str, settings: StoreSettings) -> Result<Self, StoreError> {
        let options = connect_options(url, &settings)?;
        // The pool retries a refused connection until its timeout, then reports only that it
        // timed out: one connection first reports the cause ("unable to open file").
        match tokio::time::timeout(settings.acquire_timeout, options.connect()).await {
            Ok(connection) => connection
                .map_err(classify)?
                .close()
                .await
                .map_err(classify)?,
            Err(_elapsed) => return Err(classify(sqlx::Error::PoolTimedOut)),
        }
        let write_pool = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(settings.acquire_timeout)
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await
            .map_err(classify)?;
        let readers = SqlitePoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout)
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .map_err(classify)?;
        let write_connection = Arc::new(WriteConnection::new(write_pool, settings.acquire_timeout));
        let news = CommitNews::default();
        let batch_writer =
            SqliteBatchWriter::new(Arc::clone(&write_connection), settings.idempotency_ttl);
        let batcher = Batcher::start(
            Arc::new(batch_writer),
            1,
            news.clone(),
            settings.commit_observer,
        );
        Ok(Self {
            write_connection,
            readers,
            batcher,
            news,
        })
    }
}

#[async_trait]
impl Store for SqliteStore {
    #[tracing::instrument(skip(self))]
    async fn migrate(&self) -> Result<(), StoreError> {
        self.write_connection.migrate().await
    }

    #[tracing::instrument(skip(self))]
    async fn check_schema(&self) -> Result<(), StoreError> {
        // INTEGER affinity is any declared type containing "INT" (SQLite's own rule). Unique:
        // the whole primary key, or a unique index on exactly (id) without a WHERE clause.
        let facts = sqlx::query_as!(
            SchemaFacts,
            r#"SELECT
                (SELECT coalesce(nullif(type, ''), '(no declared type)') FROM pragma_table_info('plants') WHERE name = 'id') AS "plants_id_type?: String",
                coalesce((SELECT instr(upper(type), 'INT') > 0 FROM pragma_table_info('plants') WHERE name = 'id'), false) AS "plants_id_is_integer!: bool",
                ((SELECT pk FROM pragma_table_info('plants') WHERE name = 'id') = 1
                 AND (SELECT COUNT(*) FROM pragma_table_info('plants') WHERE pk > 0) = 1)
                OR EXISTS (SELECT 1 FROM pragma_index_list('plants') AS il
                           WHERE il."unique" = 1 AND il.partial = 0
                             AND (SELECT COUNT(*) FROM pragma_index_info(il.name)) = 1
                             AND (SELECT name FROM pragma_index_info(il.name)) = 'id') AS "plants_id_is_unique!: bool",
                (SELECT COUNT(*) FROM sqlite_master
                  WHERE type = 'table' AND name IN ('plantstore_tokens', 'plantstore_deletions',
                                                 'plantstore_webhook_endpoints',
                                                 'plantstore_stream_subjects',
                                                 'plantstore_leases'))
                + (SELECT COUNT(*) FROM pragma_table_info('plantstore_deletions')
                    WHERE name = 'snapshot')
                + (SELECT COUNT(*) FROM pragma_table_info('plantstore_webhook_endpoints')
                    WHERE name IN ('previous_secret', 'subject_prefix')) = 8 AS "has_own_tables!: bool""#
        )
        .fetch_one(&self.readers)
        .await
        .map_err(classify)?;
        schema_verdict(&facts)
    }

    #[tracing::instrument(skip(self))]
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query!("SELECT 1 AS one")
            .fetch_one(&self.readers)
            .await
            .map_err(classify)?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(id = deletion.plant_id, request_id = deletion.request_id))]
    async fn delete_plant(&self, deletion: Deletion) -> Result<Deleted, StoreError> {
        self.batcher.delete(deletion).await
    }

    #[tracing::instrument(skip(self))]
    async fn seed_plants(&self, count: i64) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            "WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < ?)
             INSERT INTO plants (id, name, tag)
             SELECT n, 'Plant ' || n, 'demo' FROM seq WHERE true
             ON CONFLICT (id) DO NOTHING",
            count
        )
        .execute(self.write_connection.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        Ok(done.rows_affected())
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            pool_size: self.readers.size(),
            pool_idle: self.readers.num_idle(),
            queued: self.batcher.queued(),
            database_hosts: 1,
            host_changes: 0,
        }
    }

    /// Another process's commits are found by delivery's poll.
    fn commits(&self) -> CommitNewsReceiver {
        self.news.subscribe()
    }

    async fn close(&self) {
        self.write_connection.close().await;
        self.readers.close().await;
    }
}

type KeptWriteConnection = LimitedConnection<PoolConnection<Sqlite>>;

/// The one connection this process writes with: its own writes never wait on each other's
/// locks, and the group commit shares its syncs. Kept between uses (`KeptConnections`).
#[derive(Debug)]
pub(crate) struct WriteConnection {
    pool: SqlitePool,
    kept: KeptConnections<KeptWriteConnection>,
    turn: Mutex<()>,
    /// `PLANTSTORE_DB_ACQUIRE_TIMEOUT`, for another process's write lock.
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

    /// For a command: waits as long as for another process's write lock.
    pub(crate) async fn lock(&self) -> Result<WriteTurn<'_>, StoreError> {
        self.lock_by(Instant::now() + self.busy_wait).await
    }

    /// The busy wait for another process's write lock ends by `deadline` too, so a batch
    /// never begins after its request was answered.
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

/// This process's turn to write. A failed batch closes the connection (`discard`) rather than
/// keep it: a failed commit (a full disk) left sqlx believing a transaction still open on it,
/// and every later `BEGIN` there was refused.
pub(crate) struct WriteTurn<'a> {
    _turn: MutexGuard<'a, ()>,
    conn: Option<KeptWriteConnection>,
    kept: &'a KeptConnections<KeptWriteConnection>,
    /// The busy wait ends with the deadline, not before: a busy error means it passed.
    ends_with_deadline: bool,
}

impl WriteTurn<'_> {
    /// A busy wait cut off by the deadline is the deadline's error.
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
