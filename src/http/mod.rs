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

use std::{future::Future, sync::Arc, time::Duration};

use poem::{
    Endpoint, EndpointExt, Response, Route, Server, error::ResponseError, get,
    listener::TcpAcceptor, middleware::CatchPanic,
};

pub use connections::{ClientLimits, head};
pub use document::{DocumentError, Documents, document, yaml};

use crate::{config::CorsOrigins, state::AppState, telemetry::Metrics};
use connections::CappedAcceptor;
use cors::CrossOrigin;
use drain::CloseWhileDraining;
use error::ApiError;
use middleware::{Deadline, ErrorShape, RequestContext};

/// How the public app is laid out, from the server's settings.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// The OpenAPI document's renderings, made once at start.
    pub documents: Documents,
    /// `PLANTSTORE_CORS_ALLOWED_ORIGINS`.
    pub cors: CorsOrigins,
    /// `PLANTSTORE_ADMIN_LISTEN` is set: the ops endpoints are served there, not here.
    pub ops_on_admin_port: bool,
}

/// The whole public HTTP app the binary serves; tests serve this very value.
pub fn build(state: AppState, options: &HttpOptions) -> impl Endpoint<Output = Response> + use<> {
    let deadline = state.request_timeout;
    let mut routes = options.documents.routes();
    if !options.ops_on_admin_port {
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
        options.cors.clone(),
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

/// Serves the public app on `acceptor`, each client connection held to `limits`, until
/// `stop` resolves; requests in flight then have `grace` to finish.
pub(crate) async fn serve(
    acceptor: TcpAcceptor,
    limits: ClientLimits,
    state: AppState,
    options: &HttpOptions,
    stop: impl Future<Output = ()>,
    grace: Duration,
) -> std::io::Result<()> {
    Server::new_with_acceptor(CappedAcceptor::new(acceptor, limits))
        .run_with_graceful_shutdown(build(state, options), stop, Some(grace))
        .await
}

/// Serves the ops endpoints on the admin listener, as `serve` does the public app.
pub(crate) async fn serve_admin(
    acceptor: TcpAcceptor,
    state: AppState,
    stop: impl Future<Output = ()>,
    grace: Duration,
) -> std::io::Result<()> {
    Server::new_with_acceptor(acceptor)
        .run_with_graceful_shutdown(build_admin(state), stop, Some(grace))
        .await
}
