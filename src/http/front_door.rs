//! The layers of our own that every request passes, outermost first: the front door
//! (request id, span, log line, metrics under the route's label, and closing connections
//! while draining), then poem's CORS for the origins `PLANTSTORE_CORS_ALLOWED_ORIGINS`
//! names, then the answer (the state, the one deadline, and every error sorted into an
//! `ApiError`, once) around the router. A request head refused below hyper is answered
//! here too, with the same `Error`, as bytes.

use std::{
    fmt,
    sync::Arc,
    time::{Duration, Instant},
};

use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use poem::{
    Endpoint, IntoResponse, Middleware, PathPattern, Request, Response, Result,
    error::{MethodNotAllowedError, NotFoundError, ResponseError},
    http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, Version, header},
    middleware::{Cors, CorsEndpoint},
};
use poem_openapi::error::{AuthorizationError, ParsePathError};
use serde_json::Value;
use tracing::Instrument;

use super::{error::ApiError, idempotency_key::InvalidKey, ops::Probe};
use crate::{
    auth::AuthFailure,
    config::CorsOrigins,
    connection_limits::{self, HeadRefusal},
    state::AppState,
    telemetry,
};

/// What the layers need of the service.
pub(super) struct LayerContext {
    pub(super) state: AppState,
    pub(super) routes: Arc<RouteFacts>,
    /// `PLANTSTORE_REQUEST_TIMEOUT`.
    pub(super) request_timeout: Duration,
}

/// Wraps the whole app, so no response (error, panic, unknown route, preflight) leaves
/// without an `x-request-id` and a log line; every answer is counted in `/metrics`; and
/// while the instance drains, every HTTP/1 answer closes its connection, so keep-alive
/// connections end between requests, never under one.
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

/// A duration in milliseconds to the microsecond, for log fields: a whole number of
/// microseconds divided prints as itself (0.312), where seconds times 1000 carries the
/// float's noise (0.31244900000000003).
fn millis(elapsed: Duration) -> f64 {
    elapsed.as_micros() as f64 / 1000.0
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

/// The request id each request carries, and each answer: the caller's when it is sane,
/// else a new one.
pub(super) const REQUEST_ID_HEADER: &str = "x-request-id";
const REQUEST_ID_MAX_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RequestId(String);

impl RequestId {
    /// Keeps the caller's id only when it is short and plain, so it is safe to echo in a
    /// header, to log and to store in the audit table.
    pub(super) fn from_headers(headers: &HeaderMap) -> Self {
        headers
            .get(REQUEST_ID_HEADER)
            .and_then(|value| value.to_str().ok())
            .filter(|id| is_sane_request_id(id))
            .map(|id| Self(id.to_owned()))
            .unwrap_or_else(Self::generate)
    }

    /// A new random id, for a request that brought none.
    pub(super) fn generate() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }

    pub(super) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn is_sane_request_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= REQUEST_ID_MAX_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// How long a browser on an allowed origin may cache a preflight's answer.
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

/// Lets the allowed origins call the service; every other request passes untouched.
/// Another origin is answered as if it sent none: no CORS headers, so its browser blocks
/// the page, while same-origin requests (Swagger UI sends an Origin with its DELETE) and
/// servers that forward an Origin are served as usual. The policy's endpoint is built
/// once, with the app, not per browser request.
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

/// An error from any layer (routing, path parsing, auth, handlers) sorted by its type into ours.
/// `token_sent` describes the request and `routes` the route it matched, for the
/// headers the answer needs.
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

/// A request head the connection limits refused: the same answer as the error's response,
/// as HTTP/1.1 bytes written straight to the client connection from below hyper, which is
/// closed after it.
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

/// The routes the OpenAPI document declares, each with the methods it answers. The other
/// routes (the document's renderings, the ops endpoints) have fixed paths and answer GET.
#[derive(Debug, Clone)]
pub(super) struct RouteFacts {
    documented: Vec<DocumentedRoute>,
    /// The label of a request no route matched: a fixed one, so a client cannot make new
    /// metric series by inventing paths. Made once, as `get_only` is, rather than per answer.
    unmatched: Arc<str>,
    /// The `Allow` of every route the document does not declare.
    get_only: Arc<str>,
}

/// No documented routes: a route table of a test's own.
impl Default for RouteFacts {
    fn default() -> Self {
        Self::from_document(&Value::Null)
    }
}

#[derive(Debug, Clone)]
struct DocumentedRoute {
    /// As the document spells it: `/plants/{id}`.
    path: Arc<str>,
    /// For a 405's `Allow`: `DELETE`.
    methods: Arc<str>,
}

impl RouteFacts {
    /// Read from the document's `paths`, so a new operation brings its own facts.
    pub(super) fn from_document(document: &Value) -> Self {
        let paths = document["paths"].as_object().into_iter().flatten();
        let documented = paths
            .map(|(path, operations)| {
                let methods: Vec<String> = operations
                    .as_object()
                    .into_iter()
                    .flat_map(|operations| operations.keys())
                    .map(|method| method.to_ascii_uppercase())
                    .collect();
                DocumentedRoute {
                    path: path.as_str().into(),
                    methods: methods.join(", ").into(),
                }
            })
            .collect();
        Self {
            documented,
            unmatched: "other".into(),
            get_only: "GET".into(),
        }
    }

    /// The route's label in the log line and `/metrics`: the document's spelling of a
    /// documented route (poem-openapi mounts `/plants/{id}` as `/plants/:param0`), the
    /// router's pattern of another, and `other` when no route matched.
    pub(super) fn label(&self, pattern: Option<&PathPattern>) -> Arc<str> {
        let Some(PathPattern(pattern)) = pattern else {
            return Arc::clone(&self.unmatched);
        };
        match self.documented(pattern) {
            Some(route) => Arc::clone(&route.path),
            None => Arc::clone(pattern),
        }
    }

    /// The methods of the route poem matched, for the `Allow` header of a 405.
    pub(super) fn allowed_methods(&self, pattern: Option<&PathPattern>) -> Arc<str> {
        pattern
            .and_then(|PathPattern(pattern)| self.documented(pattern))
            .map_or(&self.get_only, |route| &route.methods)
            .clone()
    }

    fn documented(&self, pattern: &str) -> Option<&DocumentedRoute> {
        self.documented
            .iter()
            .find(|route| same_route(pattern, &route.path))
    }
}

/// Whether poem's `pattern` and the document's `path` name one route: the same literal
/// segments, and a parameter (`:param0`, `{id}`) wherever the other has one.
fn same_route(pattern: &str, path: &str) -> bool {
    let is_parameter = |segment: &str| segment.starts_with(':') || segment.starts_with('{');
    pattern.split('/').count() == path.split('/').count()
        && pattern
            .split('/')
            .zip(path.split('/'))
            .all(|(ours, theirs)| ours == theirs || (is_parameter(ours) && is_parameter(theirs)))
}

/// The request's URI with every path segment that does not percent-decode to UTF-8
/// replaced by its lossy decoding, encoded again; `None` when every segment decodes.
/// poem's router answers such a path with a bare 400 before any route, and so before
/// authentication; this way a bad segment reaches the route it was sent to, and an
/// anonymous caller still gets 401 and an unknown path 404.
pub(super) fn with_decodable_path(uri: &Uri) -> Option<Uri> {
    let path = uri.path();
    if !path.contains('%') || decodes(path) {
        return None;
    }
    let fixed: Vec<String> = path
        .split('/')
        .map(|segment| {
            if decodes(segment) {
                segment.to_owned()
            } else {
                let bytes: Vec<u8> = percent_decode_str(segment).collect();
                utf8_percent_encode(&String::from_utf8_lossy(&bytes), NON_ALPHANUMERIC).to_string()
            }
        })
        .collect();
    let mut fixed = fixed.join("/");
    if let Some(query) = uri.query() {
        fixed = format!("{fixed}?{query}");
    }
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(fixed.parse().ok()?);
    Uri::from_parts(parts).ok()
}

fn decodes(text: &str) -> bool {
    percent_decode_str(text).decode_utf8().is_ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_latency_is_logged_without_float_noise() {
        assert_eq!(
            millis(Duration::from_nanos(312_449_000)).to_string(),
            "312.449"
        );
        assert_eq!(millis(Duration::from_nanos(312_449)).to_string(), "0.312");
    }

    use super::*;

    fn from(value: &str) -> RequestId {
        let mut headers = HeaderMap::new();
        headers.insert(
            REQUEST_ID_HEADER,
            HeaderValue::from_str(value).expect("header value"),
        );
        RequestId::from_headers(&headers)
    }

    #[test]
    fn keeps_a_sane_id_and_replaces_others() {
        assert_eq!(from("abc-123_x.y:z").as_str(), "abc-123_x.y:z");
        assert_ne!(from("has space").as_str(), "has space");
        assert_ne!(
            from(&"a".repeat(REQUEST_ID_MAX_LEN + 1)).as_str().len(),
            REQUEST_ID_MAX_LEN + 1
        );
        assert_eq!(from("").as_str().len(), 36);
    }

    #[test]
    fn a_documented_route_is_labelled_and_answers_as_the_document_says() {
        let facts = RouteFacts::from_document(&serde_json::json!({
            "paths": {"/plants/{id}": {"delete": {}}}
        }));
        let matched = |pattern: &str| PathPattern(pattern.into());
        assert_eq!(
            &*facts.label(Some(&matched("/plants/:param0"))),
            "/plants/{id}"
        );
        assert_eq!(
            &*facts.allowed_methods(Some(&matched("/plants/:param0"))),
            "DELETE"
        );
        assert_eq!(&*facts.label(Some(&matched("/healthz"))), "/healthz");
        assert_eq!(&*facts.allowed_methods(Some(&matched("/healthz"))), "GET");
        assert_eq!(
            &*facts.label(Some(&matched("/plants/:param0/x"))),
            "/plants/:param0/x"
        );
        assert_eq!(&*facts.label(None), "other");
    }

    fn fixed(uri: &str) -> Option<String> {
        with_decodable_path(&uri.parse().expect("a URI")).map(|uri| uri.to_string())
    }

    #[test]
    fn only_undecodable_segments_change() {
        assert_eq!(fixed("/plants/1"), None);
        assert_eq!(fixed("/plants/%E2%82%AC"), None);
        assert_eq!(
            fixed("/plants/%D7?x=%D7"),
            Some("/plants/%EF%BF%BD?x=%D7".into())
        );
        assert_eq!(fixed("/plants/%2F%D7"), Some("/plants/%2F%EF%BF%BD".into()));
        assert_eq!(fixed("/x%FF/1"), Some("/x%EF%BF%BD/1".into()));
    }
}
