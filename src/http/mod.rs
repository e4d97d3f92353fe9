//! The HTTP layer's front door: the route table, every layer a response passes, and the
//! servers that hold client connections to their limits.

mod bearer;
mod connections;
mod cors;
mod document;
mod drain;
mod error;
pub mod idempotency_key;
mod middleware;
mod ops;
mod paths;
mod plants;
mod request_id;

use std::{future::Future, sync::Arc};

use poem::{
    Endpoint, EndpointExt, Response, Route, Server, error::ResponseError, get,
    listener::TcpAcceptor, middleware::CatchPanic,
};

pub use connections::head;
pub use document::{DocumentError, Documents, document, yaml};

use crate::{
    config::{CorsOrigins, ServeConfig},
    state::AppState,
    telemetry::Metrics,
};
use connections::CappedAcceptor;
use cors::CrossOrigin;
use drain::CloseWhileDraining;
use error::ApiError;
use middleware::{Deadline, ErrorShape, RequestContext};

/// The whole public HTTP app the binary serves; tests serve this very value. `documents`:
/// the OpenAPI document's renderings, made once at start. With `PLANTSTORE_ADMIN_LISTEN`
/// set, the ops endpoints are served there, not here.
pub fn build(
    state: AppState,
    documents: &Documents,
    config: &ServeConfig,
) -> impl Endpoint<Output = Response> + use<> {
    let deadline = state.request_timeout;
    let mut routes = documents.routes();
    if config.admin_listen.0.is_none() {
        routes = with_ops(routes);
    }
    let routes = routes
        .nest("/", document::service())
        .around(document::root_to_docs);
    let metrics = Arc::clone(&state.metrics);
    let draining = state.draining.clone();
    with_middleware(
        routes.data(state).with(Deadline(deadline)),
        metrics,
        config.cors_allowed_origins.clone(),
    )
    .with(CloseWhileDraining(draining))
}

/// The app of `PLANTSTORE_ADMIN_LISTEN`: the ops endpoints alone, in the same layers.
pub fn build_admin(state: AppState) -> impl Endpoint<Output = Response> {
    let deadline = state.request_timeout;
    let metrics = Arc::clone(&state.metrics);
    let draining = state.draining.clone();
    with_middleware(
        with_ops(Route::new()).data(state).with(Deadline(deadline)),
        metrics,
        CorsOrigins::Off,
    )
    .with(CloseWhileDraining(draining))
}

fn with_ops(routes: Route) -> Route {
    routes
        .at("/healthz", get(ops::healthz))
        .at("/readyz", get(ops::readyz))
        .at("/metrics", get(ops::metrics))
}

/// The layers every response passes: panics become a 500 `Error`, every other error its
/// `Error`; then CORS headers for allowed origins; then the request context adds the
/// request id, the log line and the count.
pub fn with_middleware(
    endpoint: impl Endpoint + 'static,
    metrics: Arc<Metrics>,
    cors: CorsOrigins,
) -> impl Endpoint<Output = Response> {
    endpoint
        .with(CatchPanic::new().with_handler(|_| {
            tracing::error!("handler panicked");
            ApiError::Internal.as_response()
        }))
        .with(ErrorShape(Arc::clone(&metrics)))
        .with(CrossOrigin(cors))
        .with(RequestContext(metrics))
}

/// Serves the public app on `acceptor`, each client connection held to its limits, until
/// `stop` resolves; requests in flight then have `PLANTSTORE_SHUTDOWN_GRACE` to finish.
pub(crate) async fn serve(
    acceptor: TcpAcceptor,
    state: AppState,
    documents: &Documents,
    config: &ServeConfig,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    Server::new_with_acceptor(CappedAcceptor::new(acceptor, config.connections))
        .run_with_graceful_shutdown(
            build(state, documents, config),
            stop,
            Some(config.shutdown_grace),
        )
        .await
}

/// Serves the ops endpoints on the admin listener, as `serve` does the public app.
pub(crate) async fn serve_admin(
    acceptor: TcpAcceptor,
    state: AppState,
    config: &ServeConfig,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    Server::new_with_acceptor(acceptor)
        .run_with_graceful_shutdown(build_admin(state), stop, Some(config.shutdown_grace))
        .await
}
