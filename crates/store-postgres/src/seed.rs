//! Demo plants for a new database.

use plantstore_store::StoreError;
use sqlx::postgres::PgPool;

use crate::{connection::connection, errors::classify};

#[tracing::instrument(skip(pool))]
pub(crate) async fn seed(pool: &PgPool, count: i64) -> Result<u64, StoreError> {
    let done = sqlx::query!(
        "INSERT INTO plants (id, name, tag)
             SELECT n, 'Plant ' || n, 'demo' FROM generate_series(1::bigint, $1::bigint) AS n
             ON CONFLICT (id) DO NOTHING",
        count
    )
    .execute(&mut *connection(pool).await?)
    .await
    .map_err(classify)?;
    Ok(done.rows_affected())
}
