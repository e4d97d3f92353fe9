//! Delivery to one endpoint while this instance holds its lease: events of one plant in
//! order, several plants in flight, and the cursor moved over what is delivered without a
//! gap.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use chrono::{DateTime, Utc};
use plantstore_store::{DeliveryReport, Event, Lease, Store, StreamPosition};
use tokio::{
    sync::watch,
    task::JoinSet,
    time::{Instant, sleep, sleep_until},
};

use super::{
    attempt::{Attempt, Sender, Target},
    backoff::Backoff,
};
use crate::telemetry::Metrics;

/// Events read ahead of the cursor at most.
const WINDOW: usize = 512;
/// Plants whose events are being posted at once.
const IN_FLIGHT: usize = 32;
/// How often the log is read when no delete of this instance rang: for the deletes of
/// other instances and processes.
const POLL: Duration = Duration::from_millis(500);
/// The same while their commits are announced (PostgreSQL): for an announcement lost, and
/// for events held back by a transaction that was still running when they were announced.
const POLL_HEARING: Duration = Duration::from_secs(2);
/// The shortest time between two reads that found the log's end: under load the bell rings
/// with every delete, and a read per ring would cost a query per event.
const READ_GAP: Duration = Duration::from_millis(20);
/// The longest the cursor goes unsaved while it moves.
const SAVE_EVERY: Duration = Duration::from_millis(200);

/// Why delivery to an endpoint stopped.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stopped {
    /// Another instance holds the lease now, the endpoint was removed, or its cursor was
    /// moved (`replay`, `enable`).
    LeaseLost,
    /// The receiver answered 410.
    Disabled,
}

/// One event's attempt, as the task that made it reports back.
struct Tried {
    event: Event,
    failures: u32,
    attempt: Attempt,
    lag: Duration,
}

pub(super) struct EndpointDelivery {
    pub(super) store: Arc<dyn Store>,
    pub(super) lease: Lease,
    pub(super) owner: Arc<str>,
    pub(super) sender: Sender,
    pub(super) backoff: Backoff,
    pub(super) metrics: Arc<Metrics>,
    pub(super) wake: watch::Receiver<u64>,
    /// Changes when another process announces events, where the database carries that.
    pub(super) heard: Option<watch::Receiver<u64>>,
}

/// What has been read ahead of the cursor, in stream order, and which of it is delivered.
#[derive(Default)]
struct Window {
    events: VecDeque<(StreamPosition, i64, bool)>,
}

impl Window {
    fn push(&mut self, position: StreamPosition, entry: i64, done: bool) {
        self.events.push_back((position, entry, done));
    }

    fn mark_done(&mut self, position: StreamPosition) {
        if let Ok(at) = self.events.binary_search_by(|(p, _, _)| p.cmp(&position)) {
            self.events[at].2 = true;
        }
    }

    /// Drops the delivered events at the front; the last one's place and entry, if any.
    fn take_delivered(&mut self) -> Option<(StreamPosition, i64)> {
        let mut last = None;
        while let Some(&(position, entry, true)) = self.events.front() {
            last = Some((position, entry));
            self.events.pop_front();
        }
        last
    }
}

impl EndpointDelivery {
    #[tracing::instrument(name = "webhook_endpoint", skip_all, fields(endpoint = self.lease.endpoint))]
    pub(super) async fn run(mut self) -> Stopped {
        let label = self.lease.endpoint.to_string();
        let mut saved = self.lease.cursor;
        let mut cursor = saved;
        let mut delivered_through = None;
        let mut last_save = Instant::now();
        let mut read_to = cursor;
        let mut window = Window::default();
        // Plants with an event in flight, and the events of theirs that wait behind it.
        let mut busy: HashSet<i64> = HashSet::new();
        let mut behind: HashMap<i64, VecDeque<Event>> = HashMap::new();
        let mut ready: VecDeque<(Event, u32, Duration)> = VecDeque::new();
        let mut in_flight: JoinSet<Tried> = JoinSet::new();
        let mut failing: Option<(String, DateTime<Utc>)> = None;
        // Whether the log may hold more than was read: false after a read came back short,
        // until the bell or the poll says there may be new events.
        let mut more = true;
        let mut next_read = Instant::now();
        let target = Arc::new(Target::new(&self.lease.url, self.lease.secret.clone()));
        let poll = if self.heard.is_some() {
            POLL_HEARING
        } else {
            POLL
        };
        loop {
            let room = WINDOW - window.events.len();
            if more && room >= WINDOW / 4 && Instant::now() >= next_read {
                match self.store.read_events(read_to, room as i64).await {
                    Ok(events) => {
                        if events.len() < room {
                            more = false;
                            next_read = Instant::now() + READ_GAP;
                        }
                        for event in events {
                            read_to = event.position;
                            let wanted = self.lease.events.contains(event.kind.name());
                            window.push(event.position, event.entry.id, !wanted);
                            if !wanted {
                                continue;
                            }
                            let plant = event.entry.plant_id;
                            if busy.insert(plant) {
                                ready.push_back((event, 0, Duration::ZERO));
                            } else {
                                behind.entry(plant).or_default().push_back(event);
                            }
                        }
                    }
                    Err(err) => {
                        more = false;
                        tracing::warn!(error = %err, "cannot read the deletion log for webhooks");
                    }
                }
            }
            while in_flight.len() < IN_FLIGHT {
                let Some((event, failures, wait)) = ready.pop_front() else {
                    break;
                };
                let sender = self.sender.clone();
                let target = Arc::clone(&target);
                in_flight.spawn(async move {
                    sleep(wait).await;
                    let attempt = sender.post(&target, &event).await;
                    let lag = (Utc::now() - event.happened_at())
                        .to_std()
                        .unwrap_or_default();
                    Tried {
                        event,
                        failures,
                        attempt,
                        lag,
                    }
                });
            }
            if let Some((position, entry)) = window.take_delivered() {
                cursor = position;
                delivered_through = Some(entry);
            }
            let due = window.events.is_empty() || last_save.elapsed() >= SAVE_EVERY;
            if cursor != saved && due {
                let report = progress(cursor, delivered_through, &failing);
                match self
                    .store
                    .report_delivery(&self.lease, &self.owner, &report)
                    .await
                {
                    Ok(true) => {
                        saved = cursor;
                        last_save = Instant::now();
                    }
                    Ok(false) => return Stopped::LeaseLost,
                    Err(err) => tracing::warn!(error = %err, "cannot save the webhook cursor"),
                }
            }
            let tried = tokio::select! {
                Some(joined) = in_flight.join_next() => joined,
                // An error: the bell is gone with the app; the poll still reads.
                rung = self.wake.changed() => {
                    if rung.is_err() {
                        sleep(POLL).await;
                    }
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
                () = sleep_until(next_read), if more && Instant::now() < next_read => continue,
                () = sleep(poll) => {
                    more = true;
                    continue;
                }
            };
            let Ok(Tried {
                event,
                failures,
                attempt,
                lag,
            }) = tried
            else {
                // A delivery task panicked: its event is lost from memory, so start over
                // from the saved cursor rather than leave a gap.
                return Stopped::LeaseLost;
            };
            match attempt {
                Attempt::Delivered => {
                    self.metrics.webhook_delivered(&label, "delivered", lag);
                    window.mark_done(event.position);
                    failing = None;
                    let plant = event.entry.plant_id;
                    match behind.get_mut(&plant).and_then(VecDeque::pop_front) {
                        Some(next) => ready.push_back((next, 0, Duration::ZERO)),
                        None => {
                            behind.remove(&plant);
                            busy.remove(&plant);
                        }
                    }
                }
                Attempt::Gone => {
                    self.metrics.webhook_delivered(&label, "gone", lag);
                    tracing::warn!(webhook_id = %super::attempt::webhook_id(&event), "the receiver answered 410 Gone: endpoint disabled");
                    let report = DeliveryReport {
                        cursor,
                        delivered_through,
                        state: "disabled",
                        last_error: Some("the receiver answered 410 Gone".into()),
                        next_attempt_at: None,
                    };
                    if let Err(err) = self
                        .store
                        .report_delivery(&self.lease, &self.owner, &report)
                        .await
                    {
                        tracing::warn!(error = %err, "cannot save that the endpoint is disabled");
                    }
                    return Stopped::Disabled;
                }
                Attempt::Failed { error, retry_after } => {
                    self.metrics.webhook_delivered(&label, "failed", lag);
                    let failures = failures + 1;
                    let wait = self.backoff.after(failures, retry_after);
                    tracing::info!(webhook_id = %super::attempt::webhook_id(&event), %error, failures, retry_in_ms = wait.as_millis() as u64, "webhook delivery failed");
                    let next = Utc::now() + chrono::Duration::from_std(wait).unwrap_or_default();
                    failing = Some((error, next));
                    let report = progress(cursor, delivered_through, &failing);
                    match self
                        .store
                        .report_delivery(&self.lease, &self.owner, &report)
                        .await
                    {
                        Ok(true) => saved = cursor,
                        Ok(false) => return Stopped::LeaseLost,
                        Err(err) => tracing::warn!(error = %err, "cannot save the webhook state"),
                    }
                    ready.push_back((event, failures, wait));
                }
            }
        }
    }
}

/// Resolves when `heard` changes; never when there is nothing to hear.
async fn changed(heard: &mut Option<watch::Receiver<u64>>) -> Result<(), watch::error::RecvError> {
    match heard {
        Some(heard) => heard.changed().await,
        None => std::future::pending().await,
    }
}

/// How far delivery got, and whether its last attempt failed (with what, and when the
/// next one is).
fn progress(
    cursor: StreamPosition,
    delivered_through: Option<i64>,
    failing: &Option<(String, DateTime<Utc>)>,
) -> DeliveryReport {
    DeliveryReport {
        cursor,
        delivered_through,
        state: if failing.is_some() {
            "failing"
        } else {
            "active"
        },
        last_error: failing.as_ref().map(|(error, _)| error.clone()),
        next_attempt_at: failing.as_ref().map(|(_, at)| *at),
    }
}
