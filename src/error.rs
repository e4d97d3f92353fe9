//! The service's one HTTP error type, and the only place errors become responses.

use plantstore_store::StoreError;

use crate::{
    connections::head::{MAX_HEAD_BYTES, MAX_HEADER_LINES},
    request_id::{self, RequestId},
};
use poem::{
    Response,
    error::{MethodNotAllowedError, NotFoundError, ResponseError},
    http::{HeaderValue, StatusCode, header},
};
use poem_openapi::{
    ApiResponse, Object,
    error::{AuthorizationError, ParsePathError},
    registry::{MetaHeader, MetaMediaType, MetaResponse, MetaResponses, Registry},
    types::Type,
};

/// What the service answers to a client's mistake or its own failure.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
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
    UriTooLong,
    #[error("request head too large")]
    HeadTooLarge,
    #[error("internal error")]
    Internal,
}

/// Why a request was not authenticated: counted in `/metrics`, never told to the client
/// beyond whether a token was sent at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    Missing,
    Malformed,
    Unknown,
    WrongSecret,
    Expired,
    Revoked,
    /// JWT: the signature does not verify, or another algorithm than the key's.
    BadSignature,
    /// JWT: `nbf` is still ahead.
    NotYetValid,
    /// JWT: wrong `iss` or `aud`, or no `sub` or `exp`.
    WrongClaims,
}

impl AuthFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::Malformed => "malformed",
            AuthFailure::Unknown => "unknown",
            AuthFailure::WrongSecret => "wrong_secret",
            AuthFailure::Expired => "expired",
            AuthFailure::Revoked => "revoked",
            AuthFailure::BadSignature => "bad_signature",
            AuthFailure::NotYetValid => "not_yet_valid",
            AuthFailure::WrongClaims => "wrong_claims",
        }
    }
}

/// The body of every error response, as the published contract names it.
#[derive(Debug, Object, serde::Serialize)]
#[oai(rename = "Error")]
pub struct ErrorBody {
    /// The HTTP status code.
    pub error: i32,
    /// What went wrong, in one sentence a person can act on.
    pub message: String,
}

/// Seconds a client should wait before retrying after a 503.
const UNAVAILABLE_RETRY_AFTER_SECS: u64 = 2;

impl ApiError {
    /// Sorts an error from any layer (routing, path parsing, auth, handlers) by its type.
    /// `token_sent` and `allow` (the methods of the request's path) describe the request,
    /// for the headers the answer needs.
    pub fn from_poem(err: poem::Error, token_sent: bool, allow: &'static str) -> Self {
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

    fn message(&self) -> String {
        match self {
            ApiError::InvalidPlantId => {
                "The plant id must be a base-10 integer between -9223372036854775808 and 9223372036854775807.".into()
            }
            ApiError::Unauthorized(AuthFailure::Missing) => {
                "Authentication is required: send the header `Authorization: Bearer <token>`.".into()
            }
            ApiError::Unauthorized(_) => {
                "The bearer token is malformed, unknown, expired or revoked.".into()
            }
            ApiError::Forbidden => {
                "This token is valid but lacks the scope needed to delete plants.".into()
            }
            ApiError::InvalidIdempotencyKey => format!(
                "The Idempotency-Key header must be one key of 1 to {} printable ASCII characters, bare or as a quoted string (\"key\").",
                crate::idempotency::MAX_LEN
            ),
            ApiError::IdempotencyKeyReused { earlier, plant } => format!(
                "This Idempotency-Key already deleted plant {earlier}; use a new key to delete plant {plant}."
            ),
            ApiError::PlantNotFound(id) => format!("No plant with id {id} exists."),
            ApiError::RouteNotFound => "There is no endpoint at this path.".into(),
            ApiError::MethodNotAllowed { allow } => {
                format!("This method is not allowed on this path; use {allow}.")
            }
            ApiError::PlantReferenced(id) => format!(
                "Plant {id} is still referenced by other records, so it was not deleted; remove those references first."
            ),
            ApiError::RateLimited { retry_after_secs } => format!(
                "Too many requests with this token; retry in {retry_after_secs} second(s)."
            ),
            ApiError::Rejected(status) => format!(
                "The request was rejected: {}.",
                status.canonical_reason().unwrap_or("invalid request").to_lowercase()
            ),
            ApiError::Unavailable => {
                "The database is unavailable right now; retry in a few seconds.".into()
            }
            ApiError::DeadlineExceeded => {
                "The request did not finish in time; retry in a few seconds.".into()
            }
            ApiError::KeysUnavailable => {
                "The identity provider's signing keys cannot be read right now; retry in a few seconds.".into()
            }
            ApiError::HeaderTimeout => {
                "The request headers did not arrive in time, so the connection was closed.".into()
            }
            ApiError::UriTooLong => format!(
                "The request line is longer than {MAX_HEAD_BYTES} bytes."
            ),
            ApiError::HeadTooLarge => format!(
                "The request headers are longer than {MAX_HEAD_BYTES} bytes or more than {MAX_HEADER_LINES} lines."
            ),
            ApiError::Internal => {
                "The server hit an unexpected error; the x-request-id header identifies it in the logs.".into()
            }
        }
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

impl ResponseError for ApiError {
    fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidPlantId | ApiError::InvalidIdempotencyKey => StatusCode::BAD_REQUEST,
            ApiError::IdempotencyKeyReused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden => StatusCode::FORBIDDEN,
            ApiError::PlantNotFound(_) | ApiError::RouteNotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PlantReferenced(_) => StatusCode::CONFLICT,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Rejected(status) => *status,
            ApiError::Unavailable | ApiError::DeadlineExceeded | ApiError::KeysUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::HeaderTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::UriTooLong => StatusCode::URI_TOO_LONG,
            ApiError::HeadTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn as_response(&self) -> Response {
        let mut response = Response::builder()
            .status(self.status())
            .content_type("application/json")
            .body(self.json());
        let headers = response.headers_mut();
        match self {
            ApiError::Unauthorized(failure) => {
                let challenge = if *failure == AuthFailure::Missing {
                    r#"Bearer realm="plantstore""#
                } else {
                    r#"Bearer realm="plantstore", error="invalid_token""#
                };
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(challenge),
                );
            }
            ApiError::MethodNotAllowed { allow } => {
                headers.insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            ApiError::RateLimited { retry_after_secs } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
            }
            ApiError::Unavailable | ApiError::DeadlineExceeded | ApiError::KeysUnavailable => {
                headers.insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(UNAVAILABLE_RETRY_AFTER_SECS),
                );
            }
            _ => {}
        }
        response
    }
}

impl ApiError {
    /// The body this error is answered with.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: i32::from(self.status().as_u16()),
            message: self.message(),
        }
    }

    fn json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.body()).unwrap_or_default()
    }

    /// A typical error of each documented status, for the OpenAPI document's examples.
    pub fn example_of(status: u16) -> Option<Self> {
        Some(match status {
            400 => ApiError::InvalidPlantId,
            401 => ApiError::Unauthorized(AuthFailure::Unknown),
            403 => ApiError::Forbidden,
            404 => ApiError::PlantNotFound(42),
            405 => ApiError::MethodNotAllowed { allow: "DELETE" },
            409 => ApiError::PlantReferenced(42),
            422 => ApiError::IdempotencyKeyReused {
                earlier: 41,
                plant: 42,
            },
            429 => ApiError::RateLimited {
                retry_after_secs: 1,
            },
            500 => ApiError::Internal,
            503 => ApiError::Unavailable,
            _ => return None,
        })
    }

    /// The same answer as `as_response`, as HTTP/1.1 bytes to write straight to a client
    /// connection from below hyper (see `connections`), which is closed after it.
    pub fn to_http1(&self, request_id: &RequestId) -> Vec<u8> {
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

/// Documents every error status of an operation, each with the `Error` schema, so the
/// OpenAPI document lists what the service can really answer.
impl ApiResponse for ApiError {
    fn meta() -> MetaResponses {
        let documented: [(u16, &'static str, Option<&'static str>); 10] = [
            (
                400,
                "The id is not a base-10 int64, or the Idempotency-Key header is not a valid key",
                None,
            ),
            (
                401,
                "No, malformed, unknown, expired or revoked token",
                Some("WWW-Authenticate"),
            ),
            (
                403,
                "The token is valid but not allowed to delete plants",
                None,
            ),
            (404, "No plant with that id", None),
            (405, "Method not allowed on this path", Some("Allow")),
            (
                409,
                "The plant is still referenced by another table; nothing was deleted",
                None,
            ),
            (
                422,
                "The caller's Idempotency-Key already deleted another plant; nothing was deleted",
                None,
            ),
            (
                429,
                "Too many requests with this token",
                Some("Retry-After"),
            ),
            (500, "Unexpected error", None),
            (
                503,
                "The database is unreachable, busy or taking no writes, the identity provider's keys cannot be read, or the request passed its deadline",
                Some("Retry-After"),
            ),
        ];
        let responses = documented
            .into_iter()
            .map(|(status, description, header)| MetaResponse {
                description,
                status: Some(status),
                status_range: None,
                content: vec![MetaMediaType {
                    content_type: "application/json",
                    schema: ErrorBody::schema_ref(),
                }],
                headers: header
                    .map(|name| MetaHeader {
                        name: name.to_string(),
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
