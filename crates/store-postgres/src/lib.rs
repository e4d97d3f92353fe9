//! The storage interface on PostgreSQL, over TLS (rustls) when the URL asks for it.

use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use plantstore_store::{
    DeletionAudit, PoolSettings, Store, StoreError, TokenRecord, probe, schema_verdict,
};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// SQLSTATE classes and codes after which the same request may well succeed later:
/// connection exceptions, insufficient resources, operator intervention, and the
/// serialization failures a retry resolves.
/// Also lock_not_available and query_canceled: what `lock_timeout` (or a DBA's timeout)
/// raises when another session holds the row too long.
const TRANSIENT_CLASSES: [&str; 2] = ["08", "53"];
const TRANSIENT_CODES: [&str; 7] = [
    "57P01", "57P02", "57P03", "40001", "40P01", "55P03", "57014",
];

#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Opens the pool and one connection, so a wrong host or password fails at start.
    pub async fn connect(url: &str, settings: PoolSettings) -> Result<Self, StoreError> {
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
            .connect_with(options)
            .await
            .map_err(classify)?;
        Ok(Self { pool })
    }
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

#[async_trait]
impl Store for PostgresStore {
    #[tracing::instrument(skip(self))]
    async fn migrate(&self) -> Result<(), StoreError> {
        Ok(MIGRATOR.run(&self.pool).await?)
    }

    #[tracing::instrument(skip(self))]
    async fn check_schema(&self) -> Result<(), StoreError> {
        // to_regclass resolves through search_path, as the service's own queries do.
        let found = sqlx::query!(
            r#"SELECT
                EXISTS (SELECT 1 FROM pg_attribute
                        WHERE attrelid = to_regclass('plants') AND attname = 'id'
                          AND NOT attisdropped) AS "plants_id!",
                (to_regclass('plantstore_tokens') IS NOT NULL
                 AND to_regclass('plantstore_deletions') IS NOT NULL) AS "own_tables!""#
        )
        .fetch_one(&self.pool)
        .await
        .map_err(classify)?;
        schema_verdict(found.plants_id, found.own_tables)
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
        let mut tx = self.pool.begin().await.map_err(classify)?;
        // A concurrent delete of the same row waits on its lock, then sees 0 rows: one 204.
        let deleted = sqlx::query!("DELETE FROM plants WHERE id = $1", id)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        if deleted.rows_affected() == 0 {
            tx.rollback().await.map_err(classify)?;
            return Err(StoreError::NotFound);
        }
        sqlx::query!(
            "INSERT INTO plantstore_deletions (plant_id, token_name, request_id, deleted_at)
             VALUES ($1, $2, $3, $4)",
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
            "INSERT INTO plants (id, name, tag)
             SELECT n, 'Plant ' || n, 'demo' FROM generate_series(1::bigint, $1::bigint) AS n
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
             VALUES ($1, $2, $3, $4, $5, $6)",
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
            "SELECT name, lookup_id, secret_hash, created_at, expires_at, revoked_at
             FROM plantstore_tokens WHERE lookup_id = $1",
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
            "SELECT name, lookup_id, secret_hash, created_at, expires_at, revoked_at
             FROM plantstore_tokens ORDER BY created_at, name"
        )
        .fetch_all(&self.pool)
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
        sqlx::query_scalar!(r#"SELECT COUNT(*) AS "count!" FROM plantstore_tokens"#)
            .fetch_one(&self.pool)
            .await
            .map_err(classify)
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}
