//! The outer layers: request id, one log line per request, every error as JSON, the one
//! deadline every request has, and closing connections while draining.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use poem::{
    Endpoint, IntoResponse, Request, Response, Result,
    error::ResponseError,
    http::{HeaderValue, Version, header},
};
use tracing::Instrument;

use super::{
    error::ApiError,
    paths,
    request_id::{self, RequestId},
};
use crate::{
    state::Draining,
    telemetry::{self, Metrics},
};

/// Wraps the whole app, so no response (error, panic, unknown route, preflight) leaves
/// without an `x-request-id` and a log line; and every answer is counted in `/metrics`.
pub(super) async fn request_context<E: Endpoint>(
    inner: Arc<E>,
    mut req: Request,
    metrics: Arc<Metrics>,
) -> Result<Response> {
    let started = Instant::now();
    let request_id = RequestId::from_headers(req.headers());
    let route = paths::template(req.uri().path());
    let method = req.method().clone();
    let span = tracing::info_span!(
        "request",
        method = %req.method(),
        path = %req.uri().path(),
        request_id = %request_id,
    );
    telemetry::follow_caller_trace(&span, req.headers());
    req.extensions_mut().insert(request_id.clone());
    if let Some(uri) = paths::with_decodable_path(req.uri()) {
        *req.uri_mut() = uri;
    }

    // Errors are answered by `error_shape` further in; what still arrives here as one
    // (from a layer between the two) gets the same shape.
    let mut response = error_shape(inner, req, Arc::clone(&metrics))
        .instrument(span.clone())
        .await?;
    if let Ok(value) = HeaderValue::from_str(request_id.as_str()) {
        response.headers_mut().insert(request_id::HEADER, value);
    }
    let status = response.status().as_u16();
    metrics.answered(route, method.as_str(), status, started.elapsed());
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    span.in_scope(|| {
        // A health check every few seconds would bury the requests that matter.
        if paths::is_probe(route) && status < 500 {
            tracing::debug!(status, latency_ms, "request finished");
        } else {
            tracing::info!(status, latency_ms, "request finished");
        }
    });
    Ok(response)
}

/// Turns every error from the app (routing, path parsing, auth, handlers, panics) into
/// its `Error` answer, before the CORS layer adds its headers to it.
pub(super) async fn error_shape<E: Endpoint>(
    inner: Arc<E>,
    req: Request,
    metrics: Arc<Metrics>,
) -> Result<Response> {
    let token_sent = req.headers().contains_key(header::AUTHORIZATION);
    // The methods of the request's path, for a 405's `Allow`.
    let allow = paths::allowed_methods(req.uri().path());
    let error = match inner.call(req).await {
        Ok(output) => return Ok(output.into_response()),
        Err(err) => ApiError::from_poem(err, token_sent, allow),
    };
    if let ApiError::Unauthorized(failure) = error {
        metrics.auth_failed(failure.as_str());
    }
    Ok(error.as_response())
}

/// `PLANTSTORE_REQUEST_TIMEOUT`: past it, the request's work is dropped and the answer is
/// a 503. Dropping it withdraws a delete still queued for its batch, and the store bounds
/// every database wait by the same instant (`RequestDeadline`); only a commit already sent
/// when it falls may still land, and then the audit table has it.
pub(super) async fn deadline<E: Endpoint>(
    inner: Arc<E>,
    mut req: Request,
    limit: Duration,
) -> Result<E::Output> {
    let deadline = RequestDeadline(deadline_after(limit));
    req.extensions_mut().insert(deadline);
    match tokio::time::timeout_at(deadline.0, inner.call(req)).await {
        Ok(answer) => answer,
        Err(_elapsed) => {
            tracing::warn!(
                limit_ms = limit.as_millis() as u64,
                "request deadline passed"
            );
            Err(ApiError::DeadlineExceeded.into())
        }
    }
}

/// Draining before a shutdown: while it lasts, every HTTP/1 answer closes its connection,
/// so keep-alive connections end between requests, never under one.
pub(super) async fn close_while_draining<E: Endpoint>(
    inner: Arc<E>,
    req: Request,
    draining: Draining,
) -> Result<Response> {
    // HTTP/2 has no such header; its connections end with the server's GOAWAY.
    let http1 = req.version() <= Version::HTTP_11;
    let mut response = inner.call(req).await?.into_response();
    if http1 && draining.is_on() {
        // hyper reads the header and closes the connection once this answer is sent.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(response)
}

/// The instant a request is answered 503 unless answered before; handlers read it from the
/// request's extensions and hand it to the store.
#[derive(Debug, Clone, Copy)]
pub(super) struct RequestDeadline(pub tokio::time::Instant);

/// `limit` from now; a limit too large to add is as good as none (a year).
fn deadline_after(limit: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(limit)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}
