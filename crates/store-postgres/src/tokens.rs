//! API tokens as stored: hashes and dates, never a secret.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use plantstore_store::{StoreError, TokenRecord, Tokens, backend::not_found_if_none};

use crate::PostgresStore;

#[async_trait]
impl Tokens for PostgresStore {
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
        .execute(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        sqlx::query_as!(
            TokenRecord,
            "SELECT name, lookup_id, secret_hash, created_at, expires_at, revoked_at
             FROM plantstore_tokens ORDER BY created_at, name"
        )
        .fetch_all(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))
    }

    #[tracing::instrument(skip(self))]
    async fn revoke_token(&self, name: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
        let done = sqlx::query!(
            "UPDATE plantstore_tokens SET revoked_at = COALESCE(revoked_at, $1) WHERE name = $2",
            at,
            name
        )
        .execute(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))?;
        not_found_if_none(done.rows_affected())
    }

    #[tracing::instrument(skip(self))]
    async fn count_tokens(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar!(r#"SELECT COUNT(*) AS "count!" FROM plantstore_tokens"#)
            .fetch_one(&mut *self.db.conn().await?)
            .await
            .map_err(|err| self.db.error(err))
    }
}
