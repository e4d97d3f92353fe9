//! Endpoints for operators and orchestrators, outside the OpenAPI document and the token.

use poem::{
    handler,
    web::{Data, Json},
};
use serde_json::{Value, json};

use crate::{error::ApiError, state::AppState};

/// 200 while the process runs.
#[handler]
pub fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// 200 when the database answers, else 503 with an `Error` body.
#[handler]
#[tracing::instrument(skip_all)]
pub async fn readyz(state: Data<&AppState>) -> poem::Result<Json<Value>> {
    state.store.ping().await.map_err(ApiError::from)?;
    Ok(Json(json!({ "status": "ready" })))
}
