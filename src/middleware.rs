//! The outer layers: request id, one log line per request, every error as JSON, and
//! the one deadline every request has.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use poem::{
    Endpoint, IntoResponse, Middleware, Request, Response, Result,
    error::ResponseError,
    http::{HeaderValue, header},
};
use tracing::Instrument;

use crate::{
    error::ApiError,
    metrics::Metrics,
    request_id::{self, RequestId},
    routes, telemetry,
};

/// Wraps the whole app, so no response (error, panic, unknown route) leaves without the
/// `Error` shape and an `x-request-id`; and every answer is counted in `/metrics`.
pub struct RequestContext(pub Arc<Metrics>);

impl<E: Endpoint> Middleware<E> for RequestContext {
    type Output = RequestContextEndpoint<E>;

    fn transform(&self, inner: E) -> Self::Output {
        RequestContextEndpoint {
            inner,
            metrics: Arc::clone(&self.0),
        }
    }
}

pub struct RequestContextEndpoint<E> {
    inner: E,
    metrics: Arc<Metrics>,
}

impl<E: Endpoint> Endpoint for RequestContextEndpoint<E> {
    type Output = Response;

    async fn call(&self, mut req: Request) -> Result<Self::Output> {
        let started = Instant::now();
        let request_id = RequestId::from_headers(req.headers());
        let token_sent = req.headers().contains_key(header::AUTHORIZATION);
        let allow = routes::allowed_methods(req.uri().path());
        let route = routes::template(req.uri().path());
        let method = req.method().clone();
        let span = tracing::info_span!(
            "request",
            method = %req.method(),
            path = %req.uri().path(),
            request_id = %request_id,
        );
        telemetry::follow_caller_trace(&span, req.headers());
        req.extensions_mut().insert(request_id.clone());
        if let Some(uri) = routes::with_decodable_path(req.uri()) {
            *req.uri_mut() = uri;
        }

        let mut response = match self.inner.call(req).instrument(span.clone()).await {
            Ok(output) => output.into_response(),
            Err(err) => {
                let error = ApiError::from_poem(err, token_sent, allow);
                if let ApiError::Unauthorized(failure) = error {
                    self.metrics.auth_failed(failure.as_str());
                }
                error.as_response()
            }
        };
        if let Ok(value) = HeaderValue::from_str(request_id.as_str()) {
            response.headers_mut().insert(request_id::HEADER, value);
        }
        self.metrics.answered(
            route,
            method.as_str(),
            response.status().as_u16(),
            started.elapsed(),
        );
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

/// `PLANTSTORE_REQUEST_TIMEOUT`: past it, the request's work is dropped and the answer is
/// a 503. Dropping it withdraws a delete still queued for its batch; one already in a
/// commit may still be committed, and then the audit table has it.
pub struct Deadline(pub Duration);

impl<E: Endpoint> Middleware<E> for Deadline {
    type Output = DeadlineEndpoint<E>;

    fn transform(&self, inner: E) -> Self::Output {
        DeadlineEndpoint {
            inner,
            limit: self.0,
        }
    }
}

pub struct DeadlineEndpoint<E> {
    inner: E,
    limit: Duration,
}

impl<E: Endpoint> Endpoint for DeadlineEndpoint<E> {
    type Output = E::Output;

    async fn call(&self, req: Request) -> Result<Self::Output> {
        match tokio::time::timeout(self.limit, self.inner.call(req)).await {
            Ok(answer) => answer,
            Err(_elapsed) => {
                tracing::warn!(
                    limit_ms = self.limit.as_millis() as u64,
                    "request deadline passed"
                );
                Err(ApiError::DeadlineExceeded.into())
            }
        }
    }
}
