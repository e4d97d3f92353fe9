//! The app factory: routes, shared state and the middleware every response goes through.

use std::sync::Arc;

use poem::{
    Endpoint, EndpointExt, Response, Route, error::ResponseError, get, middleware::CatchPanic,
};

use crate::{
    api,
    config::CorsOrigins,
    cors::CrossOrigin,
    error::ApiError,
    metrics::Metrics,
    middleware::{Deadline, ErrorShape, RequestContext},
    ops,
    state::AppState,
};

/// How the public app is laid out, from the server's settings.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// `PLANTSTORE_CORS_ALLOWED_ORIGINS`.
    pub cors: CorsOrigins,
    /// `PLANTSTORE_ADMIN_LISTEN` is set: the ops endpoints are served there, not here.
    pub ops_on_admin_port: bool,
}

/// The whole public HTTP app the binary serves; tests serve this very value.
pub fn build(state: AppState, options: &HttpOptions) -> impl Endpoint<Output = Response> + use<> {
    let deadline = state.request_timeout;
    let mut routes = api::document_routes();
    if !options.ops_on_admin_port {
        routes = with_ops(routes);
    }
    let routes = routes.nest("/", api::service()).around(api::root_to_docs);
    let metrics = Arc::clone(&state.metrics);
    with_middleware(
        routes.data(state).with(Deadline(deadline)),
        metrics,
        options.cors.clone(),
    )
}

/// The app of `PLANTSTORE_ADMIN_LISTEN`: the ops endpoints alone, in the same layers.
pub fn build_admin(state: AppState) -> impl Endpoint<Output = Response> {
    let deadline = state.request_timeout;
    let metrics = Arc::clone(&state.metrics);
    with_middleware(
        with_ops(Route::new()).data(state).with(Deadline(deadline)),
        metrics,
        CorsOrigins::Off,
    )
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
