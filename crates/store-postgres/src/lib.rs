//! The storage interface on PostgreSQL, over TLS (rustls) when the URL asks for it.
//! Every query goes through `Database`.

mod announcements;
mod database;
mod deletion_log;
mod destinations;
mod failover;
mod group_commit;
mod hosts;
mod sync_replication;
mod tokens;

use std::sync::Arc;

use async_trait::async_trait;
use plantstore_group_commit::Batcher;
use plantstore_store::{
    CommitNewsReceiver, Deleted, Deletion, Store, StoreError, StoreSettings, StoreStats,
    backend::{CommitNews, SchemaFacts, schema_verdict},
};

use announcements::{AnnouncerId, Listening};
use database::Database;
use group_commit::PgBatchWriter;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

#[derive(Clone)]
pub struct PostgresStore {
    db: Database,
    writer: Arc<PgBatchWriter>,
    batcher: Batcher,
    news: CommitNews,
    /// What this store's announcements carry, so its own listener skips them.
    announcer: AnnouncerId,
    listening: Arc<Listening>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("pool", &self.db.pool)
            .field("batcher", &self.batcher)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Opens the pool and one connection, so a wrong host or password fails at start.
    pub async fn connect(url: &str, settings: StoreSettings) -> Result<Self, StoreError> {
        if !sync_replication::notices_visible() {
            return Err(StoreError::Config(
                "this build's tracing hides WARNING notices, so it cannot tell a commit the synchronous standbys lack".into(),
            ));
        }
        let db = Database::open(url, &settings).await?;
        // Two commit workers let one batch execute while the other waits for its WAL flush;
        // more made smaller batches and cost more CPU per delete (bench/JOURNAL.md).
        let workers = (settings.max_connections / 4).clamp(1, 2) as usize;
        let lone_retries = (settings.max_connections as usize)
            .saturating_sub(workers)
            .max(1);
        let announcer = AnnouncerId(uuid::Uuid::new_v4().to_string().into());
        let writer = Arc::new(PgBatchWriter::new(
            db.clone(),
            settings.idempotency_ttl.as_secs_f64(),
            lone_retries,
            announcer.clone(),
        ));
        let news = CommitNews::default();
        let batcher = Batcher::start(
            writer.clone(),
            workers,
            news.clone(),
            settings.commit_observer,
        );
        Ok(Self {
            db,
            writer,
            batcher,
            news,
            listening: Arc::new(Listening::new(announcer.clone())),
            announcer,
        })
    }
}

#[async_trait]
impl Store for PostgresStore {
    #[tracing::instrument(skip(self))]
    async fn migrate(&self) -> Result<(), StoreError> {
        Ok(MIGRATOR.run(&self.db.pool).await?)
    }

    #[tracing::instrument(skip(self))]
    async fn check_schema(&self) -> Result<(), StoreError> {
        // to_regclass resolves through search_path, as the service's own queries do. A
        // unique index counts only on exactly (id) and without a WHERE clause.
        let facts = sqlx::query_as!(
            SchemaFacts,
            r#"WITH id AS (
                   SELECT attnum, atttypid, format_type(atttypid, atttypmod) AS type_name
                   FROM pg_attribute
                   WHERE attrelid = to_regclass('plants') AND attname = 'id' AND NOT attisdropped
               )
               SELECT
                   (SELECT type_name FROM id) AS "plants_id_type?",
                   COALESCE((SELECT atttypid IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype)
                             FROM id), false) AS "plants_id_is_integer!",
                   EXISTS (SELECT 1 FROM pg_index i, id
                           WHERE i.indrelid = to_regclass('plants') AND i.indisunique
                             AND i.indnkeyatts = 1 AND i.indkey[0] = id.attnum
                             AND i.indpred IS NULL) AS "plants_id_is_unique!",
                   (to_regclass('plantstore_tokens') IS NOT NULL
                    AND to_regclass('plantstore_webhook_endpoints') IS NOT NULL
                    AND to_regclass('plantstore_stream_subjects') IS NOT NULL
                    AND to_regclass('plantstore_leases') IS NOT NULL
                    AND EXISTS (SELECT 1 FROM pg_attribute
                                WHERE attrelid = to_regclass('plantstore_deletions')
                                  AND attname = 'snapshot' AND NOT attisdropped)
                    AND EXISTS (SELECT 1 FROM pg_attribute
                                WHERE attrelid = to_regclass('plantstore_webhook_endpoints')
                                  AND attname = 'previous_secret' AND NOT attisdropped)
                    AND EXISTS (SELECT 1 FROM pg_attribute
                                WHERE attrelid = to_regclass('plantstore_webhook_endpoints')
                                  AND attname = 'subject_prefix' AND NOT attisdropped)) AS "has_own_tables!""#
        )
        .fetch_one(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))?;
        schema_verdict(&facts)
    }

    /// Ready means able to delete: a server that takes no writes is not. A connection
    /// that fails it, or finds the server read-only, is closed rather than reused.
    #[tracing::instrument(skip(self))]
    async fn ping(&self) -> Result<(), StoreError> {
        let db = &self.db;
        let mut conn = db.conn().await?;
        let read_only = sqlx::query_scalar!(
            r#"SELECT current_setting('transaction_read_only') = 'on' AS "read_only!""#
        )
        .fetch_all(&mut *conn)
        .await
        .map_err(|err| db.error(err));
        let refused = match read_only.map(|rows| rows.first().copied().unwrap_or(true)) {
            Ok(false) => return Ok(()),
            Ok(true) => db.report_to_failover(StoreError::ReadOnly),
            Err(err) => err,
        };
        conn.close_on_drop();
        Err(refused)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(id = deletion.plant_id, request_id = deletion.request_id))]
    async fn delete_plant(&self, deletion: Deletion) -> Result<Deleted, StoreError> {
        self.batcher.delete(deletion).await
    }

    #[tracing::instrument(skip(self))]
    async fn seed_plants(&self, count: i64) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            "INSERT INTO plants (id, name, tag)
             SELECT n, 'Plant ' || n, 'demo' FROM generate_series(1::bigint, $1::bigint) AS n
             ON CONFLICT (id) DO NOTHING",
            count
        )
        .execute(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))?;
        Ok(done.rows_affected())
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            pool_size: self.db.pool.size(),
            pool_idle: self.db.pool.num_idle(),
            queued: self.batcher.queued(),
            database_hosts: self.db.hosts(),
            host_changes: self.db.host_changes(),
        }
    }

    fn commits(&self) -> CommitNewsReceiver {
        let receiver = self.news.subscribe();
        self.listening
            .start_unless_running(&self.db.pool, &self.news);
        receiver
    }

    async fn close(&self) {
        self.writer.kept.release_all();
        self.db.pool.close().await;
    }
}
