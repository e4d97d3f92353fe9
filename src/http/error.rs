//! The service's one HTTP error type, and the only place errors become responses: each
//! variant's status, message and header stand together in `ApiError::answer`.

use plantstore_store::StoreError;
use poem::{
    Response,
    error::{MethodNotAllowedError, NotFoundError, ResponseError},
    http::{HeaderName, HeaderValue, StatusCode},
};
use poem_openapi::{
    ApiResponse, Object,
    error::{AuthorizationError, ParsePathError},
    registry::{MetaHeader, MetaMediaType, MetaResponse, MetaResponses, Registry},
    types::Type,
};

use super::{idempotency_key, request_id};
use crate::auth::{AuthFailure, rate_limit::RateLimited};

/// What the service answers to a client's mistake or its own failure.
#[derive(Debug, thiserror::Error)]
pub(super) enum ApiError {
    #[error("the plant id is not a base-10 int64")]
    InvalidPlantId,
    #[error("the Idempotency-Key header is not a valid key")]
    InvalidIdempotencyKey,
    /// The caller's idempotency key already deleted `earlier`; this request named `plant`.
    #[error("idempotency key reused for plant {plant}")]
    IdempotencyKeyReused { earlier: i64, plant: i64 },
    #[error("unauthenticated: {}", .0.as_str())]
    Unauthorized(AuthFailure),
    #[error("forbidden")]
    Forbidden,
    #[error("no plant with id {0}")]
    PlantNotFound(i64),
    #[error("no route")]
    RouteNotFound,
    #[error("method not allowed")]
    MethodNotAllowed { allow: &'static str },
    #[error("plant {0} is still referenced")]
    PlantReferenced(i64),
    #[error("rate limited")]
    RateLimited { retry_after_secs: u64 },
    /// A request the framework refused for a reason no other variant covers.
    #[error("rejected with {0}")]
    Rejected(StatusCode),
    #[error("database unavailable")]
    Unavailable,
    #[error("request deadline passed")]
    DeadlineExceeded,
    /// A JWT's key is not known and the identity provider's JWKS cannot be read now.
    #[error("identity provider keys unavailable")]
    KeysUnavailable,
    /// The request head did not arrive within `PLANTSTORE_HEADER_TIMEOUT`.
    #[error("request head too slow")]
    HeaderTimeout,
    #[error("request line too long")]
    UriTooLong { max_bytes: usize },
    #[error("request head too large")]
    HeadTooLarge { max_bytes: usize, max_lines: usize },
    #[error("internal error")]
    Internal,
}

/// The body of every error response, as the published contract names it.
#[derive(Debug, Object, serde::Serialize)]
#[oai(rename = "Error")]
pub(super) struct ErrorBody {
    /// The HTTP status code.
    pub error: i32,
    /// What went wrong, in one sentence a person can act on.
    pub message: String,
}

/// Seconds a client should wait before retrying after a 503.
const UNAVAILABLE_RETRY_AFTER_SECS: u64 = 2;

/// An error's whole answer but the body's framing: status, sentence, and the one header
/// some statuses need.
struct Answer {
    status: StatusCode,
    message: String,
    /// Named as the OpenAPI document spells it.
    header: Option<(&'static str, HeaderValue)>,
}

impl Answer {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            header: None,
        }
    }

    fn with(mut self, name: &'static str, value: HeaderValue) -> Self {
        self.header = Some((name, value));
        self
    }

    fn retry_after(self, secs: u64) -> Self {
        self.with("Retry-After", HeaderValue::from(secs))
    }
}

impl ApiError {
    /// The table: what each variant answers. Responses, the OpenAPI document's statuses,
    /// headers and examples are all read from here.
    fn answer(&self) -> Answer {
        use StatusCode as S;
        match self {
            ApiError::InvalidPlantId => Answer::new(
                S::BAD_REQUEST,
                "The plant id must be a base-10 integer between -9223372036854775808 and 9223372036854775807.",
            ),
            ApiError::InvalidIdempotencyKey => Answer::new(
                S::BAD_REQUEST,
                format!(
                    "The Idempotency-Key header must be one key of 1 to {} printable ASCII characters, bare or as a quoted string (\"key\").",
                    idempotency_key::MAX_LEN
                ),
            ),
            ApiError::IdempotencyKeyReused { earlier, plant } => Answer::new(
                S::UNPROCESSABLE_ENTITY,
                format!(
                    "This Idempotency-Key already deleted plant {earlier}; use a new key to delete plant {plant}."
                ),
            ),
            ApiError::Unauthorized(AuthFailure::Missing) => Answer::new(
                S::UNAUTHORIZED,
                "Authentication is required: send the header `Authorization: Bearer <token>`.",
            )
            .with(
                "WWW-Authenticate",
                HeaderValue::from_static(r#"Bearer realm="plantstore""#),
            ),
            ApiError::Unauthorized(_) => Answer::new(
                S::UNAUTHORIZED,
                "The bearer token is malformed, unknown, expired or revoked.",
            )
            .with(
                "WWW-Authenticate",
                HeaderValue::from_static(r#"Bearer realm="plantstore", error="invalid_token""#),
            ),
            ApiError::Forbidden => Answer::new(
                S::FORBIDDEN,
                "This token is valid but lacks the scope needed to delete plants.",
            ),
            ApiError::PlantNotFound(id) => {
                Answer::new(S::NOT_FOUND, format!("No plant with id {id} exists."))
            }
            ApiError::RouteNotFound => {
                Answer::new(S::NOT_FOUND, "There is no endpoint at this path.")
            }
            ApiError::MethodNotAllowed { allow } => Answer::new(
                S::METHOD_NOT_ALLOWED,
                format!("This method is not allowed on this path; use {allow}."),
            )
            .with("Allow", HeaderValue::from_static(allow)),
            ApiError::PlantReferenced(id) => Answer::new(
                S::CONFLICT,
                format!(
                    "Plant {id} is still referenced by other records, so it was not deleted; remove those references first."
                ),
            ),
            ApiError::RateLimited { retry_after_secs } => Answer::new(
                S::TOO_MANY_REQUESTS,
                format!("Too many requests with this token; retry in {retry_after_secs} second(s)."),
            )
            .retry_after(*retry_after_secs),
            ApiError::Rejected(status) => Answer::new(
                *status,
                format!(
                    "The request was rejected: {}.",
                    status.canonical_reason().unwrap_or("invalid request").to_lowercase()
                ),
            ),
            ApiError::Unavailable => Answer::new(
                S::SERVICE_UNAVAILABLE,
                "The database is unavailable right now; retry in a few seconds.",
            )
            .retry_after(UNAVAILABLE_RETRY_AFTER_SECS),
            ApiError::DeadlineExceeded => Answer::new(
                S::SERVICE_UNAVAILABLE,
                "The request did not finish in time; retry in a few seconds.",
            )
            .retry_after(UNAVAILABLE_RETRY_AFTER_SECS),
            ApiError::KeysUnavailable => Answer::new(
                S::SERVICE_UNAVAILABLE,
                "The identity provider's signing keys cannot be read right now; retry in a few seconds.",
            )
            .retry_after(UNAVAILABLE_RETRY_AFTER_SECS),
            ApiError::HeaderTimeout => Answer::new(
                S::REQUEST_TIMEOUT,
                "The request headers did not arrive in time, so the connection was closed.",
            ),
            ApiError::UriTooLong { max_bytes } => Answer::new(
                S::URI_TOO_LONG,
                format!("The request line is longer than {max_bytes} bytes."),
            ),
            ApiError::HeadTooLarge {
                max_bytes,
                max_lines,
            } => Answer::new(
                S::REQUEST_HEADER_FIELDS_TOO_LARGE,
                format!(
                    "The request headers are longer than {max_bytes} bytes or more than {max_lines} lines."
                ),
            ),
            ApiError::Internal => Answer::new(
                S::INTERNAL_SERVER_ERROR,
                "The server hit an unexpected error; the x-request-id header identifies it in the logs.",
            ),
        }
    }

    /// The statuses the operation documents, each with a typical variant (its example
    /// body, and the header it carries) and what the document says of the status.
    fn documented() -> [(ApiError, &'static str); 10] {
        [
            (
                ApiError::InvalidPlantId,
                "The id is not a base-10 int64, or the Idempotency-Key header is not a valid key",
            ),
            (
                ApiError::Unauthorized(AuthFailure::Unknown),
                "No, malformed, unknown, expired or revoked token",
            ),
            (
                ApiError::Forbidden,
                "The token is valid but not allowed to delete plants",
            ),
            (ApiError::PlantNotFound(42), "No plant with that id"),
            (
                ApiError::MethodNotAllowed { allow: "DELETE" },
                "Method not allowed on this path",
            ),
            (
                ApiError::PlantReferenced(42),
                "The plant is still referenced by another table; nothing was deleted",
            ),
            (
                ApiError::IdempotencyKeyReused {
                    earlier: 41,
                    plant: 42,
                },
                "The caller's Idempotency-Key already deleted another plant; nothing was deleted",
            ),
            (
                ApiError::RateLimited {
                    retry_after_secs: 1,
                },
                "Too many requests with this token",
            ),
            (ApiError::Internal, "Unexpected error"),
            (
                ApiError::Unavailable,
                "The database is unreachable, busy or taking no writes, the identity provider's keys cannot be read, or the request passed its deadline",
            ),
        ]
    }

    /// A typical error of each documented status, for the OpenAPI document's examples.
    pub(super) fn example_of(status: u16) -> Option<Self> {
        Self::documented()
            .into_iter()
            .map(|(example, _)| example)
            .find(|example| example.status().as_u16() == status)
    }

    /// Sorts an error from any layer (routing, path parsing, auth, handlers) by its type.
    /// `token_sent` and `allow` (the methods of the request's path) describe the request,
    /// for the headers the answer needs.
    pub(super) fn from_poem(err: poem::Error, token_sent: bool, allow: &'static str) -> Self {
        let err = match err.downcast::<ApiError>() {
            Ok(ours) => return ours,
            Err(other) => other,
        };
        if err.is::<ParsePathError>() {
            ApiError::InvalidPlantId
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
            ApiError::MethodNotAllowed { allow }
        } else if err.status().is_server_error() {
            tracing::error!(error = %err, "unexpected error");
            ApiError::Internal
        } else {
            ApiError::Rejected(err.status())
        }
    }

    /// The body this error is answered with.
    pub(super) fn body(&self) -> ErrorBody {
        let answer = self.answer();
        ErrorBody {
            error: i32::from(answer.status.as_u16()),
            message: answer.message,
        }
    }

    fn json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.body()).unwrap_or_default()
    }

    /// The same answer as `as_response`, as HTTP/1.1 bytes to write straight to a client
    /// connection from below hyper (see `connections`), which is closed after it.
    pub(super) fn to_http1(&self, request_id: &request_id::RequestId) -> Vec<u8> {
        let response = self.as_response();
        let body = self.json();
        let mut out = format!("HTTP/1.1 {}\r\n", response.status()).into_bytes();
        for (name, value) in response.headers() {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        let rest = format!(
            "{}: {request_id}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
            request_id::HEADER,
            body.len()
        );
        out.extend_from_slice(rest.as_bytes());
        out.extend_from_slice(&body);
        out
    }
}

impl ResponseError for ApiError {
    fn status(&self) -> StatusCode {
        self.answer().status
    }

    fn as_response(&self) -> Response {
        let Answer {
            status,
            message,
            header,
        } = self.answer();
        let body = ErrorBody {
            error: i32::from(status.as_u16()),
            message,
        };
        let mut response = Response::builder()
            .status(status)
            .content_type("application/json")
            .body(serde_json::to_vec(&body).unwrap_or_default());
        // `from_bytes` takes the document's capitals and stores the name in lower case.
        if let Some((Ok(name), value)) =
            header.map(|(n, v)| (HeaderName::from_bytes(n.as_bytes()), v))
        {
            response.headers_mut().insert(name, value);
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Unavailable(cause) => {
                tracing::warn!(error = %cause, "database unavailable");
                ApiError::Unavailable
            }
            StoreError::ReadOnly => {
                tracing::warn!("the database accepts no writes now");
                ApiError::Unavailable
            }
            StoreError::Stopped => {
                tracing::warn!("the store stopped before answering");
                ApiError::Unavailable
            }
            other => {
                tracing::error!(error = %other, "database error");
                ApiError::Internal
            }
        }
    }
}

impl From<RateLimited> for ApiError {
    fn from(limited: RateLimited) -> Self {
        ApiError::RateLimited {
            retry_after_secs: limited.retry_after_secs,
        }
    }
}

impl From<idempotency_key::InvalidKey> for ApiError {
    fn from(_: idempotency_key::InvalidKey) -> Self {
        ApiError::InvalidIdempotencyKey
    }
}

/// Documents every error status of an operation, each with the `Error` schema, so the
/// OpenAPI document lists what the service can really answer.
impl ApiResponse for ApiError {
    fn meta() -> MetaResponses {
        let responses = Self::documented()
            .into_iter()
            .map(|(example, description)| MetaResponse {
                description,
                status: Some(example.status().as_u16()),
                status_range: None,
                content: vec![MetaMediaType {
                    content_type: "application/json",
                    schema: ErrorBody::schema_ref(),
                }],
                headers: example
                    .answer()
                    .header
                    .map(|(name, _)| MetaHeader {
                        name: name.to_owned(),
                        description: None,
                        required: true,
                        deprecated: false,
                        schema: String::schema_ref(),
                    })
                    .into_iter()
                    .collect(),
            })
            .collect();
        MetaResponses { responses }
    }

    fn register(registry: &mut Registry) {
        ErrorBody::register(registry);
    }
}
