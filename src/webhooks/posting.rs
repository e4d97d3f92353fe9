//! The thread events are posted from: a runtime of its own at the lowest CPU priority, so
//! that delivery runs on the CPU that serving requests leaves, and requests keep theirs.

use std::{sync::Arc, time::Duration};

use chrono::Utc;
use futures_util::{StreamExt, future::BoxFuture, stream::FuturesUnordered};
use plantstore_store::Event;
use tokio::{
    runtime::Handle,
    sync::{mpsc, oneshot},
    time::sleep,
};

use super::{
    ahead::Turn,
    attempt::{Attempt, Sender, Target},
    client::{Connection, Idle},
};

/// One event's attempt, as it came back.
pub(super) struct Tried {
    pub(super) event: Event,
    pub(super) failures: u32,
    pub(super) attempt: Attempt,
    pub(super) lag: Duration,
}

/// Where endpoints' posts run; the thread ends when this is dropped.
pub(super) struct Posting {
    runtime: Handle,
    sender: Sender,
    _stop: Option<oneshot::Sender<()>>,
}

impl Posting {
    /// Starts the posting thread, whose posts give up after `timeout`; when the system
    /// gives no thread, posts run on the caller's runtime, as requests do.
    pub(super) fn start(timeout: Duration) -> Self {
        let sender = Sender::new(timeout);
        match Self::thread() {
            Ok((runtime, stop)) => Self {
                runtime,
                sender,
                _stop: Some(stop),
            },
            Err(err) => {
                tracing::warn!(error = %err, "cannot start the webhook posting thread; posting beside requests");
                Self {
                    runtime: Handle::current(),
                    sender,
                    _stop: None,
                }
            }
        }
    }

    /// The thread's runtime, and what ends the thread when sent or dropped.
    fn thread() -> std::io::Result<(Handle, oneshot::Sender<()>)> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("webhook-posts".into())
            .spawn(move || {
                lower_priority();
                // Ends when `stop` is sent or dropped; the lanes still running end with it.
                let _ = runtime.block_on(stopped);
            })?;
        Ok((handle, stop))
    }

    /// A lane for one endpoint's posts: turns in, what each came to out. The lane ends
    /// when the returned `Lane` is dropped.
    pub(super) fn open(&self, target: Arc<Target>, in_flight: usize) -> Lane {
        let (turns, turns_in) = mpsc::unbounded_channel();
        let (tried_out, tried) = mpsc::unbounded_channel();
        let sender = self.sender.clone();
        self.runtime
            .spawn(post_turns(sender, target, in_flight, turns_in, tried_out));
        Lane { turns, tried }
    }
}

/// One endpoint's way to its posting thread.
pub(super) struct Lane {
    turns: mpsc::UnboundedSender<Turn>,
    tried: mpsc::UnboundedReceiver<Tried>,
}

impl Lane {
    /// Whether the lane still takes turns (its thread may have ended).
    pub(super) fn post(&self, turn: Turn) -> bool {
        self.turns.send(turn).is_ok()
    }

    /// The next attempt done; `None` when the lane ended.
    pub(super) async fn next(&mut self) -> Option<Tried> {
        self.tried.recv().await
    }
}

/// Posts each turn as it comes, `in_flight` at most at once (the endpoint sends no more),
/// over connections kept between posts.
async fn post_turns(
    sender: Sender,
    target: Arc<Target>,
    in_flight: usize,
    mut turns: mpsc::UnboundedReceiver<Turn>,
    tried: mpsc::UnboundedSender<Tried>,
) {
    let mut posts: FuturesUnordered<BoxFuture<'static, (Tried, Option<Connection>)>> =
        FuturesUnordered::new();
    let mut idle = Idle::keeping(in_flight);
    loop {
        tokio::select! {
            turn = turns.recv() => {
                let Some(turn) = turn else {
                    return;
                };
                // A retry waits first; it takes a connection when it goes.
                let connection = if turn.2.is_zero() { idle.take() } else { None };
                posts.push(Box::pin(attempt(sender.clone(), Arc::clone(&target), connection, turn)));
            }
            Some((done, connection)) = posts.next() => {
                if let Some(connection) = connection {
                    idle.put(connection);
                }
                if tried.send(done).is_err() {
                    return;
                }
            }
        }
    }
}

/// One attempt, after the turn's wait.
async fn attempt(
    sender: Sender,
    target: Arc<Target>,
    connection: Option<Connection>,
    (event, failures, wait): Turn,
) -> (Tried, Option<Connection>) {
    if !wait.is_zero() {
        sleep(wait).await;
    }
    let (attempt, connection) = sender.post(&target, connection, &event).await;
    let lag = (Utc::now() - event.happened_at())
        .to_std()
        .unwrap_or_default();
    let tried = Tried {
        event,
        failures,
        attempt,
        lag,
    };
    (tried, connection)
}

/// Linux keeps a nice value per thread; elsewhere the thread keeps the process's.
fn lower_priority() {
    /// The lowest: any request's work comes first.
    #[cfg(target_os = "linux")]
    const NICENESS: i32 = 19;
    #[cfg(target_os = "linux")]
    if let Err(err) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), NICENESS)
    {
        tracing::warn!(error = %err, "cannot lower the webhook posting thread's priority");
    }
}
