//! Demo plants for a new database.

use plantstore_store::StoreError;

use crate::{errors::classify, writer::WriteConnection};

#[tracing::instrument(skip(writer))]
pub(crate) async fn seed(writer: &WriteConnection, count: i64) -> Result<u64, StoreError> {
    let done = sqlx::query!(
        "WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < ?)
             INSERT INTO plants (id, name, tag)
             SELECT n, 'Plant ' || n, 'demo' FROM seq WHERE true
             ON CONFLICT (id) DO NOTHING",
        count
    )
    .execute(writer.lock().await?.conn()?)
    .await
    .map_err(classify)?;
    Ok(done.rows_affected())
}
