//! Opens the database: the backend picked from the URL's scheme, the schema then checked.

use std::sync::Arc;

use anyhow::Context;
use plantstore_postgres::PostgresStore;
use plantstore_sqlite::SqliteStore;
use plantstore_store::{CommitObserver, Store, StoreError, StoreSettings};

use crate::config::{Backend, Config, DatabaseUrl};

/// Connects and checks the schema, migrated first if asked (an existing `plants` may have
/// an `id` the service cannot delete by); `commit_observer` gets batch sizes when serving.
pub async fn open(
    config: &Config,
    commit_observer: Option<Arc<dyn CommitObserver>>,
) -> anyhow::Result<Arc<dyn Store>> {
    let settings = StoreSettings {
        max_connections: config.db_max_connections,
        acquire_timeout: config.db_acquire_timeout,
        idempotency_ttl: config.serve.idempotency_ttl,
        commit_observer,
    };
    let store = connect(&config.database_url, settings)
        .await
        .with_context(|| format!("cannot open the database at {}", config.database_url))?;
    let unusable = if config.migrate {
        store.migrate().await.context("cannot apply migrations")?;
        "the database cannot be served"
    } else {
        "PLANTSTORE_MIGRATE=false and the schema is not ready"
    };
    store.check_schema().await.context(unusable)?;
    Ok(store)
}

/// Refuses a SQLite file that does not exist, saying where it looked: for commands that
/// need the service's database, SQLite would make an empty one wherever they were run.
pub fn existing(url: &DatabaseUrl) -> anyhow::Result<()> {
    if url.backend() == Ok(Backend::Sqlite)
        && let Some(file) = plantstore_sqlite::missing_file(url.expose())
    {
        anyhow::bail!(
            "no database at {}: run this where the service keeps its database, or name that file with DATABASE_URL (or --database-url), such as sqlite:///srv/plantstore/plantstore.db?mode=rwc; `plantstore migrate` makes a new one",
            file.display()
        );
    }
    Ok(())
}

async fn connect(url: &DatabaseUrl, settings: StoreSettings) -> Result<Arc<dyn Store>, StoreError> {
    let backend = url.backend().map_err(StoreError::Config)?;
    Ok(match backend {
        Backend::Sqlite => Arc::new(SqliteStore::connect(url.expose(), settings).await?),
        Backend::Postgres => Arc::new(PostgresStore::connect(url.expose(), settings).await?),
    })
}
