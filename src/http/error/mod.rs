//! The service's one HTTP error type, and the only place errors become responses (the table
//! is `ApiError::answer`); what the OpenAPI document says of them is in `openapi.rs`.

mod openapi;

use std::sync::Arc;

use plantstore_store::StoreError;
use poem::{
    Response,
    error::ResponseError,
    http::{HeaderName, HeaderValue, StatusCode},
};
use poem_openapi::Object;

use super::idempotency_key::{self, InvalidKey};
use crate::auth::{AuthFailure, rate_limit::RateLimited};

#[derive(Debug, thiserror::Error)]
pub(super) enum ApiError {
    #[error("the plant id is not a base-10 int64")]
    InvalidPlantId,
    #[error(transparent)]
    InvalidIdempotencyKey(#[from] InvalidKey),
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
    /// `allow`: the methods the route answers, as the `Allow` header lists them.
    MethodNotAllowed { allow: Arc<str> },
    #[error("plant {0} is still referenced")]
    PlantReferenced(i64),
    #[error(transparent)]
    RateLimited(#[from] RateLimited),
    /// A request the framework refused for a reason no other variant covers.
    #[error("rejected with {0}")]
    Rejected(StatusCode),
    #[error("database unavailable")]
    Unavailable,
    #[error("request deadline passed")]
    DeadlineExceeded,
    /// `/readyz` after SIGTERM, while the instance drains (`PLANTSTORE_SHUTDOWN_DELAY`).
    #[error("shutting down")]
    ShuttingDown,
    #[error("identity provider keys unavailable")]
    KeysUnavailable,
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

const UNAVAILABLE_RETRY_AFTER_SECS: u64 = 2;

/// An error's whole answer but the body's framing: status, sentence and optional header.
pub(super) struct Answer {
    status: StatusCode,
    body: ErrorBody,
    /// Named as the OpenAPI document spells it.
    pub(super) header: Option<(&'static str, HeaderValue)>,
}

impl Answer {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        let body = ErrorBody {
            error: i32::from(status.as_u16()),
            message: message.into(),
        };
        Self {
            status,
            body,
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
    /// The table of answers: responses and the document's statuses, headers and examples.
    pub(super) fn answer(&self) -> Answer {
        use StatusCode as S;
        match self {
            ApiError::InvalidPlantId => Answer::new(
                S::BAD_REQUEST,
                "The plant id must be a base-10 integer between -9223372036854775808 and 9223372036854775807.",
            ),
            ApiError::InvalidIdempotencyKey(_) => Answer::new(
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
            ApiError::MethodNotAllowed { allow } => {
                let answer = Answer::new(
                    S::METHOD_NOT_ALLOWED,
                    format!("This method is not allowed on this path; use {allow}."),
                );
                // Method names are tokens, always a valid header value.
                match HeaderValue::from_str(allow) {
                    Ok(allow) => answer.with("Allow", allow),
                    Err(_) => answer,
                }
            }
            ApiError::PlantReferenced(id) => Answer::new(
                S::CONFLICT,
                format!(
                    "Plant {id} is still referenced by other records, so it was not deleted; remove those references first."
                ),
            ),
            ApiError::RateLimited(RateLimited { retry_after_secs }) => Answer::new(
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
            ApiError::ShuttingDown => Answer::new(
                S::SERVICE_UNAVAILABLE,
                "This instance is shutting down and takes no new work; send requests to another one.",
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

    pub(super) fn body(&self) -> ErrorBody {
        self.answer().body
    }
}

impl ResponseError for ApiError {
    fn status(&self) -> StatusCode {
        self.answer().status
    }

    fn as_response(&self) -> Response {
        let Answer {
            status,
            body,
            header,
        } = self.answer();
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
            StoreError::Unavailable(_) | StoreError::ReadOnly | StoreError::Stopped => {
                tracing::warn!(error = %err, "database unavailable");
                ApiError::Unavailable
            }
            // A retry is safe: it finds the plant gone (404), or replays its key's 204.
            StoreError::OutcomeUnknown | StoreError::NotReplicated => {
                tracing::error!(error = %err, "a delete's outcome is unknown");
                ApiError::Unavailable
            }
            StoreError::TimedOut => ApiError::DeadlineExceeded,
            other => {
                tracing::error!(error = %other, "database error");
                ApiError::Internal
            }
        }
    }
}
