//! The app factory: routes, shared state and the middleware every response goes through.

use std::sync::Arc;

use poem::{Endpoint, EndpointExt, Response, error::ResponseError, get, middleware::CatchPanic};

use crate::{
    api,
    error::ApiError,
    metrics::Metrics,
    middleware::{Deadline, RequestContext},
    ops,
    state::AppState,
};

/// The whole HTTP app the binary serves; tests serve this very value.
pub fn build(state: AppState) -> impl Endpoint<Output = Response> {
    let deadline = state.request_timeout;
    let routes = api::document_routes()
        .at("/healthz", get(ops::healthz))
        .at("/readyz", get(ops::readyz))
        .at("/metrics", get(ops::metrics))
        .nest("/", api::service())
        .around(api::root_to_docs);
    let metrics = Arc::clone(&state.metrics);
    with_middleware(routes.data(state).with(Deadline(deadline)), metrics)
}

/// The layers every response passes: panics become a 500 `Error`, then the request
/// context adds the request id and maps every other error.
pub fn with_middleware(
    endpoint: impl Endpoint + 'static,
    metrics: Arc<Metrics>,
) -> impl Endpoint<Output = Response> {
    endpoint
        .with(CatchPanic::new().with_handler(|_| {
            tracing::error!("handler panicked");
            ApiError::Internal.as_response()
        }))
        .with(RequestContext(metrics))
}
