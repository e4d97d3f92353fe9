//! One destination's attempts in flight, or waiting for their time to be retried.

use std::{sync::Arc, time::Duration};

use chrono::Utc;
use futures_util::{FutureExt, StreamExt, future::BoxFuture, stream::FuturesUnordered};
use tokio::sync::{Notify, watch};

use super::{attempt::Attempt, destination::Destination, pending::EventToSend};

pub(super) struct AttemptOutcome {
    pub(super) sent: EventToSend,
    pub(super) attempt: Attempt,
    /// From the event's commit to this attempt's end.
    pub(super) lag: Duration,
    /// Sent before its wait was over, and why.
    pub(super) woken: Woken,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Woken {
    No,
    Probe,
    Recovery,
}

/// What sends waiting events before their time: the destination came back (every one that
/// may be woken goes), or the catch-up probe (one goes).
#[derive(Default)]
struct Wake {
    recovered: Notify,
    probe: Notify,
}

/// Each resolves to `None` if it was still waiting when this instance began to stop.
pub(super) struct Attempts {
    destination: Arc<Destination>,
    wake: Arc<Wake>,
    stopping: watch::Receiver<bool>,
    running: FuturesUnordered<BoxFuture<'static, Option<AttemptOutcome>>>,
}

impl Attempts {
    pub(super) fn new(destination: Arc<Destination>, stopping: watch::Receiver<bool>) -> Self {
        Self {
            destination,
            wake: Arc::default(),
            stopping,
            running: FuturesUnordered::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.running.len()
    }

    pub(super) fn start(&mut self, to_send: EventToSend) {
        let attempt = attempt(
            Arc::clone(&self.destination),
            to_send,
            Arc::clone(&self.wake),
            self.stopping.clone(),
        );
        self.running.push(attempt.boxed());
    }

    /// The next attempt to end; `None` when there are none.
    pub(super) async fn next(&mut self) -> Option<Option<AttemptOutcome>> {
        self.running.next().await
    }

    /// An attempt that has ended already, if any.
    pub(super) fn next_ended(&mut self) -> Option<Option<AttemptOutcome>> {
        self.running.next().now_or_never().flatten()
    }

    /// The destination answered after failing: what waits on it goes now.
    pub(super) fn destination_back(&self) {
        self.wake.recovered.notify_waiters();
    }

    /// One waiting attempt goes now, to find out whether the destination is back.
    pub(super) fn probe(&self) {
        self.wake.probe.notify_one();
    }
}

/// Sends one event after its wait; one still waiting at a stop is left for the next start.
async fn attempt(
    destination: Arc<Destination>,
    to_send: EventToSend,
    wake: Arc<Wake>,
    stopping: watch::Receiver<bool>,
) -> Option<AttemptOutcome> {
    let mut woken = Woken::No;
    if !to_send.wait.is_zero() {
        let recovered = async {
            if to_send.may_wake {
                wake.recovered.notified().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        woken = tokio::select! {
            () = tokio::time::sleep(to_send.wait) => Woken::No,
            () = wake.probe.notified() => Woken::Probe,
            () = recovered => Woken::Recovery,
        };
        if *stopping.borrow() {
            return None;
        }
    }
    let attempt = destination.send(&to_send.event).await;
    let lag = (Utc::now() - to_send.event.happened_at())
        .to_std()
        .unwrap_or_default();
    Some(AttemptOutcome {
        sent: to_send,
        attempt,
        lag,
        woken,
    })
}
