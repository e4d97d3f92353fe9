//! Browsers on other origins: poem's `Cors` around the whole app, for the origins
//! `PLANTSTORE_CORS_ALLOWED_ORIGINS` names.

use std::sync::Arc;

use poem::{
    Endpoint, Middleware, Request, Response, Result,
    http::{HeaderName, Method, StatusCode, header},
    middleware::{Cors, CorsEndpoint},
};

use super::request_id;
use crate::config::CorsOrigins;

/// How long a browser may cache a preflight's answer.
const PREFLIGHT_MAX_AGE_SECS: i32 = 600;

/// Lets the allowed origins call the service; every other request passes untouched.
pub(super) struct CrossOrigin(pub CorsOrigins);

impl<E: Endpoint<Output = Response>> Middleware<E> for CrossOrigin {
    type Output = CrossOriginEndpoint<E>;

    fn transform(&self, inner: E) -> Self::Output {
        let inner = Arc::new(inner);
        let cors = (self.0 != CorsOrigins::Off).then(|| policy().transform(Arc::clone(&inner)));
        CrossOriginEndpoint {
            inner,
            cors,
            origins: self.0.clone(),
        }
    }
}

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

pub(super) struct CrossOriginEndpoint<E> {
    inner: Arc<E>,
    cors: Option<CorsEndpoint<Arc<E>>>,
    origins: CorsOrigins,
}

impl<E: Endpoint<Output = Response>> Endpoint for CrossOriginEndpoint<E> {
    type Output = Response;

    async fn call(&self, req: Request) -> Result<Response> {
        let allowed = req
            .headers()
            .get(header::ORIGIN)
            .and_then(|origin| origin.to_str().ok())
            .is_some_and(|origin| self.origins.allows(origin));
        // Another origin is answered as if it sent none: no CORS headers, so its browser
        // blocks the page, while same-origin requests (Swagger UI sends an Origin with
        // its DELETE) and servers that forward an Origin are served as usual.
        let (true, Some(cors)) = (allowed, &self.cors) else {
            return self.inner.call(req).await;
        };
        let preflight = req.method() == Method::OPTIONS;
        let mut response = cors.call(req).await?;
        // poem answers a preflight 200 with no body; 204 says so.
        if preflight && response.status() == StatusCode::OK {
            response.set_status(StatusCode::NO_CONTENT);
        }
        Ok(response)
    }
}
