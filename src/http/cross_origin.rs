//! Cross-origin requests: poem's CORS, built once, for the allowed origins and no other.

use std::sync::Arc;

use poem::{
    Endpoint, Middleware, Request, Response, Result,
    error::ResponseError,
    http::{HeaderName, Method, StatusCode, header},
    middleware::{Cors, CorsEndpoint},
};

use super::{error::ApiError, request_id::REQUEST_ID_HEADER};
use crate::config::CorsOrigins;

const PREFLIGHT_MAX_AGE_SECS: i32 = 600;

/// What an allowed origin may do: delete, with the headers the operation reads, and read
/// the headers its answers carry. Origins are checked before this, so it allows any.
fn policy() -> Cors {
    Cors::new()
        .allow_method(Method::DELETE)
        .allow_headers([
            header::AUTHORIZATION,
            // `from_static` takes lower case only.
            HeaderName::from_static("idempotency-key"),
            HeaderName::from_static(REQUEST_ID_HEADER),
            HeaderName::from_static("traceparent"),
            HeaderName::from_static("tracestate"),
        ])
        .expose_headers([
            HeaderName::from_static(REQUEST_ID_HEADER),
            HeaderName::from_static("idempotent-replayed"),
            header::RETRY_AFTER,
        ])
        .max_age(PREFLIGHT_MAX_AGE_SECS)
}

/// Lets the allowed origins call the service. Another origin is answered as if it sent
/// none (no CORS headers, so its browser blocks the page), so that same-origin requests
/// (Swagger UI sends an Origin with its DELETE) and servers forwarding one are served.
pub(super) struct CrossOrigin<E> {
    origins: CorsOrigins,
    plain: Arc<E>,
    with_policy: CorsEndpoint<Arc<E>>,
}

impl<E: Endpoint<Output = Response>> CrossOrigin<E> {
    pub(super) fn new(inner: E, origins: CorsOrigins) -> Self {
        let plain = Arc::new(inner);
        Self {
            origins,
            with_policy: policy().transform(Arc::clone(&plain)),
            plain,
        }
    }
}

impl<E: Endpoint<Output = Response>> Endpoint for CrossOrigin<E> {
    type Output = Response;

    async fn call(&self, req: Request) -> Result<Response> {
        let allowed = req
            .headers()
            .get(header::ORIGIN)
            .and_then(|origin| origin.to_str().ok())
            .is_some_and(|origin| self.origins.allows(origin));
        if !allowed {
            return self.plain.call(req).await;
        }
        let preflight = req.method() == Method::OPTIONS;
        let mut response = match self.with_policy.call(req).await {
            Ok(response) => response,
            // A preflight asking for a method or header the policy does not allow.
            Err(refused) => ApiError::Rejected(refused.status()).as_response(),
        };
        // poem answers a preflight 200 with no body; 204 says so.
        if preflight && response.status() == StatusCode::OK {
            response.set_status(StatusCode::NO_CONTENT);
        }
        Ok(response)
    }
}
