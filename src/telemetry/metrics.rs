//! What `/metrics` shows, in Prometheus text: requests by route and status, their latency,
//! deletions, authentication failures by reason, the database pool and queue, group-commit
//! batch sizes and token-cache lookups. Each app has its own recorder (none is installed
//! globally), so every instance, and every test, counts only its own requests.

use std::{sync::Arc, time::Duration};

use ::metrics::{Counter, Histogram, Key, Label, Level, Metadata, Recorder, SharedString};
use metrics_exporter_prometheus::{
    BuildError, Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use plantstore_store::{CommitObserver, Store};

const REQUESTS: &str = "plantstore_http_requests_total";
const LATENCY: &str = "plantstore_http_request_duration_seconds";
const DELETIONS: &str = "plantstore_deletions_total";
const AUTH_FAILURES: &str = "plantstore_auth_failures_total";
const POOL: &str = "plantstore_db_pool_connections";
const QUEUED: &str = "plantstore_delete_queue_waiting";
const BATCH_SIZES: &str = "plantstore_commit_batch_size";
const TOKEN_LOOKUPS: &str = "plantstore_token_cache_lookups_total";
const TOKEN_RELOADS: &str = "plantstore_token_cache_reloads_total";
const WEBHOOK_DELIVERIES: &str = "plantstore_webhook_deliveries_total";
const WEBHOOK_PENDING: &str = "plantstore_webhook_pending_events";
const WEBHOOK_LAG: &str = "plantstore_webhook_delivery_lag_seconds";
/// How often histogram samples are folded into their buckets (see `fold_histograms`).
const UPKEEP_EVERY: Duration = Duration::from_secs(1);

static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, None);

/// Webhook delivery attempts to one endpoint by result, and the lag of those delivered: held
/// by the endpoint's delivery, so that an attempt under load costs no labels built and
/// looked up anew.
pub struct EndpointMetrics {
    delivered: Counter,
    failed: Counter,
    gone: Counter,
    lag: Histogram,
}

impl EndpointMetrics {
    /// `lag`: the time since the event's commit.
    pub fn delivered(&self, lag: Duration) {
        self.delivered.increment(1);
        self.lag.record(lag.as_secs_f64());
    }

    pub fn failed(&self) {
        self.failed.increment(1);
    }

    pub fn gone(&self) {
        self.gone.increment(1);
    }
}

pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    deletions: Counter,
}

impl Metrics {
    pub fn new() -> Result<Self, BuildError> {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full(LATENCY.into()),
                &[
                    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ],
            )?
            .set_buckets_for_metric(
                Matcher::Full(WEBHOOK_LAG.into()),
                &[
                    0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
                ],
            )?
            .set_buckets_for_metric(
                Matcher::Full(BATCH_SIZES.into()),
                &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
            )?
            .build_recorder();
        // Units stay out: the exporter writes them only with unit suffixes on, which would
        // rename every series.
        let described: [(&str, &str); 12] = [
            (
                REQUESTS,
                "HTTP requests answered, by route template, method and status",
            ),
            (
                LATENCY,
                "Time from a request's arrival to its answer, by route template",
            ),
            (
                DELETIONS,
                "Plants deleted (204 answers to DELETE /plants/{id})",
            ),
            (
                AUTH_FAILURES,
                "401 answers, by reason: missing, malformed, unknown, wrong_secret, expired, revoked, bad_signature, not_yet_valid, wrong_claims",
            ),
            (
                POOL,
                "Database connections of this instance's pool, by state (idle, in_use)",
            ),
            (QUEUED, "Deletes waiting for the next group commit"),
            (BATCH_SIZES, "Deletes per group commit"),
            (
                TOKEN_LOOKUPS,
                "Token lookups in the in-memory token table, by result (hit, miss)",
            ),
            (
                TOKEN_RELOADS,
                "Reloads of the in-memory token table from the database",
            ),
            (
                WEBHOOK_DELIVERIES,
                "Webhook delivery attempts made by this instance, by endpoint id and result (delivered, failed, gone)",
            ),
            (
                WEBHOOK_PENDING,
                "Deletion events an endpoint has yet to receive, by endpoint id (read every 5 s)",
            ),
            (
                WEBHOOK_LAG,
                "Time from an event's commit to its receiver's 2xx, by endpoint id",
            ),
        ];
        for (name, help) in described {
            recorder.describe_counter(name.into(), None, help.into());
        }
        let handle = recorder.handle();
        let deletions = recorder.register_counter(&Key::from_name(DELETIONS), &METADATA);
        Ok(Self {
            recorder,
            handle,
            deletions,
        })
    }

    /// What the store tells each group-commit batch's size.
    pub fn batch_sizes(&self) -> Arc<dyn CommitObserver> {
        Arc::new(BatchSizes(
            self.recorder
                .register_histogram(&Key::from_name(BATCH_SIZES), &METADATA),
        ))
    }

    pub fn answered(&self, route: Arc<str>, method: &str, status: u16, took: Duration) {
        let labels = [
            Label::new("route", SharedString::from(Arc::clone(&route))),
            Label::new("method", SharedString::from(method.to_owned())),
            Label::new("status", SharedString::from(status.to_string())),
        ];
        self.recorder
            .register_counter(&Key::from_parts(REQUESTS, labels.to_vec()), &METADATA)
            .increment(1);
        self.recorder
            .register_histogram(&labelled(LATENCY, "route", route), &METADATA)
            .record(took.as_secs_f64());
    }

    pub fn deleted(&self) {
        self.deletions.increment(1);
    }

    pub fn auth_failed(&self, reason: &'static str) {
        let key = labelled(AUTH_FAILURES, "reason", reason);
        self.recorder.register_counter(&key, &METADATA).increment(1);
    }

    /// One endpoint's delivery series, registered once for the life of its delivery.
    pub fn webhook_endpoint(&self, endpoint: &str) -> EndpointMetrics {
        let endpoint = SharedString::from(endpoint.to_owned());
        let attempts = |result: &'static str| {
            let labels = vec![
                Label::new("endpoint", endpoint.clone()),
                Label::new("result", result),
            ];
            let key = Key::from_parts(WEBHOOK_DELIVERIES, labels);
            self.recorder.register_counter(&key, &METADATA)
        };
        let lag = labelled(WEBHOOK_LAG, "endpoint", endpoint.clone());
        EndpointMetrics {
            delivered: attempts("delivered"),
            failed: attempts("failed"),
            gone: attempts("gone"),
            lag: self.recorder.register_histogram(&lag, &METADATA),
        }
    }

    pub fn webhook_pending(&self, endpoint: &str, pending: i64) {
        let key = labelled(WEBHOOK_PENDING, "endpoint", endpoint.to_owned());
        self.recorder
            .register_gauge(&key, &METADATA)
            .set(pending as f64);
    }

    /// Folds the histogram samples recorded since the last time into their buckets, for
    /// ever. The exporter keeps every sample until then, so without this its memory grows
    /// with every request between scrapes (bench/RESULTS.md, "Figures moved out of code
    /// comments").
    pub async fn fold_histograms(self: Arc<Self>) {
        let mut every = tokio::time::interval(UPKEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            self.handle.run_upkeep();
        }
    }

    /// The Prometheus text, with the pool, the queue and the token cache's counts read now.
    pub fn render(&self, store: &dyn Store, tokens: TokenCacheCounts) -> String {
        let stats = store.stats();
        let in_use = (stats.pool_size as usize).saturating_sub(stats.pool_idle);
        for (state, count) in [("idle", stats.pool_idle), ("in_use", in_use)] {
            let key = labelled(POOL, "state", state);
            self.recorder
                .register_gauge(&key, &METADATA)
                .set(count as f64);
        }
        self.recorder
            .register_gauge(&Key::from_name(QUEUED), &METADATA)
            .set(stats.queued as f64);
        for (result, count) in [("hit", tokens.hits), ("miss", tokens.misses)] {
            let key = labelled(TOKEN_LOOKUPS, "result", result);
            self.recorder
                .register_counter(&key, &METADATA)
                .absolute(count);
        }
        self.recorder
            .register_counter(&Key::from_name(TOKEN_RELOADS), &METADATA)
            .absolute(tokens.reloads);
        self.handle.render()
    }
}

/// The token cache's lookups and reloads since start, as `render` shows them.
#[derive(Debug, Clone, Copy)]
pub struct TokenCacheCounts {
    pub hits: u64,
    pub misses: u64,
    pub reloads: u64,
}

fn labelled(name: &'static str, label: &'static str, value: impl Into<SharedString>) -> Key {
    Key::from_parts(name, vec![Label::new(label, value)])
}

/// The store's group commits, as a histogram of their sizes.
#[derive(Debug)]
struct BatchSizes(Histogram);

impl CommitObserver for BatchSizes {
    fn batch_committed(&self, size: usize) {
        self.0.record(size as f64);
    }
}
