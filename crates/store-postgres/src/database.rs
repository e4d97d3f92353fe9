//! The one door to the database: every query gets its connection with `Database::conn` and
//! sorts its errors with `Database::error`, and both tell failover of a database that stopped
//! serving, so no query can leave failover out. Errors are sorted by SQLSTATE, never by text.

use std::{future::Future, sync::Arc};

use plantstore_group_commit::wait_until;
use plantstore_store::{StoreError, StoreSettings};
use sqlx::{
    Connection, Postgres,
    pool::PoolConnection,
    postgres::{PgPool, PgPoolOptions},
};
use tokio::time::Instant;

use crate::{
    failover::{Failover, fits},
    hosts::HostList,
};

/// Events are read up to the oldest transaction of these sessions only (`read_events`),
/// since only they write the log.
pub(crate) const APPLICATION_NAME: &str = "plantstore";

/// After which the same request may well succeed later: connection exceptions, insufficient
/// resources, operator intervention (shutdowns), serialization failures and deadlocks, and
/// `read_only_sql_transaction` (in recovery, or after a failover).
const TRANSIENT_CLASSES: [&str; 3] = ["08", "53", "57P"];
const TRANSIENT_CODES: [&str; 3] = ["25006", "40001", "40P01"];
/// lock_not_available (`lock_timeout`) and query_canceled (`statement_timeout`, or a DBA's
/// cancel), raised by the limits set from a request's deadline.
const DEADLINE_CODES: [&str; 2] = ["55P03", "57014"];

#[derive(Clone)]
pub(crate) struct Database {
    /// Only for what takes a pool itself: the migrator, the listener, the pool's figures.
    pub(crate) pool: PgPool,
    failover: Arc<Failover>,
}

impl Database {
    /// With several hosts, the first in order that satisfies `target_session_attrs`.
    pub(crate) async fn open(url: &str, settings: &StoreSettings) -> Result<Self, StoreError> {
        let mut list = HostList::parse(url).map_err(|err| {
            StoreError::Config(format!(
                "DATABASE_URL is not a usable PostgreSQL URL: {err}"
            ))
        })?;
        // Lock and statement limits come from each request's deadline (`group_commit.rs`).
        for host in &mut list.hosts {
            host.options = host.options.clone().application_name(APPLICATION_NAME);
        }
        let attrs = list.attrs;
        let failover = Arc::new(Failover::new(list, settings.acquire_timeout));
        let (index, options) = failover.find().await?;
        let troubles = Arc::clone(&failover);
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout)
            // A dead connection fails its statement and is dropped; a ping before every
            // use would add a round trip to each request to find that out sooner.
            .test_before_acquire(false)
            // Except those idle since the database last gave trouble: a restart or a cut
            // network leaves them dead, each a 503 once it is back. One ping finds out first.
            .before_acquire(move |conn, meta| {
                let suspect = troubles.troubled_within(meta.idle_for);
                Box::pin(async move { Ok(!suspect || conn.ping().await.is_ok()) })
            })
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
        Ok(Self { pool, failover })
    }

    /// Failing to get one (refused, database gone, password rotated, too many clients, TLS
    /// refused, pool exhausted) means the database cannot serve now, whatever the code.
    pub(crate) async fn conn(&self) -> Result<PoolConnection<Postgres>, StoreError> {
        self.pool
            .acquire()
            .await
            .map_err(|err| self.report_to_failover(StoreError::Unavailable(Arc::new(err))))
    }

    pub(crate) async fn interruptible_conn(&self) -> Result<Interruptible, StoreError> {
        Ok(Interruptible {
            conn: self.conn().await?,
            finished: false,
        })
    }

    pub(crate) fn error(&self, err: sqlx::Error) -> StoreError {
        self.report_to_failover(classify(err))
    }

    /// Waits for `work`, but no later than `deadline`: a server that stopped answering
    /// (a host gone without a reset, a network cut) shows only as this running out.
    pub(crate) async fn within<T>(
        &self,
        deadline: Instant,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        wait_until(deadline, work)
            .await
            .map_err(|err| self.report_to_failover(err))
    }

    pub(crate) fn hosts(&self) -> usize {
        self.failover.hosts()
    }

    pub(crate) fn host_changes(&self) -> u64 {
        self.failover.host_changes()
    }

    pub(crate) fn report_to_failover(&self, err: StoreError) -> StoreError {
        self.failover.notice(&err);
        err
    }
}

/// A connection whose statement may be dropped unfinished (a stopping service stops waiting
/// for a standby that does not answer): closed then, not handed back to the pool, where its
/// next user and the pool's close would wait for that statement. Handed back once `finished`.
pub(crate) struct Interruptible {
    conn: PoolConnection<Postgres>,
    finished: bool,
}

impl Interruptible {
    pub(crate) fn conn(&mut self) -> &mut sqlx::PgConnection {
        &mut self.conn
    }

    pub(crate) fn finished(mut self) {
        self.finished = true;
    }
}

impl Drop for Interruptible {
    fn drop(&mut self) {
        if !self.finished {
            self.conn.close_on_drop();
        }
    }
}

fn classify(err: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(db) = &err
        && db
            .code()
            .is_some_and(|code| DEADLINE_CODES.contains(&code.as_ref()))
    {
        return StoreError::TimedOut;
    }
    StoreError::classify(err, |db| {
        db.code().is_some_and(|code| {
            TRANSIENT_CODES.contains(&code.as_ref())
                || TRANSIENT_CLASSES
                    .iter()
                    .any(|class| code.starts_with(class))
        })
    })
}

/// The planner never trusts a generic plan for the batch statement's arrays, and planning it
/// anew each time costs more than the delete (bench/JOURNAL.md, "Figures moved out of code
/// comments"). The other statements are point lookups, which a generic plan serves as well,
/// and the prune (see `PRUNE_BATCH`). A server before 12 plans each time; nothing else changes.
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
