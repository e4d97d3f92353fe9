//! Delivery to one destination while this instance holds its lease: a plant's next event
//! is sent only once the one before it is delivered, and the cursor is saved as they go.

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use plantstore_store::{
    CommitNewsReceiver, Store,
    destinations::{DeliveryReport, EndpointState, Lease, LogPosition, StoredMessage},
};
use tokio::{
    sync::watch,
    time::{Instant, MissedTickBehavior, sleep_until},
};

use super::{
    attempt::Attempt,
    backoff::retry_wait,
    destination::Destination,
    event::event_id,
    in_flight::{AttemptOutcome, Attempts, Woken},
    pending::{PendingEvents, WINDOW},
};
use crate::{config::DeliveryConfig, telemetry::EndpointMetrics};

/// Requests in flight to one endpoint at most, each for another plant (a connection each
/// over HTTP/1.1): covers a local receiver's round trip, without swamping a serial one.
const IN_FLIGHT: usize = 64;
/// How often the log is read without news of commits, for what news misses: another
/// process's commits on SQLite, news lost in a crash, events committed after their news.
const POLL: Duration = Duration::from_millis(500);
/// The least time between reads: under load a read per commit costs a query per few events.
const READ_GAP: Duration = Duration::from_millis(20);
/// How often a moving cursor is saved: on SQLite each save queues with the deletes.
const SAVE_EVERY: Duration = Duration::from_millis(200);
const ANSWERS_ON_STOP: Duration = Duration::from_secs(2);
/// Longest a failing destination goes untried: one event goes then, so an outage of any
/// length is caught up within this, not within the longest backoff.
const CATCH_UP_PROBE: Duration = Duration::from_secs(30);

#[derive(Debug, PartialEq, Eq)]
pub(super) enum DeliveryEnd {
    /// The lease is another's, the endpoint was removed, or its cursor moved (`replay`).
    LeaseLost,
    /// The receiver answered 410.
    Disabled,
    /// This instance is stopping; what was delivered is saved.
    Halted,
}

struct Progress {
    cursor: LogPosition,
    delivered_through: Option<i64>,
    saved: LogPosition,
    last_save: Instant,
    failing: Option<Failing>,
}

/// The last failure; tried next at the failed event's retry, or the probe if sooner.
struct Failing {
    error: String,
    next_attempt_at: DateTime<Utc>,
    probe_at: Instant,
}

impl Progress {
    fn new(cursor: LogPosition) -> Self {
        Self {
            cursor,
            delivered_through: None,
            saved: cursor,
            last_save: Instant::now(),
            failing: None,
        }
    }

    fn advance(&mut self, pending: &mut PendingEvents) {
        if let Some((position, entry)) = pending.take_done() {
            self.cursor = position;
            self.delivered_through = Some(entry);
        }
    }

    fn save_due(&self, unsaved: bool) -> bool {
        (self.cursor != self.saved || unsaved) && self.last_save.elapsed() >= SAVE_EVERY
    }

    fn report(&self, stored: Vec<StoredMessage>) -> DeliveryReport {
        DeliveryReport {
            stored,
            cursor: self.cursor,
            delivered_through: self.delivered_through,
            state: if self.failing.is_some() {
                EndpointState::Failing
            } else {
                EndpointState::Active
            },
            last_error: self.failing.as_ref().map(|failing| failing.error.clone()),
            next_attempt_at: self.failing.as_ref().map(|failing| failing.next_attempt_at),
        }
    }
}

pub(super) struct DeliveryLoop {
    pub(super) store: Arc<dyn Store>,
    pub(super) lease: Lease,
    pub(super) owner: Arc<str>,
    pub(super) config: DeliveryConfig,
    pub(super) destination: Arc<Destination>,
    pub(super) counts: EndpointMetrics,
    pub(super) commits: CommitNewsReceiver,
    pub(super) stopping: watch::Receiver<bool>,
}

impl DeliveryLoop {
    #[tracing::instrument(name = "destination", skip_all, fields(endpoint = self.lease.endpoint_id))]
    pub(super) async fn run(self) {
        match self.deliver().await {
            // The 410 itself was logged where it was answered.
            DeliveryEnd::Disabled => {}
            DeliveryEnd::LeaseLost => tracing::info!(
                "delivery stopped: the lease is another instance's, or the endpoint changed"
            ),
            DeliveryEnd::Halted => tracing::debug!("delivery stopped with the instance"),
        }
    }

    async fn deliver(mut self) -> DeliveryEnd {
        let mut pending = PendingEvents::new(self.lease.cursor);
        let mut progress = Progress::new(self.lease.cursor);
        let mut in_flight = Attempts::new(Arc::clone(&self.destination), self.stopping.clone());
        let mut probe_at = None;
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // False after a short read, until news of a commit or the poll says there is more.
        let mut log_may_hold_more = true;
        let mut last_read = Instant::now();
        loop {
            if log_may_hold_more && pending.room() >= WINDOW / 4 {
                // Seen before reading: a commit after this is news again.
                self.commits.mark_seen();
                // A read that found events waits for the synchronous standbys to hold them,
                // as long as a partition lasts; a stopping instance stops waiting.
                let mut stopping = self.stopping.clone();
                let read = tokio::select! {
                    more = self.read(&mut pending) => Some(more),
                    () = stop_requested(&mut stopping) => None,
                };
                let Some(more) = read else {
                    return self
                        .finish(&mut in_flight, &mut pending, &mut progress)
                        .await;
                };
                log_may_hold_more = more;
                last_read = Instant::now();
            }
            while in_flight.len() < IN_FLIGHT
                && let Some(to_send) = pending.next_to_send()
            {
                in_flight.start(to_send);
            }
            progress.advance(&mut pending);
            if progress.save_due(self.destination.has_unsaved())
                && let Some(end) = self.save(&mut progress).await
            {
                return end;
            }
            let outcome = tokio::select! {
                Some(outcome) = in_flight.next() => outcome,
                () = self.commits.changed(), if !log_may_hold_more => {
                    sleep_until(last_read + READ_GAP).await;
                    log_may_hold_more = true;
                    continue;
                }
                _ = poll.tick() => {
                    log_may_hold_more = true;
                    continue;
                }
                () = sleep_until(probe_at.unwrap_or_else(Instant::now)), if probe_at.is_some() => {
                    probe_at = None;
                    in_flight.probe();
                    continue;
                }
                () = stop_requested(&mut self.stopping) => {
                    return self
                        .finish(&mut in_flight, &mut pending, &mut progress)
                        .await;
                }
            };
            let mut next = Some(outcome);
            while let Some(outcome) = next {
                if let Some(outcome) = outcome {
                    let was_failing = progress.failing.is_some();
                    if let Some(end) = self.settle(outcome, &mut pending, &mut progress).await {
                        return end;
                    }
                    if was_failing && progress.failing.is_none() {
                        in_flight.destination_back();
                    }
                    probe_at = progress.failing.as_ref().map(|failing| failing.probe_at);
                }
                next = in_flight.next_ended();
            }
        }
    }

    /// Stopping: answers to sent attempts are settled for up to `ANSWERS_ON_STOP` and the
    /// cursor saved, so the next holder repeats nothing seen delivered; the rest go again.
    async fn finish(
        &self,
        in_flight: &mut Attempts,
        pending: &mut PendingEvents,
        progress: &mut Progress,
    ) -> DeliveryEnd {
        let until = Instant::now() + ANSWERS_ON_STOP;
        while let Ok(Some(outcome)) = tokio::time::timeout_at(until, in_flight.next()).await {
            if let Some(outcome) = outcome
                && let Some(end) = self.settle(outcome, pending, progress).await
            {
                return end;
            }
        }
        progress.advance(pending);
        if progress.cursor == progress.saved && !self.destination.has_unsaved() {
            return DeliveryEnd::Halted;
        }
        self.save(progress).await.unwrap_or(DeliveryEnd::Halted)
    }

    /// Reads what fits after what was read; whether the log may hold more.
    async fn read(&self, pending: &mut PendingEvents) -> bool {
        let room = pending.room();
        match self.store.read_events(pending.read_to(), room as i64).await {
            Ok(events) => {
                let full = events.len() >= room;
                pending.add(events, |event| self.lease.events.contains(&event.kind));
                full
            }
            // Nothing was added: the next read starts from the same place.
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the deletion log for deletion events");
                false
            }
        }
    }

    /// Saves the progress; `Some` when delivery must stop, the lease being lost.
    async fn save(&self, progress: &mut Progress) -> Option<DeliveryEnd> {
        let report = progress.report(self.destination.unsaved());
        match self
            .store
            .report_delivery(&self.lease, &self.owner, &report)
            .await
        {
            Ok(true) => {
                progress.saved = report.cursor;
                progress.last_save = Instant::now();
                self.destination.saved(&report.stored);
                None
            }
            Ok(false) => Some(DeliveryEnd::LeaseLost),
            Err(err) => {
                tracing::warn!(error = %err, "cannot save the delivery's progress");
                // Tried again after `SAVE_EVERY`, not at once.
                progress.last_save = Instant::now();
                None
            }
        }
    }

    /// What an attempt came to: the plant's next event, a retry, or (after a 410) the end.
    async fn settle(
        &self,
        outcome: AttemptOutcome,
        pending: &mut PendingEvents,
        progress: &mut Progress,
    ) -> Option<DeliveryEnd> {
        let AttemptOutcome {
            sent,
            attempt,
            lag,
            woken,
        } = outcome;
        let event = sent.event;
        match attempt {
            Attempt::Delivered => {
                self.counts.delivered(lag);
                pending.delivered(&event);
                progress.failing = None;
                None
            }
            Attempt::Gone => {
                self.counts.gone();
                tracing::warn!(event_id = %event_id(&event), "the receiver answered 410 Gone: endpoint disabled");
                let report = DeliveryReport {
                    state: EndpointState::Disabled,
                    last_error: Some("the receiver answered 410 Gone".into()),
                    next_attempt_at: None,
                    ..progress.report(self.destination.unsaved())
                };
                if let Err(err) = self
                    .store
                    .report_delivery(&self.lease, &self.owner, &report)
                    .await
                {
                    tracing::warn!(error = %err, "cannot save that the endpoint is disabled");
                }
                Some(DeliveryEnd::Disabled)
            }
            Attempt::Failed { error, retry_after } => {
                self.counts.failed();
                let failures = sent.failures + 1;
                let wait = retry_wait(&self.config, failures, retry_after);
                tracing::info!(event_id = %event_id(&event), %error, failures, retry_in_ms = wait.as_millis() as u64, "delivery failed");
                let max = self.config.webhook_retry_max;
                let probe = CATCH_UP_PROBE
                    .min(max)
                    .max(retry_after.unwrap_or_default().min(max));
                let next =
                    Utc::now() + chrono::Duration::from_std(wait.min(probe)).unwrap_or_default();
                progress.failing = Some(Failing {
                    error,
                    next_attempt_at: next,
                    probe_at: Instant::now() + probe,
                });
                // One sent at another's success that failed again is not sent at the next
                // one's: an event its receiver keeps refusing would go at every success.
                pending.retry(event, failures, wait, woken != Woken::Recovery);
                self.save(progress).await
            }
        }
    }
}

/// Resolves when this instance stops, or can no longer be told to (the sender is gone).
async fn stop_requested(stopping: &mut watch::Receiver<bool>) {
    let _ = stopping.wait_for(|stop| *stop).await;
}
