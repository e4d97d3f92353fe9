//! `plantstore serve`: start the service, say where it listens, stop on a signal.

use super::output::out;
use crate::{
    config::Config,
    startup::{self, Application},
};

/// Serves until Ctrl-C or SIGTERM, after printing the addresses (and the first token).
pub(super) async fn run(config: &Config) -> anyhow::Result<()> {
    // Listening for signals from the start: a SIGTERM while connecting or migrating stops
    // cleanly too (as PID 1 in a container, an unhandled one would be ignored).
    let shutdown = startup::shutdown_signal();
    tokio::pin!(shutdown);
    let app = tokio::select! {
        built = Application::build(config) => built?,
        () = &mut shutdown => return Ok(()),
    };
    let address = app.address();
    let shown_host = if address.ip().is_unspecified() {
        "localhost".to_owned()
    } else {
        address.ip().to_string()
    };
    if let Some(token) = app.initial_token() {
        // One write, so that no log line lands between the two in a merged view.
        out!(
            "Created the first API token, named 'initial'. It is shown only this once; keep it:\n{token}"
        );
    }
    out!(
        "Plant Store listening on http://{shown_host}:{}",
        address.port()
    );
    out!("Swagger UI: http://{shown_host}:{}/docs", address.port());
    if let Some(admin) = app.admin_address() {
        out!("Health checks and metrics on http://{admin}/healthz, /readyz and /metrics");
    }
    app.run_until_stopped(shutdown).await?;
    tracing::info!("stopped");
    Ok(())
}
