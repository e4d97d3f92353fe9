//! The thread events are sent from: a runtime of its own at the lowest CPU priority, so
//! that delivery runs on the CPU that serving requests leaves, and requests keep theirs.
//! Each endpoint has a lane on it: dispatches in, outcomes out.

use std::{sync::Arc, time::Duration};

use chrono::Utc;
use futures_util::{FutureExt, StreamExt, future::BoxFuture, stream::FuturesUnordered};
use plantstore_store::{Event, Signing};
use tokio::{
    runtime::Handle,
    sync::{mpsc, oneshot, watch},
    task::JoinHandle,
    time::sleep,
};

use super::{
    attempt::{Attempt, Destination},
    pending::Dispatch,
    signature::Signer,
};

/// One event's attempt, as it came back.
pub(super) struct Outcome {
    pub(super) event: Event,
    /// Failed attempts before this one.
    pub(super) failures: u32,
    pub(super) attempt: Attempt,
    /// From the event's commit to this attempt's end.
    pub(super) lag: Duration,
}

/// Where endpoints' requests run; the thread ends when this is dropped.
pub(super) struct SendingThread {
    runtime: Handle,
    _stop: Option<oneshot::Sender<()>>,
}

impl SendingThread {
    /// Starts the thread; when the system gives no thread, requests run on the caller's
    /// runtime, beside the requests served.
    pub(super) fn start() -> Self {
        match Self::thread() {
            Ok((runtime, stop)) => Self {
                runtime,
                _stop: Some(stop),
            },
            Err(err) => {
                tracing::warn!(error = %err, "cannot start the webhook sending thread; sending beside requests");
                Self {
                    runtime: Handle::current(),
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
            .name("webhook-sending".into())
            .spawn(move || {
                lower_priority();
                // Ends when `stop` is sent or dropped; the lanes still running end with it.
                let _ = runtime.block_on(stopped);
            })?;
        Ok((handle, stop))
    }

    /// A lane for one endpoint's requests, signed with what `signing` holds when each is
    /// made. Dropping the lane cancels every request of it still in flight or waiting:
    /// none is sent later.
    pub(super) fn open(&self, destination: Destination, signing: watch::Receiver<Signing>) -> Lane {
        let (dispatches, dispatches_in) = mpsc::unbounded_channel();
        let (outcomes_out, outcomes) = mpsc::unbounded_channel();
        let task = self.runtime.spawn(send_dispatches(
            Arc::new(destination),
            signing,
            dispatches_in,
            outcomes_out,
        ));
        Lane {
            dispatches: Some(dispatches),
            outcomes,
            task,
        }
    }
}

/// One endpoint's way to the sending thread.
pub(super) struct Lane {
    /// `None` once closed.
    dispatches: Option<mpsc::UnboundedSender<Dispatch>>,
    outcomes: mpsc::UnboundedReceiver<Outcome>,
    task: JoinHandle<()>,
}

impl Lane {
    /// Whether the lane still takes dispatches (its thread may have ended).
    pub(super) fn send(&self, dispatch: Dispatch) -> bool {
        self.dispatches
            .as_ref()
            .is_some_and(|dispatches| dispatches.send(dispatch).is_ok())
    }

    /// Takes no more dispatches: retries still waiting are dropped, and the outcomes of
    /// requests already sent still come back; then `next` gives `None`.
    pub(super) fn close(&mut self) {
        self.dispatches = None;
    }

    /// The next outcome; `None` when the lane ended.
    pub(super) async fn next(&mut self) -> Option<Outcome> {
        self.outcomes.recv().await
    }

    /// An outcome, if one is back already.
    pub(super) fn try_next(&mut self) -> Option<Outcome> {
        self.outcomes.try_recv().ok()
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Sends each dispatch as it comes, or after its wait (the endpoint sends no more than it
/// allows in flight); each is a request of its own with its own timeout.
async fn send_dispatches(
    destination: Arc<Destination>,
    mut signing: watch::Receiver<Signing>,
    mut dispatches: mpsc::UnboundedReceiver<Dispatch>,
    outcomes: mpsc::UnboundedSender<Outcome>,
) {
    let mut signer = Arc::new(Signer::new(&signing.borrow_and_update()));
    let mut waiting: FuturesUnordered<BoxFuture<'static, Dispatch>> = FuturesUnordered::new();
    let mut sending: FuturesUnordered<BoxFuture<'static, Outcome>> = FuturesUnordered::new();
    let mut open = true;
    loop {
        let due = tokio::select! {
            dispatch = dispatches.recv(), if open => match dispatch {
                // Closed: what waits is left for the next start; what was sent is seen
                // through, so that its outcome can be saved.
                None => {
                    open = false;
                    waiting.clear();
                    continue;
                }
                Some(dispatch) if dispatch.wait.is_zero() => dispatch,
                Some(dispatch) => {
                    waiting.push(sleep(dispatch.wait).map(|()| dispatch).boxed());
                    continue;
                }
            },
            Some(dispatch) = waiting.next() => dispatch,
            Some(outcome) = sending.next() => {
                if outcomes.send(outcome).is_err() {
                    return;
                }
                continue;
            }
            else => return,
        };
        if signing.has_changed().unwrap_or(false) {
            signer = Arc::new(Signer::new(&signing.borrow_and_update()));
        }
        let (destination, signer) = (Arc::clone(&destination), Arc::clone(&signer));
        sending.push(
            async move {
                let attempt = destination.post(&signer, &due.event).await;
                let lag = (Utc::now() - due.event.happened_at())
                    .to_std()
                    .unwrap_or_default();
                Outcome {
                    event: due.event,
                    failures: due.failures,
                    attempt,
                    lag,
                }
            }
            .boxed(),
        );
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
        tracing::warn!(error = %err, "cannot lower the webhook sending thread's priority");
    }
}
