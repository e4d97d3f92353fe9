//! Picks the database backend once, from the scheme of `DATABASE_URL`.

use std::sync::Arc;

use plantstore_postgres::PostgresStore;
use plantstore_sqlite::SqliteStore;
use plantstore_store::{Store, StoreError, StoreSettings};

use crate::config::{Backend, DatabaseUrl};

pub async fn connect(
    url: &DatabaseUrl,
    settings: StoreSettings,
) -> Result<Arc<dyn Store>, StoreError> {
    let backend = url.backend().map_err(StoreError::Config)?;
    Ok(match backend {
        Backend::Sqlite => Arc::new(SqliteStore::connect(url.expose(), settings).await?),
        Backend::Postgres => Arc::new(PostgresStore::connect(url.expose(), settings).await?),
    })
}
