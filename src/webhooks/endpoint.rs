//! Delivery to one endpoint while this instance holds its lease: when to read the log,
//! each plant's next event sent once the one before it is delivered, each outcome
//! settled, and the cursor saved.

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use plantstore_store::{DeliveryReport, Lease, Signing, Store, StreamPosition};
use tokio::{
    sync::watch,
    time::{Instant, sleep, sleep_until},
};

use super::{
    attempt::{Attempt, Destination, webhook_id},
    backoff::Backoff,
    commit_signal::SignalListener,
    pending::{PendingEvents, WINDOW},
    sending::{Lane, Outcome, SendingThread},
};
use crate::telemetry::{EndpointMetrics, Metrics};

/// Requests in flight to one endpoint at most, each for another plant: over HTTP/1.1 each
/// holds a connection of its own (requests are never pipelined), over HTTP/2 a stream.
/// Enough to cover the round trip to a receiver on the same machine under load, few
/// enough not to swamp one that serves a request at a time per connection.
const IN_FLIGHT: usize = 64;
/// How often the log is read when no delete of this instance rang: for the deletes of
/// other instances and processes.
const POLL: Duration = Duration::from_millis(500);
/// The same while their commits are announced (PostgreSQL): for an announcement lost, and
/// for events held back by a transaction that was still running when they were announced.
const POLL_HEARING: Duration = Duration::from_secs(2);
/// The shortest time between two reads that found the log's end: under load the commit
/// signal is raised with every delete, and a read per signal would cost a query per event.
/// It is not listened to during the gap, only looked at when it ends: woken by each, the loop
/// went round about 12,000 times a second under load, each time on a request thread
/// (bench/RESULTS.md).
const READ_GAP: Duration = Duration::from_millis(20);
/// How often a moving cursor is saved: each save is a write, which on SQLite queues with
/// the deletes for its one writer (saving each time all read was delivered cost deletes a
/// tenth of their rate once delivery kept up with them).
const SAVE_EVERY: Duration = Duration::from_millis(200);
/// How long a stopping delivery waits for the answers to requests it has sent.
const ANSWERS_ON_STOP: Duration = Duration::from_secs(2);

/// Why delivery to an endpoint stopped.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stopped {
    /// Another instance holds the lease now, the endpoint was removed, or its cursor was
    /// moved (`replay`, `enable`).
    LeaseLost,
    /// The receiver answered 410.
    Disabled,
    /// This instance is stopping; what was delivered is saved.
    Halted,
}

/// How far delivery got, how much of that is saved, and whether its last attempt failed
/// (with what, and when the next one is).
struct Progress {
    cursor: StreamPosition,
    delivered_through: Option<i64>,
    saved: StreamPosition,
    last_save: Instant,
    failing: Option<(String, DateTime<Utc>)>,
}

impl Progress {
    fn new(cursor: StreamPosition) -> Self {
        Self {
            cursor,
            delivered_through: None,
            saved: cursor,
            last_save: Instant::now(),
            failing: None,
        }
    }

    /// Moves the cursor over the events delivered in stream order.
    fn advance(&mut self, ahead: &mut PendingEvents) {
        if let Some((position, entry)) = ahead.take_done() {
            self.cursor = position;
            self.delivered_through = Some(entry);
        }
    }

    /// When the cursor is to be saved: `SAVE_EVERY` after the last save, once it moved.
    fn save_at(&self) -> Option<Instant> {
        (self.cursor != self.saved).then_some(self.last_save + SAVE_EVERY)
    }

    fn report(&self) -> DeliveryReport {
        DeliveryReport {
            cursor: self.cursor,
            delivered_through: self.delivered_through,
            state: if self.failing.is_some() {
                "failing"
            } else {
                "active"
            },
            last_error: self.failing.as_ref().map(|(error, _)| error.clone()),
            next_attempt_at: self.failing.as_ref().map(|(_, at)| *at),
        }
    }
}

pub(super) struct EndpointDelivery {
    pub(super) store: Arc<dyn Store>,
    pub(super) lease: Lease,
    pub(super) owner: Arc<str>,
    pub(super) sending: Arc<SendingThread>,
    /// Each attempt's limit, connecting included.
    pub(super) timeout: Duration,
    /// The endpoint's secrets as the lease now has them (a rotation changes them).
    pub(super) signing: watch::Receiver<Signing>,
    pub(super) backoff: Backoff,
    pub(super) metrics: Arc<Metrics>,
    pub(super) wake: SignalListener,
    /// Changes when another process announces events, where the database carries that.
    pub(super) heard: Option<watch::Receiver<u64>>,
    /// Turns true when this instance stops.
    pub(super) stopping: watch::Receiver<bool>,
}

impl EndpointDelivery {
    #[tracing::instrument(name = "webhook_endpoint", skip_all, fields(endpoint = self.lease.endpoint))]
    pub(super) async fn run(mut self) -> Stopped {
        let counts = self
            .metrics
            .webhook_endpoint(&self.lease.endpoint.to_string());
        let destination = Destination::new(&self.lease.url, self.lease.http2, self.timeout);
        let poll = if self.heard.is_some() {
            POLL_HEARING
        } else {
            POLL
        };
        let mut ahead = PendingEvents::new(self.lease.cursor);
        let mut progress = Progress::new(self.lease.cursor);
        let mut lane = self.sending.open(destination, self.signing.clone());
        let mut in_flight = 0;
        // Whether the log may hold more than was read: false after a read came back short,
        // until the commit signal, an announcement or the poll says there may be new events.
        let mut more = true;
        let mut next_read = Instant::now();
        loop {
            if more && ahead.room() >= WINDOW / 4 && Instant::now() >= next_read {
                self.wake.heard();
                more = self.read(&mut ahead).await;
                if !more {
                    next_read = Instant::now() + READ_GAP;
                }
            }
            while in_flight < IN_FLIGHT {
                let Some(dispatch) = ahead.next_dispatch() else {
                    break;
                };
                if !lane.send(dispatch) {
                    // The sending thread is gone: start over from the saved cursor.
                    return Stopped::LeaseLost;
                }
                in_flight += 1;
            }
            progress.advance(&mut ahead);
            let save_at = progress.save_at();
            if save_at.is_some_and(|at| Instant::now() >= at)
                && let Some(stopped) = self.save(&mut progress).await
            {
                return stopped;
            }
            let save_at = progress.save_at();
            // During the gap the signal is only looked at when it ends; after it, listened to.
            let in_gap = Instant::now() < next_read;
            let outcome = tokio::select! {
                outcome = lane.next(), if in_flight > 0 => match outcome {
                    Some(outcome) => outcome,
                    None => return Stopped::LeaseLost,
                },
                () = self.wake.changed(), if !more && !in_gap => {
                    more = true;
                    continue;
                }
                heard = changed(&mut self.heard) => {
                    if heard.is_err() {
                        // The store stopped listening: the poll still reads.
                        self.heard = None;
                    }
                    more = true;
                    continue;
                }
                () = stopped(&mut self.stopping) => {
                    return self.finish(&mut lane, &counts, &mut ahead, &mut progress).await;
                }
                // The gap ended: read if more may be there, or the signal came during it.
                () = sleep_until(next_read), if in_gap => {
                    more = more || self.wake.was_raised();
                    continue;
                }
                () = sleep_until(save_at.unwrap_or_else(Instant::now)), if save_at.is_some() => continue,
                () = sleep(poll) => {
                    more = true;
                    continue;
                }
            };
            // Every outcome already back is settled before the loop goes round again: a
            // round per event cost the request threads timers and wake-ups under load.
            let mut next = Some(outcome);
            while let Some(outcome) = next {
                in_flight -= 1;
                if let Some(stopped) = self
                    .settle(outcome, &counts, &mut ahead, &mut progress)
                    .await
                {
                    return stopped;
                }
                next = lane.try_next();
            }
        }
    }

    /// Stopping: no more attempts start; those sent are settled as their answers come
    /// (for up to `ANSWERS_ON_STOP`), and the cursor is saved, so that the instance taking
    /// over repeats nothing this one saw delivered. An attempt still unanswered then, or a
    /// retry still waiting, goes again from there, as around a crash.
    async fn finish(
        &self,
        lane: &mut Lane,
        counts: &EndpointMetrics,
        ahead: &mut PendingEvents,
        progress: &mut Progress,
    ) -> Stopped {
        lane.close();
        let until = Instant::now() + ANSWERS_ON_STOP;
        while let Ok(Some(outcome)) = tokio::time::timeout_at(until, lane.next()).await {
            if let Some(stopped) = self.settle(outcome, counts, ahead, progress).await {
                return stopped;
            }
        }
        progress.advance(ahead);
        if progress.save_at().is_some()
            && let Some(stopped) = self.save(progress).await
        {
            return stopped;
        }
        Stopped::Halted
    }

    /// Reads what fits after what was read; whether the log may hold more.
    async fn read(&self, ahead: &mut PendingEvents) -> bool {
        let room = ahead.room();
        match self.store.read_events(ahead.read_to(), room as i64).await {
            Ok(events) => {
                let full = events.len() >= room;
                ahead.add(events, |event| {
                    self.lease.events.contains(event.kind.name())
                });
                full
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the deletion log for webhooks");
                false
            }
        }
    }

    /// Saves the progress; `Some` when delivery must stop, the lease being lost.
    async fn save(&self, progress: &mut Progress) -> Option<Stopped> {
        match self
            .store
            .report_delivery(&self.lease, &self.owner, &progress.report())
            .await
        {
            Ok(true) => {
                progress.saved = progress.cursor;
                progress.last_save = Instant::now();
                None
            }
            Ok(false) => Some(Stopped::LeaseLost),
            Err(err) => {
                tracing::warn!(error = %err, "cannot save the webhook delivery's progress");
                // Tried again after `SAVE_EVERY`, not at once.
                progress.last_save = Instant::now();
                None
            }
        }
    }

    /// What an attempt came to: the plant's next event, a retry, or (after a 410) the end.
    async fn settle(
        &self,
        outcome: Outcome,
        counts: &EndpointMetrics,
        ahead: &mut PendingEvents,
        progress: &mut Progress,
    ) -> Option<Stopped> {
        let Outcome {
            event,
            failures,
            attempt,
            lag,
        } = outcome;
        match attempt {
            Attempt::Delivered => {
                counts.delivered(lag);
                ahead.delivered(&event);
                progress.failing = None;
                None
            }
            Attempt::Gone => {
                counts.gone();
                tracing::warn!(webhook_id = %webhook_id(&event), "the receiver answered 410 Gone: endpoint disabled");
                let report = DeliveryReport {
                    state: "disabled",
                    last_error: Some("the receiver answered 410 Gone".into()),
                    next_attempt_at: None,
                    ..progress.report()
                };
                if let Err(err) = self
                    .store
                    .report_delivery(&self.lease, &self.owner, &report)
                    .await
                {
                    tracing::warn!(error = %err, "cannot save that the endpoint is disabled");
                }
                Some(Stopped::Disabled)
            }
            Attempt::Failed { error, retry_after } => {
                counts.failed();
                let failures = failures + 1;
                let wait = self.backoff.after(failures, retry_after);
                tracing::info!(webhook_id = %webhook_id(&event), %error, failures, retry_in_ms = wait.as_millis() as u64, "webhook delivery failed");
                let next = Utc::now() + chrono::Duration::from_std(wait).unwrap_or_default();
                progress.failing = Some((error, next));
                ahead.retry(event, failures, wait);
                self.save(progress).await
            }
        }
    }
}

/// Resolves when this instance stops, or can no longer be told to (the sender is gone).
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    let _ = stopping.wait_for(|stop| *stop).await;
}

/// Resolves when `heard` changes; never when there is nothing to hear.
async fn changed(heard: &mut Option<watch::Receiver<u64>>) -> Result<(), watch::error::RecvError> {
    match heard {
        Some(heard) => heard.changed().await,
        None => std::future::pending().await,
    }
}
