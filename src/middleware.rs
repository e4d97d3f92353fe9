//! The outermost layer: request id, one log line per request, and every error as JSON.

use std::time::Instant;

use poem::{
    Endpoint, IntoResponse, Middleware, Request, Response, Result,
    error::ResponseError,
    http::{HeaderValue, header},
};
use tracing::Instrument;

use crate::{
    error::ApiError,
    request_id::{self, RequestId},
    routes,
};

/// Wraps the whole app, so no response (error, panic, unknown route) leaves without the
/// `Error` shape and an `x-request-id`.
pub struct RequestContext;

impl<E: Endpoint> Middleware<E> for RequestContext {
    type Output = RequestContextEndpoint<E>;

    fn transform(&self, inner: E) -> Self::Output {
        RequestContextEndpoint { inner }
    }
}

pub struct RequestContextEndpoint<E> {
    inner: E,
}

impl<E: Endpoint> Endpoint for RequestContextEndpoint<E> {
    type Output = Response;

    async fn call(&self, mut req: Request) -> Result<Self::Output> {
        let started = Instant::now();
        let request_id = RequestId::from_headers(req.headers());
        let token_sent = req.headers().contains_key(header::AUTHORIZATION);
        let allow = routes::allowed_methods(req.uri().path());
        let span = tracing::info_span!(
            "request",
            method = %req.method(),
            path = %req.uri().path(),
            request_id = %request_id,
        );
        req.extensions_mut().insert(request_id.clone());

        let mut response = match self.inner.call(req).instrument(span.clone()).await {
            Ok(output) => output.into_response(),
            Err(err) => ApiError::from_poem(err, token_sent, allow).as_response(),
        };
        if let Ok(value) = HeaderValue::from_str(request_id.as_str()) {
            response.headers_mut().insert(request_id::HEADER, value);
        }
        span.in_scope(|| {
            tracing::info!(
                status = response.status().as_u16(),
                latency_ms = started.elapsed().as_secs_f64() * 1000.0,
                "request finished"
            );
        });
        Ok(response)
    }
}
