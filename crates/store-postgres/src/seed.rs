//! Demo plants for a new database.

use plantstore_store::StoreError;

use crate::database::Database;

#[tracing::instrument(skip(db))]
pub(crate) async fn seed(db: &Database, count: i64) -> Result<u64, StoreError> {
    let done = sqlx::query!(
        "INSERT INTO plants (id, name, tag)
             SELECT n, 'Plant ' || n, 'demo' FROM generate_series(1::bigint, $1::bigint) AS n
             ON CONFLICT (id) DO NOTHING",
        count
    )
    .execute(&mut *db.conn().await?)
    .await
    .map_err(|err| db.error(err))?;
    Ok(done.rows_affected())
}
