//! Deletion events announced between processes: a `NOTIFY` after commits, and one
//! `LISTEN` connection per instance while it delivers to an endpoint.

use std::{
    convert::Infallible,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use async_trait::async_trait;
use plantstore_store::{Announcements, StoreError};
use sqlx::postgres::{PgConnection, PgListener, PgPool};
use tokio::sync::watch;

use crate::errors::classify;

/// The channel every announcement goes on.
const CHANNEL: &str = "plantstore_events";
/// The wait before listening again after the connection could not be had.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

type Heard = Arc<watch::Sender<u64>>;

pub(crate) struct PgAnnouncements {
    pool: PgPool,
    /// The listening task's channel while it runs: it ends, and gives its connection back,
    /// when the last receiver is dropped.
    heard: Arc<Mutex<Option<Heard>>>,
}

impl PgAnnouncements {
    pub(crate) fn new(pool: PgPool) -> Self {
        Self {
            pool,
            heard: Arc::default(),
        }
    }
}

#[async_trait]
impl Announcements for PgAnnouncements {
    #[tracing::instrument(skip_all)]
    async fn announce(&self) -> Result<(), StoreError> {
        // Its own transaction, apart from the deletes' batch: a notifying commit holds a
        // database-wide lock through its WAL flush, which would serialize the batch lanes.
        // Nor does it wait for a flush (`set_config` local to this statement's
        // transaction): a notification lost in a crash costs one poll.
        sqlx::query!(
            "SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, '')",
            CHANNEL
        )
        .fetch_one(&self.pool)
        .await
        .map_err(classify)?;
        Ok(())
    }

    fn listen(&self) -> watch::Receiver<u64> {
        let mut slot = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(heard) = slot.as_ref() {
            return heard.subscribe();
        }
        let heard: Heard = Arc::new(watch::Sender::new(0));
        let receiver = heard.subscribe();
        *slot = Some(Arc::clone(&heard));
        tokio::spawn(keep_listening(
            self.pool.clone(),
            heard,
            Arc::clone(&self.heard),
        ));
        receiver
    }
}

/// Announces within a transaction, as it commits: for rare commits made where no delivery
/// runs to be woken in-process, such as a restore from the command line.
pub(crate) async fn announce_in(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query!("SELECT pg_notify($1, '')", CHANNEL)
        .execute(conn)
        .await?;
    Ok(())
}

/// Listens until no one hears, or the pool closes; listens again after a lost connection.
async fn keep_listening(pool: PgPool, heard: Heard, slot: Arc<Mutex<Option<Heard>>>) {
    loop {
        tokio::select! {
            () = heard.closed() => {
                let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
                // `listen` may have subscribed since `closed` resolved, under this lock.
                if heard.receiver_count() == 0 {
                    *slot = None;
                    return;
                }
            }
            result = listen(&pool, &heard) => {
                let Err(err) = result;
                if pool.is_closed() {
                    *slot.lock().unwrap_or_else(PoisonError::into_inner) = None;
                    return;
                }
                tracing::warn!(error = %err, "cannot listen for deletion events; polling meanwhile");
                tokio::time::sleep(RECONNECT_AFTER).await;
            }
        }
    }
}

/// Rings `heard` at every notification; returns only with the error that ended listening.
async fn listen(pool: &PgPool, heard: &watch::Sender<u64>) -> Result<Infallible, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    loop {
        // Listening anew, or again after a lost connection: whatever was announced in
        // between went unheard, so every reader reads once.
        heard.send_modify(ring);
        while listener.try_recv().await?.is_some() {
            heard.send_modify(ring);
        }
    }
}

fn ring(count: &mut u64) {
    *count = count.wrapping_add(1);
}
