//! The HTTP layer's front door: the route table, every layer a response passes, and the
//! servers that hold client connections to their limits.

mod bearer;
mod connections;
mod cors;
mod document;
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
use error::ApiError;

/// The whole public HTTP app the binary serves; tests serve this very value. `documents`:
/// the OpenAPI document's renderings, made once at start. With `PLANTSTORE_ADMIN_LISTEN`
/// set, the ops endpoints are served there, not here.
pub fn build(
    state: AppState,
    documents: &Documents,
    config: &ServeConfig,
) -> impl Endpoint<Output = Response> + use<> {
    let mut routes = documents.routes();
    if config.admin_listen.0.is_none() {
        routes = with_ops(routes);
    }
    let routes = routes
        .nest("/", document::service())
        .around(document::root_to_docs);
    layered(routes, state, config.cors_allowed_origins.clone())
}

/// The app of `PLANTSTORE_ADMIN_LISTEN`: the ops endpoints alone, in the same layers.
pub fn build_admin(state: AppState) -> impl Endpoint<Output = Response> {
    layered(with_ops(Route::new()), state, CorsOrigins::Off)
}

fn with_ops(routes: Route) -> Route {
    routes
        .at("/healthz", get(ops::healthz))
        .at("/readyz", get(ops::readyz))
        .at("/metrics", get(ops::metrics))
}

/// `routes` with the state, the request's deadline, every layer of `with_middleware`, and
/// outermost the closing of connections while draining.
fn layered(
    routes: impl Endpoint + 'static,
    state: AppState,
    cors: CorsOrigins,
) -> impl Endpoint<Output = Response> {
    let limit = state.request_timeout;
    let metrics = Arc::clone(&state.metrics);
    let draining = state.draining.clone();
    let routes = routes
        .data(state)
        .around(move |inner, req| middleware::deadline(inner, req, limit));
    with_middleware(routes, metrics, cors)
        .around(move |inner, req| middleware::close_while_draining(inner, req, draining.clone()))
}

/// The layers every response passes: panics become a 500 `Error`, every other error its
/// `Error`; then CORS headers for allowed origins; then the request context adds the
/// request id, the log line and the count.
pub fn with_middleware(
    endpoint: impl Endpoint + 'static,
    metrics: Arc<Metrics>,
    cors: CorsOrigins,
) -> impl Endpoint<Output = Response> {
    let counted = Arc::clone(&metrics);
    endpoint
        .with(CatchPanic::new().with_handler(|_| {
            tracing::error!("handler panicked");
            ApiError::Internal.as_response()
        }))
        .around(move |inner, req| middleware::error_shape(inner, req, Arc::clone(&counted)))
        .with(CrossOrigin(cors))
        .around(move |inner, req| middleware::request_context(inner, req, Arc::clone(&metrics)))
}

/// Serves the public app on `acceptor`, each client connection held to its limits, and
/// with `admin` the ops endpoints there, until `stop()` resolves; requests in flight then
/// have `PLANTSTORE_SHUTDOWN_GRACE` to finish. Only a listener that fails ends it sooner.
pub(crate) async fn serve<Stop: Future<Output = ()>>(
    acceptor: TcpAcceptor,
    admin: Option<TcpAcceptor>,
    state: AppState,
    documents: &Documents,
    config: &ServeConfig,
    stop: impl Fn() -> Stop,
) -> std::io::Result<()> {
    let grace = Some(config.shutdown_grace);
    let public = Server::new_with_acceptor(CappedAcceptor::new(acceptor, config.connections))
        .run_with_graceful_shutdown(build(state.clone(), documents, config), stop(), grace);
    let admin = async {
        let Some(admin) = admin else { return Ok(()) };
        Server::new_with_acceptor(admin)
            .run_with_graceful_shutdown(build_admin(state), stop(), grace)
            .await
    };
    tokio::try_join!(public, admin).map(drop)
}
