//! Log setup: human-readable or JSON lines on stderr, filtered by `RUST_LOG`.

use std::io::{BufWriter, IsTerminal};

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber. Logs go to stderr so stdout carries only what a
/// command prints for scripts (such as a new token).
///
/// Lines are written by a thread of their own, buffered while more are waiting and
/// flushed as soon as none are: under load a request no longer pays a `write` to stderr
/// for its log line (one syscall per line was about 5% of the service's CPU in perf). No
/// line is dropped: when the queue is full, logging waits. Drop the returned guard
/// before exiting, to flush what is left.
pub fn init(filter: &str, format: LogFormat) -> Result<WorkerGuard, String> {
    let filter = EnvFilter::try_new(filter)
        .map_err(|err| format!("RUST_LOG is not a valid filter: {err}"))?;
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("plantstore-log")
        .finish(BufWriter::new(std::io::stderr()));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::stderr().is_terminal());
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    installed.map_err(|err| format!("cannot install the logger: {err}"))?;
    Ok(guard)
}
