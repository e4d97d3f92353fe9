//! The operator endpoints: no token needed, and none of them in the OpenAPI document.

use reqwest::StatusCode;
use serde_json::Value;

use crate::{
    helpers::{
        AdminListen, Backend, TestDb, assert_error, assert_request_id, spawn_app, spawn_app_on,
    },
    on_both_backends,
};

on_both_backends!(
    health_readiness_and_docs_answer_without_a_token,
    an_admin_address_takes_the_ops_endpoints_off_the_public_one,
);

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

async fn an_admin_address_takes_the_ops_endpoints_off_the_public_one(backend: Backend) {
    let app = spawn_app_on(TestDb::new(backend).await, |config| {
        config.serve.admin_listen = AdminListen(Some("127.0.0.1:0".parse().expect("address")));
    })
    .await;
    let admin = app.admin_address.clone().expect("an admin listener");
    app.add_plants(&[1]).await;
    assert_eq!(app.delete_id(1).await.status(), StatusCode::NO_CONTENT);

    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_error(app.get(path).await, StatusCode::NOT_FOUND).await;
        let response = app
            .client
            .get(format!("{admin}{path}"))
            .send()
            .await
            .expect("the admin listener answers");
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_request_id(&response);
    }
    let metrics = app
        .client
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("plantstore_deletions_total 1"),
        "the public listener's delete is counted: {metrics}"
    );
    assert_eq!(app.get("/docs").await.status(), StatusCode::OK);
    let elsewhere = app
        .client
        .delete(format!("{admin}/plants/1"))
        .bearer_auth(&app.token)
        .send()
        .await
        .expect("answer");
    assert_error(elsewhere, StatusCode::NOT_FOUND).await;
}
