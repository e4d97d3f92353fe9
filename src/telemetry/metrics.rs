//! What `/metrics` shows, in Prometheus text. Each app has its own recorder (none is
//! installed globally), so every instance, and every test, counts only its own requests.
//! Every name is listed in docs/operations.md, which deploy/'s alerts and dashboard use.

use std::{
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use ::metrics::{Counter, Histogram, Key, Label, Level, Metadata, Recorder, SharedString};
use chrono::{DateTime, Utc};
use metrics_exporter_prometheus::{
    BuildError, Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use plantstore_store::{CommitObserver, LogSize, Store, destinations::EndpointState};

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
const WEBHOOK_STATE: &str = "plantstore_webhook_endpoint_state";
const READY: &str = "plantstore_ready";
const DATABASE_REACHABLE: &str = "plantstore_database_reachable";
const DATABASE_HOSTS: &str = "plantstore_database_hosts";
const HOST_CHANGES: &str = "plantstore_database_host_changes_total";
const LOG_ENTRIES: &str = "plantstore_deletion_log_entries";
const LOG_OLDEST_AGE: &str = "plantstore_deletion_log_oldest_entry_age_seconds";
const RETENTION: &str = "plantstore_deletion_retention_seconds";
const REQUEST_TIMEOUT: &str = "plantstore_request_timeout_seconds";
const PRUNED: &str = "plantstore_deletion_log_pruned_total";
/// `oldest_entry_ms` when the log is empty, or not read yet.
const NO_ENTRY: i64 = i64::MIN;
const UPKEEP_EVERY: Duration = Duration::from_secs(1);

static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, None);

/// Delivery attempts to one endpoint by result, and the lag of those delivered: held by the
/// endpoint's delivery, so an attempt under load builds and looks up no labels.
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
    /// When the log's oldest entry was deleted (Unix ms), so its age is as of each scrape.
    oldest_entry_ms: AtomicI64,
    /// CPU, memory, descriptors and threads, named as the Prometheus client libraries do.
    process: metrics_process::Collector,
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
        let described: &[(&str, &str)] = &[
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
            (
                WEBHOOK_STATE,
                "1 for each destination's state (active, failing, disabled), 0 for the others, by endpoint id (read every 5 s)",
            ),
            (
                READY,
                "1 while /readyz would answer 200: the database answers and no shutdown is asked for (checked every 5 s)",
            ),
            (
                DATABASE_REACHABLE,
                "1 while the database answers a ping (checked every 5 s)",
            ),
            (
                DATABASE_HOSTS,
                "Hosts the database URL names (1 for SQLite)",
            ),
            (
                HOST_CHANGES,
                "Times new database connections moved to another host of the URL (a failover) since start",
            ),
            (LOG_ENTRIES, "Entries in the deletion log (read every 60 s)"),
            (
                LOG_OLDEST_AGE,
                "Age of the deletion log's oldest entry, 0 when it is empty (read every 60 s)",
            ),
            (
                RETENTION,
                "PLANTSTORE_DELETION_RETENTION in seconds; 0 when it is off",
            ),
            (
                REQUEST_TIMEOUT,
                "PLANTSTORE_REQUEST_TIMEOUT in seconds: each request's deadline",
            ),
            (
                PRUNED,
                "Deletion log entries pruned to the retention by this instance",
            ),
        ];
        for &(name, help) in described {
            recorder.describe_counter(name.into(), None, help.into());
        }
        let process = metrics_process::Collector::default();
        ::metrics::with_local_recorder(&recorder, || process.describe());
        let handle = recorder.handle();
        let deletions = recorder.register_counter(&Key::from_name(DELETIONS), &METADATA);
        Ok(Self {
            recorder,
            handle,
            deletions,
            oldest_entry_ms: AtomicI64::new(NO_ENTRY),
            process,
        })
    }

    /// The settings the alert rules compare with, set once at start.
    pub fn settings(&self, request_timeout: Duration, retention: Option<Duration>) {
        self.gauge(REQUEST_TIMEOUT)
            .set(request_timeout.as_secs_f64());
        self.gauge(RETENTION)
            .set(retention.map_or(0.0, |kept| kept.as_secs_f64()));
    }

    pub fn pruned(&self, entries: u64) {
        self.recorder
            .register_counter(&Key::from_name(PRUNED), &METADATA)
            .increment(entries);
    }

    pub fn health(&self, ready: bool, database_reachable: bool) {
        self.gauge(READY).set(f64::from(u8::from(ready)));
        self.gauge(DATABASE_REACHABLE)
            .set(f64::from(u8::from(database_reachable)));
    }

    pub fn log_size(&self, size: LogSize) {
        self.gauge(LOG_ENTRIES).set(size.entries as f64);
        let oldest = size.oldest.map_or(NO_ENTRY, |at| at.timestamp_millis());
        self.oldest_entry_ms.store(oldest, Ordering::Relaxed);
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

    /// One destination's state, as the last count read it; `None` for one removed.
    pub fn webhook_state(&self, endpoint: &str, state: Option<EndpointState>) {
        for each in [
            EndpointState::Active,
            EndpointState::Failing,
            EndpointState::Disabled,
        ] {
            let labels = vec![
                Label::new("endpoint", endpoint.to_owned()),
                Label::new("state", each.as_str()),
            ];
            self.recorder
                .register_gauge(&Key::from_parts(WEBHOOK_STATE, labels), &METADATA)
                .set(f64::from(u8::from(state == Some(each))));
        }
    }

    /// Folds histogram samples into their buckets, for ever: the exporter keeps each sample
    /// until then, so its memory would grow with every request between scrapes
    /// (bench/JOURNAL.md, "Figures moved out of code comments").
    pub async fn fold_histograms(self: Arc<Self>) {
        let mut every = tokio::time::interval(UPKEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            self.handle.run_upkeep();
        }
    }

    /// The Prometheus text, with the store's, token cache's and process's figures read now.
    pub fn render(&self, store: &dyn Store, tokens: TokenCacheCounts) -> String {
        let stats = store.stats();
        self.gauge(DATABASE_HOSTS).set(stats.database_hosts as f64);
        self.recorder
            .register_counter(&Key::from_name(HOST_CHANGES), &METADATA)
            .absolute(stats.host_changes);
        self.gauge(LOG_OLDEST_AGE).set(oldest_age(
            self.oldest_entry_ms.load(Ordering::Relaxed),
            Utc::now(),
        ));
        // The crate's own collector, writing into this recorder rather than a global one.
        ::metrics::with_local_recorder(&self.recorder, || self.process.collect());
        let in_use = (stats.pool_size as usize).saturating_sub(stats.pool_idle);
        for (state, count) in [("idle", stats.pool_idle), ("in_use", in_use)] {
            let key = labelled(POOL, "state", state);
            self.recorder
                .register_gauge(&key, &METADATA)
                .set(count as f64);
        }
        self.gauge(QUEUED).set(stats.queued as f64);
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

    fn gauge(&self, name: &'static str) -> ::metrics::Gauge {
        self.recorder
            .register_gauge(&Key::from_name(name), &METADATA)
    }
}

/// Seconds from `oldest_ms` to `now`; 0 for no entry.
fn oldest_age(oldest_ms: i64, now: DateTime<Utc>) -> f64 {
    if oldest_ms == NO_ENTRY {
        return 0.0;
    }
    (now.timestamp_millis().saturating_sub(oldest_ms)).max(0) as f64 / 1000.0
}

#[derive(Debug, Clone, Copy)]
pub struct TokenCacheCounts {
    pub hits: u64,
    pub misses: u64,
    pub reloads: u64,
}

fn labelled(name: &'static str, label: &'static str, value: impl Into<SharedString>) -> Key {
    Key::from_parts(name, vec![Label::new(label, value)])
}

#[derive(Debug)]
struct BatchSizes(Histogram);

impl CommitObserver for BatchSizes {
    fn batch_committed(&self, size: usize) {
        self.0.record(size as f64);
    }
}
