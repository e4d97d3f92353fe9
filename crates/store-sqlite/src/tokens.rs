//! API tokens as stored: hashes and dates, never a secret.

use chrono::{DateTime, Utc};
use plantstore_store::{StoreError, TokenRecord, found};
use sqlx::SqlitePool;

use crate::{errors::classify, writer::WriteConnection};

#[tracing::instrument(skip(writer, token), fields(name = %token.name))]
pub(crate) async fn insert(
    writer: &WriteConnection,
    token: &TokenRecord,
) -> Result<(), StoreError> {
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
        .execute(writer.lock().await?.conn()?)
        .await
        .map_err(classify)?;
    Ok(())
}

#[tracing::instrument(level = "debug", skip(readers))]
pub(crate) async fn list(readers: &SqlitePool) -> Result<Vec<TokenRecord>, StoreError> {
    sqlx::query_as!(
        TokenRecord,
        r#"SELECT name AS "name!", lookup_id AS "lookup_id!", secret_hash AS "secret_hash!",
                      created_at AS "created_at!: DateTime<Utc>",
                      expires_at AS "expires_at?: DateTime<Utc>",
                      revoked_at AS "revoked_at?: DateTime<Utc>"
               FROM plantstore_tokens ORDER BY created_at, name"#
    )
    .fetch_all(readers)
    .await
    .map_err(classify)
}

#[tracing::instrument(skip(writer))]
pub(crate) async fn revoke(
    writer: &WriteConnection,
    name: &str,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    let done = sqlx::query!(
        "UPDATE plantstore_tokens SET revoked_at = COALESCE(revoked_at, ?) WHERE name = ?",
        at,
        name
    )
    .execute(writer.lock().await?.conn()?)
    .await
    .map_err(classify)?;
    found(done.rows_affected())
}

#[tracing::instrument(skip(readers))]
pub(crate) async fn count(readers: &SqlitePool) -> Result<i64, StoreError> {
    sqlx::query_scalar!(r#"SELECT COUNT(*) AS "count!: i64" FROM plantstore_tokens"#)
        .fetch_one(readers)
        .await
        .map_err(classify)
}
