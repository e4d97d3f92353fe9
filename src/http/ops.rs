//! Endpoints for operators and orchestrators, outside the OpenAPI document and the token.

use poem::{
    Endpoint, EndpointExt, Response, Route, get, handler,
    web::{Data, Json},
};
use serde_json::{Value, json};

use super::error::ApiError;
use crate::{health::Readiness, state::AppState, telemetry::TokenCacheCounts};

/// An answer from an endpoint that orchestrators and scrapers poll: its log line is quiet.
#[derive(Debug, Clone, Copy)]
pub(super) struct Probe;

/// `routes` with the ops endpoints, each answer (a 405 too) marked `Probe`.
pub(super) fn mount(routes: Route) -> Route {
    routes
        .at("/healthz", probe(get(healthz)))
        .at("/readyz", probe(get(readyz)))
        .at("/metrics", probe(get(metrics)))
}

fn probe(endpoint: impl Endpoint<Output = Response> + 'static) -> impl Endpoint {
    endpoint.after(|mut answer| async move {
        match &mut answer {
            Ok(response) => response.set_data(Probe),
            Err(err) => err.set_data(Probe),
        }
        answer
    })
}

/// 200 while the process runs.
#[handler]
fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// 200 when the database answers, else 503 with an `Error` body; 503 from the moment a
/// shutdown is asked for, so a load balancer stops sending here while requests still finish.
#[handler]
#[tracing::instrument(skip_all)]
async fn readyz(state: Data<&AppState>) -> poem::Result<Json<Value>> {
    let readiness = Readiness::check(&state).await;
    if readiness.draining {
        return Err(ApiError::ShuttingDown.into());
    }
    readiness.database.map_err(ApiError::from)?;
    Ok(Json(json!({ "status": "ready" })))
}

/// Prometheus text: see `metrics`. Like the health checks, it needs no token.
#[handler]
fn metrics(state: Data<&AppState>) -> Response {
    let tokens = TokenCacheCounts {
        hits: state.tokens.hits(),
        misses: state.tokens.misses(),
        reloads: state.tokens.reloads(),
    };
    let text = state.metrics.render(state.store.as_ref(), tokens);
    Response::builder()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(text)
}
