//! Our own layers, outermost first: the front door (request id, span, log line, metrics,
//! closing connections while draining), CORS, then the answer (state, deadline, each error
//! sorted once into an `ApiError`); and the answer to a head refused below hyper, as bytes.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use poem::{
    Endpoint, IntoResponse, PathPattern, Request, Response, Result,
    error::{MethodNotAllowedError, NotFoundError, ResponseError},
    http::{HeaderValue, Version, header},
};
use poem_openapi::error::{AuthorizationError, ParsePathError};
use tracing::Instrument;

use super::{
    error::ApiError,
    idempotency_key::InvalidKey,
    ops::Probe,
    request_id::{REQUEST_ID_HEADER, RequestId},
    routes::{RouteFacts, with_decodable_path},
};
use crate::{
    auth::AuthFailure,
    connection_limits::{self, HeadRefusal},
    state::AppState,
    telemetry,
};

pub(super) struct LayerContext {
    pub(super) state: AppState,
    pub(super) routes: Arc<RouteFacts>,
    pub(super) request_timeout: Duration,
}

/// Wraps the whole app, so no response (error, panic, unknown route, preflight) leaves
/// without an `x-request-id`, a log line and a count; while draining, HTTP/1 answers close
/// their connection, so keep-alive connections end between requests, never under one.
pub(super) async fn front_door<E: Endpoint<Output = Response>>(
    inner: Arc<E>,
    mut req: Request,
    context: Arc<LayerContext>,
) -> Result<Response> {
    let started = Instant::now();
    let request_id = RequestId::from_headers(req.headers());
    let method = req.method().clone();
    // HTTP/2 has no `Connection` header; its connections end with the server's GOAWAY.
    let http1 = req.version() <= Version::HTTP_11;
    let span = tracing::info_span!(
        "request",
        method = %req.method(),
        path = %req.uri().path(),
        request_id = %request_id,
    );
    telemetry::follow_caller_trace(&span, req.headers());
    let request_id_header = HeaderValue::from_str(request_id.as_str());
    req.extensions_mut().insert(request_id);
    if let Some(uri) = with_decodable_path(req.uri()) {
        *req.uri_mut() = uri;
    }

    let mut response = inner.call(req).instrument(span.clone()).await?;
    if let Ok(value) = request_id_header {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    if http1 && context.state.draining.is_on() {
        // hyper reads the header and closes the connection once this answer is sent.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let route = context.routes.label(response.data::<PathPattern>());
    let status = response.status().as_u16();
    let metrics = &context.state.metrics;
    metrics.answered(route, method.as_str(), status, started.elapsed());
    let latency_ms = millis(started.elapsed());
    span.in_scope(|| {
        // A health check every few seconds would bury the requests that matter.
        if response.data::<Probe>().is_some() && status < 500 {
            tracing::debug!(status, latency_ms, "request finished");
        } else {
            tracing::info!(status, latency_ms, "request finished");
        }
    });
    Ok(response)
}

/// Milliseconds to the microsecond for log fields: whole microseconds divided print as
/// themselves (0.312), where seconds times 1000 carry float noise (0.31244900000000003).
fn millis(elapsed: Duration) -> f64 {
    elapsed.as_micros() as f64 / 1000.0
}

/// Hands the request the state and its deadline, and turns every error from within into its
/// `Error` answer once, before poem's CORS layer adds its headers. Past the deadline the
/// work is dropped (withdrawing a delete still queued) and the answer is a 503.
pub(super) async fn answer<E: Endpoint>(
    inner: Arc<E>,
    mut req: Request,
    context: Arc<LayerContext>,
) -> Result<Response> {
    let token_sent = req.headers().contains_key(header::AUTHORIZATION);
    let limit = context.request_timeout;
    let deadline = RequestDeadline(deadline_after(limit));
    req.extensions_mut().insert(deadline);
    req.extensions_mut().insert(context.state.clone());
    let err = match tokio::time::timeout_at(deadline.0, inner.call(req)).await {
        Ok(Ok(output)) => return Ok(output.into_response()),
        Ok(Err(err)) => err,
        Err(_elapsed) => {
            tracing::warn!(
                limit_ms = limit.as_millis() as u64,
                "request deadline passed"
            );
            ApiError::DeadlineExceeded.into()
        }
    };
    // The marks the router and the ops endpoints left on the error, for the front door.
    let pattern = err.data::<PathPattern>().cloned();
    let probe = err.data::<Probe>().is_some();
    let error = sorted(err, token_sent, &context.routes);
    if let ApiError::Unauthorized(failure) = error {
        context.state.metrics.auth_failed(failure.as_str());
    }
    let mut response = error.as_response();
    // No route matched, though a nest on the way (the document's at `/`) left its prefix.
    if let Some(pattern) = pattern.filter(|_| !matches!(error, ApiError::RouteNotFound)) {
        response.set_data(pattern);
    }
    if probe {
        response.set_data(Probe);
    }
    Ok(response)
}

/// The instant a request is answered 503; handlers hand it on from extensions to the store.
#[derive(Debug, Clone, Copy)]
pub(super) struct RequestDeadline(pub tokio::time::Instant);

/// `limit` from now; a limit too large to add is as good as none (a year).
fn deadline_after(limit: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(limit)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

fn sorted(err: poem::Error, token_sent: bool, routes: &RouteFacts) -> ApiError {
    let err = match err.downcast::<ApiError>() {
        Ok(ours) => return ours,
        Err(other) => other,
    };
    if err.is::<ParsePathError>() {
        ApiError::InvalidPlantId
    } else if err.is::<InvalidKey>() {
        ApiError::InvalidIdempotencyKey(InvalidKey)
    } else if err.is::<AuthorizationError>() {
        // poem-openapi found no `Bearer <token>` in the header.
        ApiError::Unauthorized(if token_sent {
            AuthFailure::Malformed
        } else {
            AuthFailure::Missing
        })
    } else if err.is::<NotFoundError>() {
        ApiError::RouteNotFound
    } else if err.is::<MethodNotAllowedError>() {
        ApiError::MethodNotAllowed {
            allow: routes.allowed_methods(err.data::<PathPattern>()),
        }
    } else if err.status().is_server_error() {
        tracing::error!(error = %err, "unexpected error");
        ApiError::Internal
    } else {
        ApiError::Rejected(err.status())
    }
}

/// A refused head's answer as HTTP/1.1 bytes, written from below hyper before it closes.
pub(super) fn refused_head_answer(refusal: HeadRefusal) -> Vec<u8> {
    let error = match refusal {
        HeadRefusal::TooSlow => ApiError::HeaderTimeout,
        HeadRefusal::UriTooLong => ApiError::UriTooLong {
            max_bytes: connection_limits::head::MAX_HEAD_BYTES,
        },
        HeadRefusal::TooLarge => ApiError::HeadTooLarge {
            max_bytes: connection_limits::head::MAX_HEAD_BYTES,
            max_lines: connection_limits::head::MAX_HEADER_LINES,
        },
    };
    let request_id = RequestId::generate();
    tracing::warn!(%request_id, status = error.status().as_u16(), "request head refused: {error}");
    let response = error.as_response();
    let body = serde_json::to_vec(&error.body()).unwrap_or_default();
    let mut out = format!("HTTP/1.1 {}\r\n", response.status()).into_bytes();
    for (name, value) in response.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let rest = format!(
        "{}: {request_id}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        REQUEST_ID_HEADER,
        body.len()
    );
    out.extend_from_slice(rest.as_bytes());
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_latency_is_logged_without_float_noise() {
        assert_eq!(
            millis(Duration::from_nanos(312_449_000)).to_string(),
            "312.449"
        );
        assert_eq!(millis(Duration::from_nanos(312_449)).to_string(), "0.312");
    }
}
