//! Browsers on other origins: poem's `Cors` around the whole app, for the origins
//! `PLANTSTORE_CORS_ALLOWED_ORIGINS` names.

use std::sync::Arc;

use poem::{
    Endpoint, Middleware, Request, Response, Result,
    error::ResponseError,
    http::{HeaderName, Method, StatusCode, header},
    middleware::Cors,
};

use super::{error::ApiError, request_id};
use crate::config::CorsOrigins;

/// How long a browser may cache a preflight's answer.
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
            HeaderName::from_static(request_id::HEADER),
            HeaderName::from_static("traceparent"),
            HeaderName::from_static("tracestate"),
        ])
        .expose_headers([
            HeaderName::from_static(request_id::HEADER),
            HeaderName::from_static("idempotent-replayed"),
            header::RETRY_AFTER,
        ])
        .max_age(PREFLIGHT_MAX_AGE_SECS)
}

/// Lets the allowed origins call the service; every other request passes untouched.
/// Another origin is answered as if it sent none: no CORS headers, so its browser blocks
/// the page, while same-origin requests (Swagger UI sends an Origin with its DELETE) and
/// servers that forward an Origin are served as usual.
pub(super) async fn cross_origin<E: Endpoint<Output = Response>>(
    inner: Arc<E>,
    req: Request,
    origins: Arc<CorsOrigins>,
) -> Result<Response> {
    let allowed = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|origin| origin.to_str().ok())
        .is_some_and(|origin| origins.allows(origin));
    if !allowed {
        return inner.call(req).await;
    }
    let preflight = req.method() == Method::OPTIONS;
    // A browser's request only: the policy's few sets are built for it, not kept.
    let mut response = match policy().transform(inner).call(req).await {
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
