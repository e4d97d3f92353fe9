//! The published operation, `DELETE /plants/{id}`, and the OpenAPI document around it.

use std::sync::Arc;

use plantstore_store::{Deletion, StoreError};
use poem::web::Data;
use poem_openapi::{ApiResponse, LicenseObject, OpenApi, OpenApiService, param::Path};

use crate::{auth::BearerAuth, error::ApiError, request_id::RequestId, state::AppState};

pub struct PlantsApi;

#[derive(Debug, ApiResponse)]
pub enum PlantDeleted {
    /// Plant deleted
    #[oai(status = 204)]
    Deleted,
}

#[OpenApi]
impl PlantsApi {
    /// Delete a plant
    ///
    /// Deletes a single plant based on the ID supplied
    // The bearer parameter comes first: an anonymous request must get 401 before its id
    // is even parsed.
    #[oai(path = "/plants/:id", method = "delete", operation_id = "deletePlant")]
    #[tracing::instrument(name = "delete_plant", level = "debug", skip_all, fields(id = id.0, token = %auth.0.token_name))]
    async fn delete_plant(
        &self,
        auth: BearerAuth,
        /// ID of plant to delete
        id: Path<i64>,
        state: Data<&AppState>,
        request_id: Data<&RequestId>,
    ) -> Result<PlantDeleted, ApiError> {
        let deletion = Deletion {
            plant_id: id.0,
            caller: Arc::clone(&auth.0.token_name),
            request_id: request_id.as_str().to_owned(),
        };
        match state.store.delete_plant(deletion).await {
            Ok(()) => Ok(PlantDeleted::Deleted),
            Err(StoreError::NotFound) => Err(ApiError::PlantNotFound(id.0)),
            Err(StoreError::Referenced) => Err(ApiError::PlantReferenced(id.0)),
            Err(err) => Err(err.into()),
        }
    }
}

/// The operation with the document's title, version and license, as the contract has them.
pub fn service() -> OpenApiService<PlantsApi, ()> {
    OpenApiService::new(PlantsApi, "Plant Store", "1.0.0")
        .description(
            "A plant store service over HTTP with JSON error bodies. Plants are addressed by an \
             integer identifier. This is the published contract: the one operation it shows is \
             deleting a plant.",
        )
        .license(LicenseObject::new("MIT"))
}
