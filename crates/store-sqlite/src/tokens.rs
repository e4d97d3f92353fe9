//! API tokens as stored: hashes and dates, never a secret.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use plantstore_store::{StoreError, TokenRecord, Tokens, backend::not_found_if_none};

use crate::{SqliteStore, errors::classify};

#[async_trait]
impl Tokens for SqliteStore {
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
        .execute(self.write_connection.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        sqlx::query_as!(
            TokenRecord,
            r#"SELECT name AS "name!", lookup_id AS "lookup_id!", secret_hash AS "secret_hash!",
                      created_at AS "created_at!: DateTime<Utc>",
                      expires_at AS "expires_at?: DateTime<Utc>",
                      revoked_at AS "revoked_at?: DateTime<Utc>"
               FROM plantstore_tokens ORDER BY created_at, name"#
        )
        .fetch_all(&self.readers)
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
        .execute(self.write_connection.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        not_found_if_none(done.rows_affected())
    }

    #[tracing::instrument(skip(self))]
    async fn count_tokens(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar!(r#"SELECT COUNT(*) AS "count!: i64" FROM plantstore_tokens"#)
            .fetch_one(&self.readers)
            .await
            .map_err(classify)
    }
}
