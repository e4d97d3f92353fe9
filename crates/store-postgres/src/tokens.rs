//! API tokens as stored: hashes and dates, never a secret.

use chrono::{DateTime, Utc};
use plantstore_store::{StoreError, TokenRecord, found};
use sqlx::postgres::PgPool;

use crate::{connection::connection, errors::classify};

#[tracing::instrument(skip(pool, token), fields(name = %token.name))]
pub(crate) async fn insert(pool: &PgPool, token: &TokenRecord) -> Result<(), StoreError> {
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
        .execute(&mut *connection(pool).await?)
        .await
        .map_err(classify)?;
    Ok(())
}

#[tracing::instrument(level = "debug", skip(pool))]
pub(crate) async fn list(pool: &PgPool) -> Result<Vec<TokenRecord>, StoreError> {
    sqlx::query_as!(
        TokenRecord,
        "SELECT name, lookup_id, secret_hash, created_at, expires_at, revoked_at
             FROM plantstore_tokens ORDER BY created_at, name"
    )
    .fetch_all(&mut *connection(pool).await?)
    .await
    .map_err(classify)
}

#[tracing::instrument(skip(pool))]
pub(crate) async fn revoke(pool: &PgPool, name: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
    let done = sqlx::query!(
        "UPDATE plantstore_tokens SET revoked_at = COALESCE(revoked_at, $1) WHERE name = $2",
        at,
        name
    )
    .execute(&mut *connection(pool).await?)
    .await
    .map_err(classify)?;
    found(done.rows_affected())
}

#[tracing::instrument(skip(pool))]
pub(crate) async fn count(pool: &PgPool) -> Result<i64, StoreError> {
    sqlx::query_scalar!(r#"SELECT COUNT(*) AS "count!" FROM plantstore_tokens"#)
        .fetch_one(&mut *connection(pool).await?)
        .await
        .map_err(classify)
}
