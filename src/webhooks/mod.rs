//! Deletion events delivered to webhook endpoints: which endpoints this instance delivers
//! to (a lease each, renewed while it runs), started and stopped as leases come and go.

mod attempt;
mod backoff;
mod endpoint;
pub mod signature;

use std::{collections::HashMap, sync::Arc, time::Duration};

use plantstore_store::Store;
use tokio::{sync::watch, task::JoinHandle};

use attempt::Sender;
pub use backoff::Backoff;
use endpoint::{EndpointDelivery, Stopped};

use crate::telemetry::Metrics;

/// How often the leases are renewed, and new endpoints found.
const CLAIM_EVERY: Duration = Duration::from_secs(1);
/// How long a lease lasts unrenewed: past it, after a crash, another instance takes over.
const LEASE: Duration = Duration::from_secs(10);
/// How often the pending counts are read for `/metrics`.
const COUNT_EVERY: u32 = 5;

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
    sender: Sender,
    bell: Bell,
}

/// Rung after each delete this instance commits, so its deliveries read the log at once
/// rather than at their next poll.
#[derive(Debug, Clone)]
pub struct Bell(Arc<watch::Sender<u64>>);

impl Default for Bell {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(0)))
    }
}

impl Bell {
    /// Nothing on the request path when no endpoint is being delivered to here.
    pub fn ring(&self) {
        if self.0.receiver_count() > 0 {
            self.0.send_modify(|rung| *rung = rung.wrapping_add(1));
        }
    }

    fn listen(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
}

impl Deliveries {
    pub fn new(
        store: Arc<dyn Store>,
        settings: Settings,
        metrics: Arc<Metrics>,
        bell: Bell,
        owner: String,
    ) -> Self {
        Self {
            sender: Sender::new(settings.timeout),
            store,
            settings,
            metrics,
            owner: owner.into(),
            bell,
        }
    }

    /// Claims endpoints and delivers to them until `stop` resolves; then gives up its
    /// leases, so another instance takes over without waiting for them to run out.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        let mut running: HashMap<i64, Running> = HashMap::new();
        tokio::pin!(stop);
        tokio::select! {
            () = self.claim_and_deliver(&mut running) => {},
            () = &mut stop => {},
        }
        running.clear();
        if let Err(err) = self.store.release_endpoints(&self.owner).await {
            tracing::warn!(error = %err, "cannot release the webhook leases");
        }
    }

    async fn claim_and_deliver(&self, running: &mut HashMap<i64, Running>) {
        let mut every = tokio::time::interval(CLAIM_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut renewed = tokio::time::Instant::now();
        for round in 0u32.. {
            every.tick().await;
            if round % COUNT_EVERY == 0 {
                self.count_pending().await;
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
            // Stop what is no longer ours, has ended, or was moved to a new generation.
            running.retain(|id, task| {
                !task.0.is_finished()
                    && leases
                        .iter()
                        .any(|lease| lease.endpoint == *id && lease.generation == task.1)
            });
            for lease in leases {
                if running.contains_key(&lease.endpoint) {
                    continue;
                }
                tracing::info!(endpoint = lease.endpoint, "delivering deletion events");
                let (endpoint, generation) = (lease.endpoint, lease.generation);
                let delivery = EndpointDelivery {
                    store: Arc::clone(&self.store),
                    lease,
                    owner: Arc::clone(&self.owner),
                    sender: self.sender.clone(),
                    backoff: self.settings.backoff,
                    metrics: Arc::clone(&self.metrics),
                    wake: self.bell.listen(),
                };
                running.insert(endpoint, Running(tokio::spawn(delivery.run()), generation));
            }
        }
    }

    async fn count_pending(&self) {
        match self.store.list_endpoints().await {
            Ok(endpoints) => {
                for endpoint in endpoints {
                    self.metrics
                        .webhook_pending(&endpoint.id.to_string(), endpoint.pending);
                }
            }
            Err(err) => tracing::warn!(error = %err, "cannot count the pending webhook events"),
        }
    }
}

/// One endpoint's delivery task and the generation it started with; dropping it stops
/// the task.
struct Running(JoinHandle<Stopped>, i64);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}
