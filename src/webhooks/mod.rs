//! Deletion events delivered to webhook endpoints: which endpoints this instance delivers
//! to (a lease each, renewed while it runs), started and stopped as leases come and go.

mod announcer;
mod attempt;
mod backoff;
mod commit_signal;
mod endpoint;
mod pending;
mod sending;
pub mod signature;

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use plantstore_store::{Announcements, Lease, Signing, Store};
use tokio::{sync::watch, task::JoinHandle};

pub use backoff::Backoff;
pub use commit_signal::CommitSignal;
use endpoint::{EndpointDelivery, Stopped};
use sending::SendingThread;

use crate::telemetry::Metrics;

/// How often the leases are renewed, and new endpoints found.
const CLAIM_EVERY: Duration = Duration::from_secs(1);
/// How long a lease lasts unrenewed: past it, after a crash, another instance takes over.
const LEASE: Duration = Duration::from_secs(10);
/// How often the pending counts are read for `/metrics`.
const COUNT_EVERY: u32 = 5;
/// How long stopping waits for the deliveries to save how far they got.
const SAVE_ON_STOP: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// `PLANTSTORE_WEBHOOK_TIMEOUT`.
    pub timeout: Duration,
    pub backoff: Backoff,
}

/// The delivery loops of this instance.
pub struct Deliveries {
    store: Arc<dyn Store>,
    settings: Settings,
    metrics: Arc<Metrics>,
    /// This instance's name in the leases: its host and address, so that the same instance
    /// started again after a crash takes its leases back at once.
    owner: Arc<str>,
    signal: CommitSignal,
    /// Between this instance and the others, where the database carries it.
    announcements: Option<Arc<dyn Announcements>>,
}

impl Deliveries {
    pub fn new(
        store: Arc<dyn Store>,
        settings: Settings,
        metrics: Arc<Metrics>,
        signal: CommitSignal,
        owner: String,
    ) -> Self {
        Self {
            announcements: store.announcements(),
            store,
            settings,
            metrics,
            owner: owner.into(),
            signal,
        }
    }

    /// Claims endpoints and delivers to them until `stop` resolves; then has each delivery
    /// save how far it got and gives up its leases, so another instance takes over at once
    /// and repeats nothing this one saw delivered.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        let mut running: HashMap<i64, Running> = HashMap::new();
        let (stopping, stopping_seen) = watch::channel(false);
        let sending = Arc::new(SendingThread::start());
        let (announcing, needed) = watch::channel(false);
        let announce = async {
            match &self.announcements {
                Some(announcements) => {
                    announcer::announce(Arc::clone(announcements), self.signal.clone(), needed)
                        .await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::pin!(stop);
        tokio::select! {
            _ = async { tokio::join!(self.claim_and_deliver(&mut running, &announcing, &sending, &stopping_seen), announce) } => {},
            () = &mut stop => {},
        }
        stopping.send_replace(true);
        let saved = futures_util::future::join_all(running.values_mut().map(|task| &mut task.task));
        if tokio::time::timeout(SAVE_ON_STOP, saved).await.is_err() {
            tracing::warn!(
                "webhook deliveries did not save their progress in time; the next instance may repeat some events"
            );
        }
        running.clear();
        if let Err(err) = self.store.release_endpoints(&self.owner).await {
            tracing::warn!(error = %err, "cannot release the webhook leases");
        }
    }

    /// Claims and renews leases each second, runs a delivery per lease, listens for the
    /// other instances' announcements while it holds any, and sets `announcing` while
    /// another instance may hold one.
    async fn claim_and_deliver(
        &self,
        running: &mut HashMap<i64, Running>,
        announcing: &watch::Sender<bool>,
        sending: &Arc<SendingThread>,
        stopping: &watch::Receiver<bool>,
    ) {
        let mut every = tokio::time::interval(CLAIM_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut renewed = tokio::time::Instant::now();
        // Endpoints not disabled, as last counted.
        let mut active = 0;
        let mut counted = HashSet::new();
        let mut heard: Option<watch::Receiver<u64>> = None;
        for round in 0u32.. {
            every.tick().await;
            if round % COUNT_EVERY == 0 {
                active = self.count_pending(&mut counted).await.unwrap_or(active);
            }
            let leases = match self.store.claim_endpoints(&self.owner, LEASE).await {
                Ok(leases) => leases,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot renew the webhook leases");
                    // Stop well before the leases run out: past that, another instance
                    // may deliver the same events.
                    if renewed.elapsed() > LEASE / 2 {
                        running.clear();
                    }
                    continue;
                }
            };
            renewed = tokio::time::Instant::now();
            announcing.send_if_modified(|announcing| {
                let others = active > leases.len();
                std::mem::replace(announcing, others) != others
            });
            if leases.is_empty() {
                heard = None;
            } else if heard.is_none() {
                heard = self.announcements.as_ref().map(|heard| heard.listen());
            }
            // Stop what is no longer ours, has ended, or is not the row it started with
            // (removed, replayed, enabled again); a new secret is followed where it runs.
            running.retain(
                |id, task| match leases.iter().find(|lease| lease.endpoint == *id) {
                    Some(lease) if !task.task.is_finished() && task.started_as(lease) => {
                        task.follow_secret(&lease.signing);
                        true
                    }
                    _ => false,
                },
            );
            for lease in leases {
                if running.contains_key(&lease.endpoint) {
                    continue;
                }
                tracing::info!(endpoint = lease.endpoint, "delivering deletion events");
                let (signing, signing_seen) = watch::channel(lease.signing.clone());
                let started = lease.clone();
                let delivery = EndpointDelivery {
                    store: Arc::clone(&self.store),
                    lease,
                    owner: Arc::clone(&self.owner),
                    sending: Arc::clone(sending),
                    timeout: self.settings.timeout,
                    signing: signing_seen,
                    backoff: self.settings.backoff,
                    metrics: Arc::clone(&self.metrics),
                    wake: self.signal.listen(),
                    heard: heard.clone(),
                    stopping: stopping.clone(),
                };
                running.insert(
                    started.endpoint,
                    Running {
                        task: tokio::spawn(delivery.run()),
                        started,
                        signing,
                    },
                );
            }
        }
    }

    /// Sets the pending gauges; returns how many endpoints are not disabled. An endpoint
    /// `counted` last time and gone now was removed: nothing is pending for it any more.
    async fn count_pending(&self, counted: &mut HashSet<i64>) -> Option<usize> {
        match self.store.list_endpoints().await {
            Ok(endpoints) => {
                let listed: HashSet<i64> = endpoints.iter().map(|endpoint| endpoint.id).collect();
                for removed in counted.difference(&listed) {
                    self.metrics.webhook_pending(&removed.to_string(), 0);
                }
                *counted = listed;
                for endpoint in &endpoints {
                    self.metrics
                        .webhook_pending(&endpoint.id.to_string(), endpoint.pending);
                }
                Some(
                    endpoints
                        .iter()
                        .filter(|endpoint| endpoint.state != "disabled")
                        .count(),
                )
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot count the pending webhook events");
                None
            }
        }
    }
}

/// One endpoint's delivery task, the lease it started with, and its secrets as they are
/// now; dropping it stops the task, and cancels its requests.
struct Running {
    task: JoinHandle<Stopped>,
    started: Lease,
    signing: watch::Sender<Signing>,
}

impl Running {
    /// Whether `lease` is the row the task started with: the same endpoint (ids are never
    /// reused), URL, event types and generation.
    fn started_as(&self, lease: &Lease) -> bool {
        let started = &self.started;
        started.url == lease.url
            && started.events == lease.events
            && started.http2 == lease.http2
            && started.generation == lease.generation
    }

    /// Hands a new secret to the running task, rather than starting it over, which would
    /// repeat what it sent since it last saved.
    fn follow_secret(&self, signing: &Signing) {
        if *self.signing.borrow() != *signing {
            self.signing.send_replace(signing.clone());
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}
