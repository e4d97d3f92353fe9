//! The storage interface on an SQLite file: WAL, foreign keys on, every commit synced.

use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use plantstore_store::{
    DeletionAudit, PoolSettings, Store, StoreError, TokenRecord, probe, schema_verdict,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// SQLite result codes (low byte of the extended code) that mean "busy, try again".
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_CANTOPEN: i32 = 14;

#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens the pool and one connection, so a bad path fails at start, not on a request.
    pub async fn connect(url: &str, settings: PoolSettings) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|err| {
                StoreError::Config(format!("DATABASE_URL is not a usable SQLite URL: {err}"))
            })?
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a 204 is only sent after the delete is synced to disk.
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            // A writer waits as long as a request may wait for a connection, then gets a 503.
            .busy_timeout(settings.acquire_timeout);
        probe(&options, settings.acquire_timeout)
            .await
            .map_err(classify)?;
        let pool = SqlitePoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout)
            .connect_with(options)
            .await
            .map_err(classify)?;
        Ok(Self { pool })
    }
}

fn classify(err: sqlx::Error) -> StoreError {
    StoreError::classify(err, |db| {
        let primary = db
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            .map(|code| code & 0xff);
        matches!(primary, Some(SQLITE_BUSY | SQLITE_LOCKED | SQLITE_CANTOPEN))
    })
}

#[async_trait]
impl Store for SqliteStore {
    #[tracing::instrument(skip(self))]
    async fn migrate(&self) -> Result<(), StoreError> {
        Ok(MIGRATOR.run(&self.pool).await?)
    }

    #[tracing::instrument(skip(self))]
    async fn check_schema(&self) -> Result<(), StoreError> {
        let found = sqlx::query!(
            r#"SELECT
                (SELECT COUNT(*) FROM pragma_table_info('plants') WHERE name = 'id') AS "plants_id!: i64",
                (SELECT COUNT(*) FROM sqlite_master
                  WHERE type = 'table' AND name IN ('plantstore_tokens', 'plantstore_deletions')) AS "own_tables!: i64""#
        )
        .fetch_one(&self.pool)
        .await
        .map_err(classify)?;
        schema_verdict(found.plants_id > 0, found.own_tables == 2)
    }

    #[tracing::instrument(skip(self))]
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query!("SELECT 1 AS one")
            .fetch_one(&self.pool)
            .await
            .map_err(classify)?;
        Ok(())
    }

    #[tracing::instrument(skip(self, audit), fields(request_id = audit.request_id))]
    async fn delete_plant(&self, id: i64, audit: &DeletionAudit<'_>) -> Result<(), StoreError> {
        // IMMEDIATE takes the write lock up front, so concurrent deleters queue on the busy
        // timeout instead of failing to upgrade a read lock.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(classify)?;
        let deleted = sqlx::query!("DELETE FROM plants WHERE id = ?", id)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        if deleted.rows_affected() == 0 {
            tx.rollback().await.map_err(classify)?;
            return Err(StoreError::NotFound);
        }
        sqlx::query!(
            "INSERT INTO plantstore_deletions (plant_id, token_name, request_id, deleted_at)
             VALUES (?, ?, ?, ?)",
            id,
            audit.token_name,
            audit.request_id,
            audit.deleted_at,
        )
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        // Deferred foreign keys are checked here; `classify` still reports them by kind.
        tx.commit().await.map_err(classify)
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
        .execute(&self.pool)
        .await
        .map_err(classify)?;
        Ok(done.rows_affected())
    }

    #[tracing::instrument(skip(self, token), fields(name = %token.name))]
    async fn insert_token(&self, token: &TokenRecord) -> Result<(), StoreError> {
        sqlx::query!(
            "INSERT INTO plantstore_tokens (name, lookup_id, secret_hash, created_at, expires_at, revoked_at)
             VALUES (?, ?, ?, ?, ?, ?)",
            token.name,
            token.lookup_id,
            token.secret_hash,
            token.created_at,
            token.expires_at,
            token.revoked_at,
        )
        .execute(&self.pool)
        .await
        .map_err(classify)?;
        Ok(())
    }

    #[tracing::instrument(skip(self))]
    async fn find_token(&self, lookup_id: &str) -> Result<Option<TokenRecord>, StoreError> {
        sqlx::query_as!(
            TokenRecord,
            r#"SELECT name AS "name!", lookup_id AS "lookup_id!", secret_hash AS "secret_hash!",
                      created_at AS "created_at!: DateTime<Utc>",
                      expires_at AS "expires_at?: DateTime<Utc>",
                      revoked_at AS "revoked_at?: DateTime<Utc>"
               FROM plantstore_tokens WHERE lookup_id = ?"#,
            lookup_id
        )
        .fetch_optional(&self.pool)
        .await
        .map_err(classify)
    }

    #[tracing::instrument(skip(self))]
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        sqlx::query_as!(
            TokenRecord,
            r#"SELECT name AS "name!", lookup_id AS "lookup_id!", secret_hash AS "secret_hash!",
                      created_at AS "created_at!: DateTime<Utc>",
                      expires_at AS "expires_at?: DateTime<Utc>",
                      revoked_at AS "revoked_at?: DateTime<Utc>"
               FROM plantstore_tokens ORDER BY created_at, name"#
        )
        .fetch_all(&self.pool)
        .await
        .map_err(classify)
    }

    #[tracing::instrument(skip(self))]
    async fn revoke_token(&self, name: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
        let done = sqlx::query!(
            "UPDATE plantstore_tokens SET revoked_at = COALESCE(revoked_at, ?) WHERE name = ?",
            at,
            name
        )
        .execute(&self.pool)
        .await
        .map_err(classify)?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    #[tracing::instrument(skip(self))]
    async fn count_tokens(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar!(r#"SELECT COUNT(*) AS "count!: i64" FROM plantstore_tokens"#)
            .fetch_one(&self.pool)
            .await
            .map_err(classify)
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}
