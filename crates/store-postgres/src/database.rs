//! The one door to the database: the pool and where its new connections go (failover).
//! Every query gets its connection with `Database::conn` and sorts its errors with
//! `Database::error`, and both tell failover about a database that stopped serving, so no
//! query can leave failover out. Errors are sorted by kind and SQLSTATE, never by text.

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

/// Every connection of the service carries it: deletion events are read up to the oldest
/// transaction of these sessions only (`webhooks::read_events`), since only they write the
/// log.
pub(crate) const APPLICATION_NAME: &str = "plantstore";

/// SQLSTATE classes and codes after which the same request may well succeed later:
/// connection exceptions, insufficient resources, operator intervention (shutdowns,
/// `cannot_connect_now`), the serialization failures a retry resolves, and a server that
/// will not take writes now (`read_only_sql_transaction`: in recovery, or read-only after a
/// failover). Whatever fails while a connection is being got or opened is unavailable too,
/// whatever its code (see `conn`).
const TRANSIENT_CLASSES: [&str; 3] = ["08", "53", "57P"];
const TRANSIENT_CODES: [&str; 3] = ["25006", "40001", "40P01"];
/// What the limits set from a request's deadline raise (`group_commit.rs`): lock_not_available
/// (`lock_timeout`) and query_canceled (`statement_timeout`, or a DBA's cancel).
const DEADLINE_CODES: [&str; 2] = ["55P03", "57014"];

#[derive(Clone)]
pub(crate) struct Database {
    /// For what takes a pool itself: the migrator, the listener, the pool's figures.
    pub(crate) pool: PgPool,
    failover: Arc<Failover>,
}

impl Database {
    /// With several hosts, the first in order that satisfies `target_session_attrs` is
    /// used.
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
            // Except for connections idle since the database last gave trouble: a restart
            // or a cut network leaves them dead, and each would cost a request a 503 after
            // the database is back. One ping finds out first; a dead one is dropped.
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

    /// A connection from the pool; failing to get one (refused, database gone, password
    /// rotated, too many clients, TLS refused, pool exhausted) means the database cannot
    /// serve now, whatever the code.
    pub(crate) async fn conn(&self) -> Result<PoolConnection<Postgres>, StoreError> {
        self.pool
            .acquire()
            .await
            .map_err(|err| self.report_to_failover(StoreError::Unavailable(Arc::new(err))))
    }

    /// A connection for statements whose caller may stop waiting mid-way (see
    /// `Interruptible`).
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

    /// How many hosts the URL names.
    pub(crate) fn hosts(&self) -> usize {
        self.failover.hosts()
    }

    /// Times new connections moved to another host since start.
    pub(crate) fn host_changes(&self) -> u64 {
        self.failover.host_changes()
    }

    /// `err`, after failover heard of it (it searches the hosts again when the database
    /// is unavailable, read-only or too slow).
    pub(crate) fn report_to_failover(&self, err: StoreError) -> StoreError {
        self.failover.notice(&err);
        err
    }
}

/// A connection whose statement may be dropped unfinished (a stopping service stops
/// waiting for a standby that does not answer): then closed, not handed back to the pool,
/// where its next user, and the pool's close at shutdown, would wait for that statement.
/// Handed back as usual once `finished`.
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

/// The batch statement takes arrays, for which the planner never trusts a generic plan,
/// so by default it is planned anew on every execution, which costs more than the delete
/// itself (bench/JOURNAL.md, "Figures moved out of code comments"). The service's statements
/// are point lookups by key, which a generic plan serves as well, and the log's prune, whose
/// batch size is written into it for that reason (`PRUNE_BATCH`). A server too old to
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
