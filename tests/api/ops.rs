//! The operator endpoints: no token needed, and none of them in the OpenAPI document.

use reqwest::StatusCode;
use serde_json::Value;

use crate::{
    helpers::{Backend, assert_request_id, spawn_app},
    on_both_backends,
};

on_both_backends!(health_readiness_and_docs_answer_without_a_token);

async fn health_readiness_and_docs_answer_without_a_token(backend: Backend) {
    let app = spawn_app(backend).await;

    for path in ["/healthz", "/readyz", "/docs", "/openapi.json"] {
        let response = app.get(path).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_request_id(&response);
    }
    let docs = app.get("/docs").await.text().await.expect("HTML");
    assert!(docs.contains("swagger-ui"), "Swagger UI is served");
    assert!(
        docs.contains("bearerAuth"),
        "the UI carries the document, with its Authorize scheme"
    );

    let document: Value = app.get("/openapi.json").await.json().await.expect("JSON");
    let paths: Vec<&String> = document["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .collect();
    assert_eq!(
        paths,
        ["/plants/{id}"],
        "ops endpoints stay out of the document"
    );
}
