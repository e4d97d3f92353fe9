//! Log setup: human-readable or JSON lines on stderr, filtered by `RUST_LOG`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber. Logs go to stderr so stdout carries only what a
/// command prints for scripts (such as a new token).
pub fn init(filter: &str, format: LogFormat) -> Result<(), String> {
    let filter = EnvFilter::try_new(filter)
        .map_err(|err| format!("RUST_LOG is not a valid filter: {err}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    installed.map_err(|err| format!("cannot install the logger: {err}"))
}
