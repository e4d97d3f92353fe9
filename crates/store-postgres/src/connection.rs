//! Connecting: the URL's options, the pool and its tuning, and getting a connection.

use std::sync::Arc;

use plantstore_store::{StoreError, StoreSettings};
use sqlx::{
    Postgres,
    pool::PoolConnection,
    postgres::{PgPool, PgPoolOptions},
};

use crate::{
    errors::{classify, unavailable},
    failover::{Failover, fits},
    hosts::HostList,
};

/// Every connection of the service carries it: deletion events are read up to the oldest
/// transaction of these sessions only (`webhooks::read`), since only they write the log.
pub(crate) const APPLICATION_NAME: &str = "plantstore";

/// Opens the pool and one connection, so a wrong host or password fails at start. With
/// several hosts, the first in order that satisfies `target_session_attrs` is used.
pub(crate) async fn open_pool(
    url: &str,
    settings: StoreSettings,
) -> Result<(PgPool, Arc<Failover>), StoreError> {
    let list = HostList::parse(url).map_err(|err| {
        StoreError::Config(format!(
            "DATABASE_URL is not a usable PostgreSQL URL: {err}"
        ))
    })?;
    // Lock and statement limits come from each request's deadline (`limits`).
    let failover = Arc::new(Failover::new(list, settings.acquire_timeout, |options| {
        options.application_name(APPLICATION_NAME)
    }));
    let (index, options) = failover.find().await?;
    let attrs = failover.attrs();
    let pool = PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.acquire_timeout)
        // A dead connection fails its statement and is dropped; a ping before every
        // use would add a round trip to each request to find that out sooner.
        .test_before_acquire(false)
        .after_connect(move |conn, _meta| {
            Box::pin(async move {
                // A server demoted since the host was chosen is not used.
                fits(conn, attrs).await?;
                prefer_generic_plans(conn).await
            })
        })
        .connect_with(options)
        .await
        .map_err(classify)?;
    failover.steer(pool.clone(), index);
    Ok((pool, failover))
}

/// A connection from the pool; failing to get one means the database is unavailable.
pub(crate) async fn connection(pool: &PgPool) -> Result<PoolConnection<Postgres>, StoreError> {
    pool.acquire().await.map_err(unavailable)
}

/// The batch statement takes arrays, for which the planner never trusts a generic plan,
/// so by default it is planned anew on every execution: 0.1-0.25 ms of a delete that
/// otherwise takes 0.05 ms (`EXPLAIN ANALYZE`, PostgreSQL 15). The service's statements
/// are all point lookups by key, which a generic plan serves as well. A server too old to
/// know the setting (before 12) keeps planning each time; nothing else changes.
async fn prefer_generic_plans(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    use sqlx::Executor;
    if let Err(err) = conn
        .execute("SET plan_cache_mode = force_generic_plan")
        .await
    {
        tracing::debug!(error = %err, "this server plans every statement anew");
    }
    Ok(())
}
