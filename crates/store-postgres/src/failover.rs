//! Which of several hosts new connections go to, moved without a restart when it fails or
//! stops taking writes (docs/existing-database.md). Every new connection is checked again
//! (`fits`), so none lands on a demoted server.

use std::{
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use plantstore_store::StoreError;
use sqlx::{
    ConnectOptions, Connection, PgConnection,
    postgres::{PgConnectOptions, PgPool},
};

use crate::hosts::{HostList, SessionAttrs};

/// The least time between two searches, so a burst of failed requests searches once.
const SEARCH_PAUSE: Duration = Duration::from_millis(200);

pub(crate) struct Failover {
    list: HostList,
    /// For one host to accept a connection and answer the check.
    probe_wait: Duration,
    /// The pool whose new connections this steers; set once it exists.
    pool: OnceLock<PgPool>,
    /// Index in `list` of the host new connections go to.
    current: AtomicUsize,
    searching: AtomicBool,
    changes: AtomicU64,
    /// When a request last found the database unavailable, read-only or too slow.
    last_trouble: Mutex<Option<Instant>>,
}

impl Failover {
    pub(crate) fn new(list: HostList, probe_wait: Duration) -> Self {
        Self {
            list,
            probe_wait,
            pool: OnceLock::new(),
            current: AtomicUsize::new(0),
            searching: AtomicBool::new(false),
            changes: AtomicU64::new(0),
            last_trouble: Mutex::new(None),
        }
    }

    pub(crate) fn hosts(&self) -> usize {
        self.list.hosts.len()
    }

    pub(crate) fn host_changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// The first host, in order, that accepts a connection and fits; else each host's reason.
    pub(crate) async fn find(&self) -> Result<(usize, PgConnectOptions), StoreError> {
        let mut failures = Vec::new();
        for (index, host) in self.list.hosts.iter().enumerate() {
            match self.try_host(&host.options).await {
                Ok(()) => return Ok((index, host.options.clone())),
                Err(err) => {
                    tracing::debug!(host = %host.name, error = %err, "host not usable now");
                    failures.push((host.name.as_str(), err));
                }
            }
        }
        let cause = match failures.len() {
            0 | 1 => failures
                .pop()
                .map_or(sqlx::Error::PoolTimedOut, |(_, err)| err),
            _ => sqlx::Error::Io(std::io::Error::other(format!(
                "no host of the list can be used now: {}",
                failures
                    .iter()
                    .map(|(name, err)| format!("{name}: {err}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            ))),
        };
        Err(StoreError::Unavailable(Arc::new(cause)))
    }

    async fn try_host(&self, options: &PgConnectOptions) -> Result<(), sqlx::Error> {
        let attempt = async {
            let mut conn = options.connect().await?;
            let fits = fits(&mut conn, self.list.attrs).await;
            let _closed = conn.close().await;
            fits
        };
        tokio::time::timeout(self.probe_wait, attempt)
            .await
            .unwrap_or(Err(sqlx::Error::PoolTimedOut))
    }

    /// From now on steers `pool`, whose connections go to host `index`.
    pub(crate) fn steer(&self, pool: PgPool, index: usize) {
        self.current.store(index, Ordering::Relaxed);
        let _ = self.pool.set(pool);
    }

    /// Searches the hosts again in the background when `err` says the database is
    /// unavailable, takes no writes, or did not answer in time (a host gone without a reset
    /// shows only so). Every caller's failure counts, not only a delete's: a request may
    /// meet the database first in the token reload, and fail there while nothing moves. One
    /// host alone is not searched, but its idle connections are checked (`troubled_within`).
    pub(crate) fn notice(self: &Arc<Self>, err: &StoreError) {
        let suspect = matches!(
            err,
            StoreError::Unavailable(_) | StoreError::ReadOnly | StoreError::TimedOut
        );
        if !suspect {
            return;
        }
        if let Ok(mut last) = self.last_trouble.lock() {
            *last = Some(Instant::now());
        }
        if self.list.hosts.len() < 2 || self.searching.swap(true, Ordering::AcqRel) {
            return;
        }
        let failover = Arc::clone(self);
        tokio::spawn(async move {
            if let (Ok((index, options)), Some(pool)) = (failover.find().await, failover.pool.get())
            {
                let before = failover.current.swap(index, Ordering::AcqRel);
                if before != index {
                    failover.changes.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        from = %failover.list.hosts[before].name,
                        to = %failover.list.hosts[index].name,
                        "the database moved: new connections go to another host"
                    );
                }
                pool.set_connect_options(options);
            }
            tokio::time::sleep(SEARCH_PAUSE).await;
            failover.searching.store(false, Ordering::Release);
        });
    }

    /// A connection idle that long may have been cut meanwhile (a restart, a network gone).
    pub(crate) fn troubled_within(&self, idle_for: Duration) -> bool {
        self.last_trouble
            .lock()
            .ok()
            .and_then(|last| *last)
            .is_some_and(|at| at.elapsed() < idle_for)
    }
}

/// An error (the pool drops the connection for it) when the server does not satisfy `attrs`.
pub(crate) async fn fits(conn: &mut PgConnection, attrs: SessionAttrs) -> Result<(), sqlx::Error> {
    let fits = match attrs {
        SessionAttrs::Any => return Ok(()),
        SessionAttrs::ReadWrite => {
            sqlx::query_scalar!(
                r#"SELECT current_setting('transaction_read_only') = 'off' AS "fits!""#
            )
            .fetch_one(&mut *conn)
            .await?
        }
        SessionAttrs::Primary => {
            sqlx::query_scalar!(r#"SELECT NOT pg_is_in_recovery() AS "fits!""#)
                .fetch_one(&mut *conn)
                .await?
        }
    };
    if fits {
        Ok(())
    } else {
        Err(sqlx::Error::Configuration(
            format!("the server does not satisfy target_session_attrs ({attrs:?})").into(),
        ))
    }
}
