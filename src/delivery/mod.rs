//! Deletion events delivered to their destinations, webhook endpoints and JetStream
//! streams, each by the instance holding its lease, started and stopped as leases move.

mod attempt;
mod backoff;
mod delivery_loop;
mod destination;
mod event;
mod in_flight;
mod pending;
pub mod signature;
mod stream;
mod webhook;

pub(crate) use event::EntryJson;
pub(crate) use stream::{TargetUse, check_target, stored_url};

use std::{
    collections::{HashMap, HashSet},
    panic::AssertUnwindSafe,
    sync::Arc,
    time::Duration,
};

use futures_util::FutureExt;
use plantstore_store::{
    Store,
    destinations::{DeliveryReport, DestinationKind, EndpointState, Lease},
};
use tokio::{sync::watch, task::JoinHandle};

use delivery_loop::DeliveryLoop;
use destination::{Destination, SecretsFeed};
use signature::Signer;

use crate::{config::DeliveryConfig, telemetry::Metrics};

/// How often the leases are renewed, and new endpoints found.
const CLAIM_EVERY: Duration = Duration::from_secs(1);
/// How long a lease lasts unrenewed: past it, after a crash, another instance takes over.
const DESTINATION_LEASE: Duration = Duration::from_secs(10);
/// How often the pending counts and states are read for `/metrics`.
const COUNT_EVERY: u32 = 5;
const SAVE_ON_STOP: Duration = Duration::from_secs(5);

pub struct Deliveries {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: DeliveryConfig,
    pub(crate) metrics: Arc<Metrics>,
    /// This instance's name in the leases: its host and address, so that the same instance
    /// started again after a crash takes its leases back at once.
    pub(crate) owner: Arc<str>,
}

impl Deliveries {
    /// Claims endpoints and delivers until `stop`; then each delivery saves how far it got
    /// and the leases are released: another instance takes over at once, repeating nothing.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        let mut running: HashMap<i64, Running> = HashMap::new();
        let (stopping, stopping_seen) = watch::channel(false);
        tokio::select! {
            () = self.claim_and_deliver(&mut running, &stopping_seen) => {},
            () = stop => {},
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

    async fn claim_and_deliver(
        &self,
        running: &mut HashMap<i64, Running>,
        stopping: &watch::Receiver<bool>,
    ) {
        let mut every = tokio::time::interval(CLAIM_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut renewed = tokio::time::Instant::now();
        let mut counted = HashSet::new();
        for round in 0u32.. {
            every.tick().await;
            if round % COUNT_EVERY == 0 {
                self.count_pending(&mut counted).await;
            }
            let leases = match self
                .store
                .claim_endpoints(&self.owner, DESTINATION_LEASE)
                .await
            {
                Ok(leases) => leases,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot renew the webhook leases");
                    // Stop well before the leases run out: past that, another instance
                    // may deliver the same events.
                    if renewed.elapsed() > DESTINATION_LEASE / 2 {
                        running.clear();
                    }
                    continue;
                }
            };
            renewed = tokio::time::Instant::now();
            for lease in &leases {
                if let Some(task) = running.get_mut(&lease.endpoint_id)
                    && let Some(why) = task.take_stop()
                {
                    self.record_stop(lease, why).await;
                }
            }
            // Stop what is no longer ours, has ended, or is not the row it started with
            // (removed, replayed, enabled again); a new secret is followed where it runs.
            // A fault stops it until its row changes, rather than a failure each second.
            running.retain(
                |id, task| match leases.iter().find(|lease| lease.endpoint_id == *id) {
                    Some(lease)
                        if (task.stopped || !task.task.is_finished()) && task.started_as(lease) =>
                    {
                        task.follow_secrets(lease);
                        true
                    }
                    _ => false,
                },
            );
            for lease in leases {
                if running.contains_key(&lease.endpoint_id) {
                    continue;
                }
                tracing::info!(endpoint = lease.endpoint_id, "delivering deletion events");
                let endpoint = lease.endpoint_id;
                let mut secrets = None;
                let task = match Destination::new(&lease, &self.config, &self.store) {
                    Ok((destination, feed)) => {
                        secrets = feed;
                        let delivery = DeliveryLoop {
                            store: Arc::clone(&self.store),
                            lease: lease.clone(),
                            owner: Arc::clone(&self.owner),
                            config: self.config.clone(),
                            destination: Arc::new(destination),
                            counts: self.metrics.webhook_endpoint(&endpoint.to_string()),
                            commits: self.store.commits(),
                            stopping: stopping.clone(),
                        };
                        tokio::spawn(async move {
                            let panic = AssertUnwindSafe(delivery.run())
                                .catch_unwind()
                                .await
                                .err()?;
                            let reason = panic_message(panic.as_ref());
                            tracing::error!(endpoint, %reason, "delivery to this destination stopped on an internal error; `enable` starts it again");
                            Some(format!(
                                "stopped on an internal error ({reason}); `enable` starts it again"
                            ))
                        })
                    }
                    Err(error) => {
                        tracing::warn!(endpoint, %error, "delivery to this destination cannot start");
                        tokio::spawn(async move {
                            Some(format!("stopped: {error}; `set-url` gives it a usable one"))
                        })
                    }
                };
                running.insert(
                    endpoint,
                    Running {
                        task,
                        started: lease,
                        secrets,
                        stopped: false,
                    },
                );
            }
        }
    }

    /// Shows a delivery stopped on a fault as failing, with why, where it is now.
    async fn record_stop(&self, lease: &Lease, why: String) {
        let report = DeliveryReport {
            cursor: lease.cursor,
            delivered_through: None,
            state: EndpointState::Failing,
            last_error: Some(why),
            next_attempt_at: None,
            stored: Vec::new(),
        };
        if let Err(err) = self
            .store
            .report_delivery(lease, &self.owner, &report)
            .await
        {
            tracing::warn!(endpoint = lease.endpoint_id, error = %err, "cannot save that the delivery stopped");
        }
    }

    /// Sets the pending and state gauges, zeroing those of endpoints gone since last time.
    async fn count_pending(&self, counted: &mut HashSet<i64>) {
        match self.store.list_endpoints().await {
            Ok(endpoints) => {
                let listed: HashSet<i64> = endpoints.iter().map(|endpoint| endpoint.id).collect();
                for removed in counted.difference(&listed) {
                    self.metrics.webhook_pending(&removed.to_string(), 0);
                    self.metrics.webhook_state(&removed.to_string(), None);
                }
                *counted = listed;
                for endpoint in &endpoints {
                    let id = endpoint.id.to_string();
                    self.metrics.webhook_pending(&id, endpoint.pending);
                    self.metrics.webhook_state(&id, Some(endpoint.state));
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot count the pending webhook events");
            }
        }
    }
}

/// One destination's delivery task, the lease it started with (secrets kept current) and
/// where its secrets are fed; dropping it stops the task and cancels its requests.
struct Running {
    /// Ends with why, when it stopped on a fault (a panic, an unusable URL).
    task: JoinHandle<Option<String>>,
    started: Lease,
    secrets: Option<SecretsFeed>,
    /// The task stopped on a fault, already recorded.
    stopped: bool,
}

impl Running {
    /// Why the task stopped on a fault, the first time it is asked after.
    fn take_stop(&mut self) -> Option<String> {
        if self.stopped || !self.task.is_finished() {
            return None;
        }
        let why = (&mut self.task).now_or_never()?.ok().flatten()?;
        self.stopped = true;
        Some(why)
    }

    /// Whether `lease` is the row the task started with: the same endpoint (ids are never
    /// reused), target, event types and generation; a webhook endpoint's secrets aside.
    fn started_as(&self, lease: &Lease) -> bool {
        let started = &self.started;
        started.kind.same_target(&lease.kind)
            && started.events == lease.events
            && started.generation == lease.generation
    }

    /// Hands a webhook endpoint's new secrets to the running task (starting it over would
    /// repeat what it sent since its last save); one signer per secret, not per event.
    fn follow_secrets(&mut self, lease: &Lease) {
        if let (DestinationKind::Webhook(started), DestinationKind::Webhook(now)) =
            (&mut self.started.kind, &lease.kind)
            && started.secrets != now.secrets
            && let Some(feed) = &self.secrets
        {
            started.secrets = now.secrets.clone();
            feed.send_replace(Arc::new(Signer::new(&now.secrets)));
        }
    }
}

/// A panic's message, as `panic!` and `expect` give it.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}
