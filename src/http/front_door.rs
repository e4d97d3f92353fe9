//! The layers of our own that every request passes, outermost first: the front door
//! (request id, span, log line, metrics, and closing connections while draining), then
//! poem's CORS (`cors.rs`), then the answer (the state, the one deadline, and every error
//! as its `Error` body) around the router.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use poem::{
    Endpoint, IntoResponse, PathPattern, Request, Response, Result,
    error::ResponseError,
    http::{HeaderValue, Version, header},
};
use tracing::Instrument;

use super::{
    error::ApiError,
    ops::Probe,
    request_id::{self, RequestId},
    routes::{self, RouteFacts},
};
use crate::{
    state::{AppState, Draining},
    telemetry::{self, Metrics},
};

/// What the front door needs of the service.
pub(super) struct FrontDoor {
    pub(super) metrics: Arc<Metrics>,
    pub(super) draining: Draining,
    pub(super) routes: Arc<RouteFacts>,
}

/// Wraps the whole app, so no response (error, panic, unknown route, preflight) leaves
/// without an `x-request-id` and a log line; every answer is counted in `/metrics`; and
/// while the instance drains, every HTTP/1 answer closes its connection, so keep-alive
/// connections end between requests, never under one.
pub(super) async fn front_door<E: Endpoint<Output = Response>>(
    inner: Arc<E>,
    mut req: Request,
    door: Arc<FrontDoor>,
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
    if let Some(uri) = routes::with_decodable_path(req.uri()) {
        *req.uri_mut() = uri;
    }

    let mut response = inner.call(req).instrument(span.clone()).await?;
    if let Ok(value) = request_id_header {
        response.headers_mut().insert(request_id::HEADER, value);
    }
    if http1 && door.draining.is_on() {
        // hyper reads the header and closes the connection once this answer is sent.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let route = door.routes.label(response.data::<PathPattern>());
    let status = response.status().as_u16();
    door.metrics
        .answered(route, method.as_str(), status, started.elapsed());
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
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

/// What the answer layer needs of the service.
pub(super) struct AnswerContext {
    pub(super) state: AppState,
    pub(super) routes: Arc<RouteFacts>,
    /// `PLANTSTORE_REQUEST_TIMEOUT`.
    pub(super) request_timeout: Duration,
}

/// Hands the request the service's state and its deadline, and turns every error from
/// within (routing, path parsing, auth, handlers, the deadline) into its `Error` answer,
/// once, before poem's CORS layer adds its headers to it.
///
/// Past `PLANTSTORE_REQUEST_TIMEOUT` the request's work is dropped and the answer is a 503.
/// Dropping it withdraws a delete still queued for its batch, and the store bounds every
/// database wait by the same instant (`RequestDeadline`); only a commit already sent when
/// it falls may still land, and then the audit table has it.
pub(super) async fn answer<E: Endpoint>(
    inner: Arc<E>,
    mut req: Request,
    context: Arc<AnswerContext>,
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
    let error = ApiError::from_poem(err, token_sent, &context.routes);
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
