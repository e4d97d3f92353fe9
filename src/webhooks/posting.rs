//! The thread events are posted from: a runtime of its own at the lowest CPU priority, so
//! that delivery runs on the CPU that serving requests leaves, and requests keep theirs.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use chrono::Utc;
use futures_util::{FutureExt, StreamExt, future::BoxFuture, stream::FuturesUnordered};
use plantstore_store::Event;
use tokio::{
    runtime::Handle,
    sync::{mpsc, oneshot},
    time::sleep,
};

use super::{
    ahead::Turn,
    attempt::{Attempt, Target},
    client::{Connections, Connector, NoAnswer},
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
    connector: Connector,
    timeout: Duration,
    _stop: Option<oneshot::Sender<()>>,
}

impl Posting {
    /// Starts the posting thread, whose posts give up after `timeout`; when the system
    /// gives no thread, posts run on the caller's runtime, as requests do.
    pub(super) fn start(timeout: Duration) -> Self {
        let connector = Connector::new();
        match Self::thread() {
            Ok((runtime, stop)) => Self {
                runtime,
                connector,
                timeout,
                _stop: Some(stop),
            },
            Err(err) => {
                tracing::warn!(error = %err, "cannot start the webhook posting thread; posting beside requests");
                Self {
                    runtime: Handle::current(),
                    connector,
                    timeout,
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
    pub(super) fn open(&self, target: Arc<Target>) -> Lane {
        let (turns, turns_in) = mpsc::unbounded_channel();
        let (tried_out, tried) = mpsc::unbounded_channel();
        let connections = target.address().map(|address| {
            Connections::new(self.connector.clone(), Arc::clone(address), self.timeout)
        });
        self.runtime
            .spawn(post_turns(connections, target, turns_in, tried_out));
        Lane {
            turns: Some(turns),
            tried,
        }
    }
}

/// One endpoint's way to its posting thread.
pub(super) struct Lane {
    /// `None` once closed.
    turns: Option<mpsc::UnboundedSender<Turn>>,
    tried: mpsc::UnboundedReceiver<Tried>,
}

impl Lane {
    /// Whether the lane still takes turns (its thread may have ended).
    pub(super) fn post(&self, turn: Turn) -> bool {
        self.turns
            .as_ref()
            .is_some_and(|turns| turns.send(turn).is_ok())
    }

    /// Takes no more turns: retries still waiting are dropped, and the outcomes of
    /// requests already sent still come back; then `next` gives `None`.
    pub(super) fn close(&mut self) {
        self.turns = None;
    }

    /// The next attempt done; `None` when the lane ended.
    pub(super) async fn next(&mut self) -> Option<Tried> {
        self.tried.recv().await
    }

    /// An attempt done, if one is back already.
    pub(super) fn try_next(&mut self) -> Option<Tried> {
        self.tried.try_recv().ok()
    }
}

/// What became of a turn the lane holds.
enum Step {
    /// Its wait is over: it goes now.
    Due(Turn),
    /// Its request's connection ended before the answer; it goes once more at once.
    Unanswered(Turn, Bytes),
    Done(Turn, Attempt),
}

/// Posts each turn as it comes (the endpoint sends no more than it allows in flight),
/// over connections kept between posts; `None` when the endpoint's URL cannot be used.
async fn post_turns(
    mut connections: Option<Connections>,
    target: Arc<Target>,
    mut turns: mpsc::UnboundedReceiver<Turn>,
    tried: mpsc::UnboundedSender<Tried>,
) {
    // Retries waiting for their time, and requests sent awaiting what comes of them.
    let mut waiting: FuturesUnordered<BoxFuture<'static, Step>> = FuturesUnordered::new();
    let mut sending: FuturesUnordered<BoxFuture<'static, Step>> = FuturesUnordered::new();
    let mut open = true;
    loop {
        let step = tokio::select! {
            turn = turns.recv(), if open => match turn {
                // Closed: what waits is left for the next start; what was sent is seen
                // through, so that its outcome can be saved.
                None => {
                    open = false;
                    waiting.clear();
                    continue;
                }
                Some(turn) if turn.2.is_zero() => Step::Due(turn),
                // A retry waits first; it takes a connection when it goes.
                Some(turn) => {
                    waiting.push(sleep(turn.2).map(|()| Step::Due(turn)).boxed());
                    continue;
                }
            },
            Some(step) = waiting.next() => step,
            Some(step) = sending.next() => step,
            else => return,
        };
        // An answer back, or a connection ended: a request held for a connection may go.
        if let (Step::Done(..), Some(connections)) = (&step, connections.as_mut()) {
            connections.hand_out();
        }
        let done = match step {
            Step::Due(turn) => match target.request(&turn.0) {
                Ok(request) => {
                    sending.push(send(connections.as_mut(), turn, request, true));
                    continue;
                }
                Err(attempt) => (turn, attempt),
            },
            Step::Unanswered(turn, request) => {
                if let Some(connections) = connections.as_mut() {
                    connections.one_at_a_time();
                }
                sending.push(send(connections.as_mut(), turn, request, false));
                continue;
            }
            Step::Done(turn, attempt) => (turn, attempt),
        };
        if tried.send(finished(done)).is_err() {
            return;
        }
    }
}

/// Sends `request` and waits for what comes of it; once more at once if `first` and its
/// connection ended before the answer.
fn send(
    connections: Option<&mut Connections>,
    turn: Turn,
    request: Bytes,
    first: bool,
) -> BoxFuture<'static, Step> {
    // A request is only made for a usable URL, which has connections.
    let Some(connections) = connections else {
        let failed = Attempt::of(Err(NoAnswer::Failed("no connection".into())));
        return std::future::ready(Step::Done(turn, failed)).boxed();
    };
    let answer = connections.send(request.clone());
    async move {
        let answered = answer
            .await
            .unwrap_or_else(|_| Err(NoAnswer::Unanswered("the connection ended".into())));
        match answered {
            Err(NoAnswer::Unanswered(_)) if first => Step::Unanswered(turn, request),
            answered => Step::Done(turn, Attempt::of(answered)),
        }
    }
    .boxed()
}

fn finished(((event, failures, _), attempt): (Turn, Attempt)) -> Tried {
    let lag = (Utc::now() - event.happened_at())
        .to_std()
        .unwrap_or_default();
    Tried {
        event,
        failures,
        attempt,
        lag,
    }
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
