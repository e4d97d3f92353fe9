//! Commits announced between processes: a `NOTIFY` after this process's commits that
//! deleted, and a `LISTEN` while anyone here waits for commit news. A store skips its own:
//! hearing them again cost a read of the log per burst (bench/JOURNAL.md, issue 41).

use std::{
    convert::Infallible,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use plantstore_store::{StoreError, backend::CommitNews};
use sqlx::postgres::{PgConnection, PgListener, PgPool};
use tokio::sync::mpsc;

use crate::database::Database;

const CHANNEL: &str = "plantstore_events";
/// The shortest time between two announcements: under load one stands for many commits.
const GAP: Duration = Duration::from_millis(50);
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// Random, not the process id: two instances in two containers may have the same one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AnnouncerId(pub(crate) Arc<str>);

/// The task ends with the announcer.
pub(crate) struct Announcer(mpsc::Sender<()>);

impl Announcer {
    pub(crate) fn start(db: Database, id: AnnouncerId) -> Self {
        // One announcement waiting at most: the commits of a gap go out as one.
        let (wanted, mut asked) = mpsc::channel(1);
        tokio::spawn(async move {
            while asked.recv().await.is_some() {
                if let Err(err) = notify(&db, &id).await {
                    tracing::warn!(error = %err, "cannot announce deletion events to the other instances");
                }
                tokio::time::sleep(GAP).await;
            }
        });
        Self(wanted)
    }

    /// After a commit that deleted; returns at once.
    pub(crate) fn announce(&self) {
        let _ = self.0.try_send(());
    }
}

/// Apart from the deletes' batch: a notifying commit holds a database-wide lock through its
/// WAL flush, which would serialize the commit workers. Nor does it wait for a flush: a
/// notification lost in a crash costs one poll.
async fn notify(db: &Database, id: &AnnouncerId) -> Result<(), StoreError> {
    sqlx::query!(
        "SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)",
        CHANNEL,
        &*id.0
    )
    .fetch_one(&mut *db.conn().await?)
    .await
    .map_err(|err| db.error(err))?;
    Ok(())
}

/// Within a transaction, as it commits: for rare commits where no delivery runs to be woken
/// in-process, such as a restore from the command line.
pub(crate) async fn announce_in(
    conn: &mut PgConnection,
    id: &AnnouncerId,
) -> Result<(), sqlx::Error> {
    sqlx::query!("SELECT pg_notify($1, $2)", CHANNEL, &*id.0)
        .execute(conn)
        .await?;
    Ok(())
}

#[derive(Debug)]
pub(crate) struct Listening {
    running: Arc<Mutex<bool>>,
    own: AnnouncerId,
}

impl Listening {
    pub(crate) fn new(own: AnnouncerId) -> Self {
        Self {
            running: Arc::default(),
            own,
        }
    }

    /// For as long as `news` has receivers: call it after subscribing.
    pub(crate) fn start_unless_running(&self, pool: &PgPool, news: &CommitNews) {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if !*running {
            *running = true;
            tokio::spawn(keep_listening(
                pool.clone(),
                news.clone(),
                Arc::clone(&self.running),
                self.own.clone(),
            ));
        }
    }
}

/// Listens until no one hears, or the pool closes; listens again after a lost connection.
async fn keep_listening(
    pool: PgPool,
    news: CommitNews,
    running: Arc<Mutex<bool>>,
    own: AnnouncerId,
) {
    let stop = || *running.lock().unwrap_or_else(PoisonError::into_inner) = false;
    loop {
        tokio::select! {
            () = news.unheard() => {
                let mut running = running.lock().unwrap_or_else(PoisonError::into_inner);
                // Someone may have subscribed since `unheard` resolved, before this lock.
                if !news.has_receivers() {
                    *running = false;
                    return;
                }
            }
            result = listen(&pool, &news, &own) => {
                let Err(err) = result;
                if pool.is_closed() {
                    stop();
                    return;
                }
                tracing::warn!(error = %err, "cannot listen for deletion events; polling meanwhile");
                tokio::time::sleep(RECONNECT_AFTER).await;
            }
        }
    }
}

/// Returns only with the error that ended listening.
async fn listen(
    pool: &PgPool,
    news: &CommitNews,
    own: &AnnouncerId,
) -> Result<Infallible, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    loop {
        // Anew, or after a lost connection: what was announced meanwhile went unheard.
        news.bump();
        while let Some(notification) = listener.try_recv().await? {
            if notification.payload() != &*own.0 {
                news.bump();
            }
        }
    }
}
