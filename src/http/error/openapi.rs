//! What the OpenAPI document says of the errors: the statuses the operation documents,
//! each with its `Error` schema, example body and header, read from `ApiError::answer`.

use poem::error::ResponseError;
use poem_openapi::{
    ApiResponse,
    registry::{MetaHeader, MetaMediaType, MetaResponse, MetaResponses, Registry},
    types::Type,
};

use super::{ApiError, ErrorBody};
use crate::auth::{AuthFailure, rate_limit::RateLimited};

impl ApiError {
    /// Each documented status, with a typical variant (example, header) and a description.
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
                ApiError::MethodNotAllowed {
                    allow: "DELETE".into(),
                },
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
                ApiError::RateLimited(RateLimited {
                    retry_after_secs: 1,
                }),
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
    pub(in crate::http) fn example_of(status: u16) -> Option<Self> {
        Self::documented()
            .into_iter()
            .map(|(example, _)| example)
            .find(|example| example.status().as_u16() == status)
    }
}

/// Documents every error status the operation can really answer, with the `Error` schema.
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
