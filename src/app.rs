//! The app factory: routes, shared state and the middleware every response goes through.

use std::sync::Arc;

use plantstore_store::Store;
use poem::{
    Endpoint, EndpointExt, Response, Route, error::ResponseError, get, middleware::CatchPanic,
};

use crate::{api, error::ApiError, middleware::RequestContext, ops, rate_limit::RateLimiter};

/// What every request handler may reach.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub rate_limiter: Option<Arc<RateLimiter>>,
}

/// The whole HTTP app the binary serves; tests serve this very value.
pub fn build(state: AppState) -> impl Endpoint<Output = Response> {
    let api = api::service();
    let routes = Route::new()
        .at("/healthz", get(ops::healthz))
        .at("/readyz", get(ops::readyz))
        .at("/openapi.json", get(api.spec_endpoint()))
        .nest("/docs", api.swagger_ui())
        .nest("/", api);
    with_middleware(routes.data(state))
}

/// The layers every response passes: panics become a 500 `Error`, then the request
/// context adds the request id and maps every other error.
pub fn with_middleware(endpoint: impl Endpoint + 'static) -> impl Endpoint<Output = Response> {
    endpoint
        .with(CatchPanic::new().with_handler(|_| {
            tracing::error!("handler panicked");
            ApiError::Internal.as_response()
        }))
        .with(RequestContext)
}

/// The methods a path answers to, for the `Allow` header of a 405.
pub fn allowed_methods(path: &str) -> &'static str {
    if path.starts_with("/plants/") {
        "DELETE"
    } else {
        "GET"
    }
}
