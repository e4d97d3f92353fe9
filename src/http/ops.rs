//! Endpoints for operators and orchestrators, outside the OpenAPI document and the token.

use poem::{
    Response, handler,
    web::{Data, Json},
};
use serde_json::{Value, json};

use super::error::ApiError;
use crate::state::AppState;

/// 200 while the process runs.
#[handler]
pub(crate) fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// 200 when the database answers, else 503 with an `Error` body; 503 from the moment a
/// shutdown is asked for, so a load balancer stops sending here while requests still finish.
#[handler]
#[tracing::instrument(skip_all)]
pub(crate) async fn readyz(state: Data<&AppState>) -> poem::Result<Json<Value>> {
    if state.draining.is_on() {
        return Err(ApiError::ShuttingDown.into());
    }
    state.store.ping().await.map_err(ApiError::from)?;
    Ok(Json(json!({ "status": "ready" })))
}

/// Prometheus text: see `metrics`. Like the health checks, it needs no token.
#[handler]
pub(crate) fn metrics(state: Data<&AppState>) -> Response {
    let text = state.metrics.render(state.store.as_ref(), &state.tokens);
    Response::builder()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(text)
}
