//! The published operation, `DELETE /plants/{id}`: the parameters it reads (the bearer
//! token, the id, the Idempotency-Key), and what each store outcome answers.

use std::sync::Arc;

use chrono::Utc;
use plantstore_store::{Deleted, Deletion, StoreError};
use poem::{Request, web::Data};
use poem_openapi::{ApiResponse, OpenApi, SecurityScheme, Tags, auth::Bearer, param::Path};

use super::{
    error::ApiError, front_door::RequestDeadline, idempotency_key::IdempotencyKey,
    request_id::RequestId,
};
use crate::{
    auth::{
        Caller, JwtRejection,
        tokens::{self, Rejection},
    },
    state::AppState,
};

pub(super) struct PlantsApi;

/// The document's one tag, which Swagger UI and generated clients group the operation by.
#[derive(Tags)]
enum PlantsTag {
    /// The plants in the store
    #[oai(rename = "plants")]
    Plants,
}

#[derive(Debug, ApiResponse)]
pub enum PlantDeleted {
    /// Plant deleted: now, or by an earlier request with the same Idempotency-Key
    #[oai(status = 204)]
    NoContent(
        /// `true` when an earlier request with this Idempotency-Key from the same caller
        /// deleted the plant and this answer repeats its 204; absent otherwise
        #[oai(header = "Idempotent-Replayed")]
        Option<bool>,
    ),
}

#[OpenApi]
impl PlantsApi {
    /// Delete a plant
    ///
    /// Deletes a single plant based on the ID supplied
    // The bearer parameter first: an anonymous request gets 401 before its id is parsed.
    #[oai(
        path = "/plants/:id",
        method = "delete",
        operation_id = "deletePlant",
        tag = "PlantsTag::Plants"
    )]
    #[tracing::instrument(name = "delete_plant", level = "debug", skip_all, fields(id = id.0, token = %auth.0.token_name, idempotency_key = idempotency_key.0.as_deref()))]
    async fn delete_plant(
        &self,
        auth: BearerAuth,
        /// ID of plant to delete
        id: Path<i64>,
        /// Makes a retry safe: a retry with the same key from the same caller (token or JWT
        /// subject) within PLANTSTORE_IDEMPOTENCY_TTL (default 24 hours) of a delete it made
        /// answers 204 again with `Idempotent-Replayed: true`; used for another plant id, 422.
        /// A first try that answered 404, 409 or 503 did nothing and is simply tried again.
        /// 1 to 255 printable ASCII characters, bare or as a quoted string ("key").
        #[oai(name = "Idempotency-Key")]
        idempotency_key: IdempotencyKey,
        state: Data<&AppState>,
        request_id: Data<&RequestId>,
        deadline: Data<&RequestDeadline>,
    ) -> Result<PlantDeleted, ApiError> {
        let deletion = Deletion {
            plant_id: id.0,
            caller: Arc::clone(&auth.0.token_name),
            request_id: request_id.as_str().to_owned(),
            idempotency_key: idempotency_key.0,
            deadline: deadline.0.0,
        };
        match state.store.delete_plant(deletion).await {
            Ok(Deleted::Now) => {
                state.metrics.deleted();
                Ok(PlantDeleted::NoContent(None))
            }
            Ok(Deleted::Replayed) => Ok(PlantDeleted::NoContent(Some(true))),
            Err(StoreError::NotFound) => Err(ApiError::PlantNotFound(id.0)),
            Err(StoreError::Referenced) => Err(ApiError::PlantReferenced(id.0)),
            Err(StoreError::KeyReused { plant_id }) => Err(ApiError::IdempotencyKeyReused {
                earlier: plant_id,
                plant: id.0,
            }),
            Err(err) => Err(err.into()),
        }
    }
}

/// An API token from `plantstore token create` (or the `initial` one printed at first
/// start), or a JWT from the identity provider the settings name.
#[derive(SecurityScheme)]
#[oai(ty = "bearer", rename = "bearerAuth", checker = "authenticate")]
pub(super) struct BearerAuth(pub Caller);

async fn authenticate(req: &Request, bearer: Bearer) -> poem::Result<Caller> {
    let state = req.data::<AppState>().ok_or(ApiError::Internal)?;
    let caller = match &state.jwt {
        // The service's own tokens start `pst_`; anything else may be a JWT.
        Some(jwt) if !tokens::is_ours(&bearer.token) => {
            let now = u64::try_from(Utc::now().timestamp()).unwrap_or_default();
            jwt.verify(&bearer.token, now)
                .await
                .map_err(|rejection| match rejection {
                    JwtRejection::Invalid(failure) => ApiError::Unauthorized(failure),
                    JwtRejection::MissingScope => ApiError::Forbidden,
                    JwtRejection::KeysUnavailable => ApiError::KeysUnavailable,
                })?
        }
        _ => tokens::verify(&state.tokens, &bearer.token, Utc::now())
            .await
            .map_err(|rejection| match rejection {
                Rejection::Invalid(failure) => ApiError::Unauthorized(failure),
                Rejection::Store(err) => ApiError::from(err),
            })?,
    };
    if let Some(limiter) = &state.rate_limiter {
        limiter.check(&caller.token_name).map_err(ApiError::from)?;
    }
    Ok(caller)
}
