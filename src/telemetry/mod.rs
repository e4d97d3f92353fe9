//! What operators are told: logs on stderr, spans over OTLP, and the `/metrics` registry.

mod error_line;
mod metrics;

pub use error_line::one_line;
pub use metrics::{EndpointMetrics, Metrics, TokenCacheCounts};

use std::{
    io::{BufWriter, IsTerminal},
    sync::atomic::{AtomicBool, Ordering},
};

use opentelemetry::{global, trace::TracerProvider as _};
use opentelemetry_http::HeaderExtractor;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use poem::http::HeaderMap;
use tracing::Level;
use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{
    EnvFilter, Layer, filter::Targets, layer::SubscriberExt, util::SubscriberInitExt,
};

use crate::config::LogFormat;

/// Whether spans are exported: only then is a caller's `traceparent` read.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// What must outlive the service: the log writer's thread and the span exporter.
pub struct Telemetry {
    logs: WorkerGuard,
    traces: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends the spans still queued, then flushes the log lines still queued.
    pub fn shutdown(self) {
        if let Some(traces) = self.traces {
            let _ = traces.shutdown();
        }
        drop(self.logs);
    }
}

/// Installs the global subscriber. Logs go to stderr, so stdout holds only what commands
/// print for scripts; a thread of their own writes them, so no request pays a `write`
/// (bench/JOURNAL.md), and a full queue makes logging wait, not drop lines. Our spans go
/// to `otlp_endpoint` whatever `RUST_LOG` says; without one, no OpenTelemetry is installed.
pub fn init(
    filter: &str,
    format: LogFormat,
    otlp_endpoint: Option<&str>,
) -> Result<Telemetry, String> {
    let mut directives = EnvFilter::try_new(filter)
        .map_err(|err| format!("RUST_LOG is not a valid filter: {err}"))?;
    // PostgreSQL's notices ("relation … already exists, skipping" from the migrations each
    // start runs) are no news at info; a filter that names sqlx itself decides.
    if !filter.contains("sqlx") {
        let quiet = "sqlx::postgres::notice=warn"
            .parse()
            .map_err(|err| format!("the notice filter: {err}"))?;
        directives = directives.add_directive(quiet);
    }
    // The NATS client's lines name no destination and repeat with each reconnect; delivery
    // logs the cause (`streams list` shows it). A filter that names async_nats decides.
    if !filter.contains("async_nats") {
        let quiet = "async_nats=off"
            .parse()
            .map_err(|err| format!("the NATS client's filter: {err}"))?;
        directives = directives.add_directive(quiet);
    }
    let (writer, logs) = NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("plantstore-log")
        .finish(BufWriter::new(std::io::stderr()));
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(std::io::stderr().is_terminal());
    let lines = match format {
        LogFormat::Text => lines.boxed(),
        LogFormat::Json => lines
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
    };
    let traces = otlp_endpoint.map(tracer_provider).transpose()?;
    let spans = traces.as_ref().map(|provider| {
        // A prefix: it takes in the store crates (`plantstore_store`, …) too.
        let ours = Targets::new().with_target("plantstore", Level::DEBUG);
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("plantstore"))
            .with_filter(ours)
    });
    tracing_subscriber::registry()
        .with(lines.with_filter(directives))
        .with(spans)
        .try_init()
        .map_err(|err| format!("cannot install the logger: {err}"))?;
    if traces.is_some() {
        global::set_text_map_propagator(TraceContextPropagator::new());
        EXPORTING.store(true, Ordering::Relaxed);
    }
    Ok(Telemetry { logs, traces })
}

fn tracer_provider(endpoint: &str) -> Result<SdkTracerProvider, String> {
    let exporter = SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
        .build()
        .map_err(|err| format!("OTEL_EXPORTER_OTLP_ENDPOINT cannot be used: {err}"))?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name("plantstore").build())
        .build())
}

/// Makes `span` a child of the caller's W3C `traceparent`, when spans are exported.
pub fn follow_caller_trace(span: &tracing::Span, headers: &HeaderMap) {
    if !EXPORTING.load(Ordering::Relaxed) {
        return;
    }
    let parent =
        global::get_text_map_propagator(|propagator| propagator.extract(&HeaderExtractor(headers)));
    let _ = span.set_parent(parent);
}
