//! Browsers on other origins: `PLANTSTORE_CORS_ALLOWED_ORIGINS` as a browser exercises it.

use reqwest::{Method, Response, StatusCode, header};

use crate::{
    helpers::{Backend, TestApp, TestDb, assert_error, assert_request_id, spawn_app, spawn_app_on},
    on_both_backends,
};

on_both_backends!(
    an_allowed_origin_may_delete_and_read_the_answer,
    another_origin_gets_no_cors_headers,
    a_wildcard_allows_any_origin,
    without_the_setting_a_preflight_is_405,
);

const SHOP: &str = "http://shop.localhost:3000";

async fn spawn_with_origins(backend: Backend, origins: &str) -> TestApp {
    let origins = origins.parse().expect("origins");
    spawn_app_on(TestDb::new(backend).await, |config| {
        config.serve.cors_allowed_origins = origins;
    })
    .await
}

/// What a browser sends before a DELETE with a token and an Idempotency-Key.
async fn preflight(app: &TestApp, origin: &str) -> Response {
    app.client
        .request(Method::OPTIONS, format!("{}/plants/1", app.address))
        .header(header::ORIGIN, origin)
        .header(header::ACCESS_CONTROL_REQUEST_METHOD, "DELETE")
        .header(
            header::ACCESS_CONTROL_REQUEST_HEADERS,
            "authorization,idempotency-key",
        )
        .send()
        .await
        .expect("the server answers")
}

/// `DELETE /plants/1` with the app's token, as a page on `origin` sends it.
fn delete_from(app: &TestApp, origin: &str) -> reqwest::RequestBuilder {
    app.delete_request("1")
        .bearer_auth(&app.token)
        .header(header::ORIGIN, origin)
}

fn header_text(response: &Response, name: header::HeaderName) -> Option<&str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

fn listed(response: &Response, name: header::HeaderName) -> Vec<String> {
    header_text(response, name)
        .unwrap_or_default()
        .split(',')
        .map(|item| item.trim().to_ascii_lowercase())
        .filter(|item| !item.is_empty())
        .collect()
}

async fn an_allowed_origin_may_delete_and_read_the_answer(backend: Backend) {
    let app = spawn_with_origins(backend, &format!("https://other.example, {SHOP}")).await;
    app.add_plants(&[1]).await;

    let answer = preflight(&app, SHOP).await;
    assert_eq!(answer.status(), StatusCode::NO_CONTENT);
    assert_request_id(&answer);
    assert_eq!(
        header_text(&answer, header::ACCESS_CONTROL_ALLOW_ORIGIN),
        Some(SHOP)
    );
    assert_eq!(
        listed(&answer, header::ACCESS_CONTROL_ALLOW_METHODS),
        ["delete"]
    );
    let allowed = listed(&answer, header::ACCESS_CONTROL_ALLOW_HEADERS);
    for name in ["authorization", "idempotency-key"] {
        assert!(allowed.iter().any(|a| a == name), "{name} in {allowed:?}");
    }
    assert_eq!(
        header_text(&answer, header::ACCESS_CONTROL_MAX_AGE),
        Some("600")
    );
    assert!(app.db.plant_exists(1).await, "a preflight deletes nothing");

    let deleted = delete_from(&app, SHOP)
        .header("Idempotency-Key", "from-the-shop")
        .send()
        .await
        .expect("the server answers");
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        header_text(&deleted, header::ACCESS_CONTROL_ALLOW_ORIGIN),
        Some(SHOP)
    );
    let exposed = listed(&deleted, header::ACCESS_CONTROL_EXPOSE_HEADERS);
    for name in ["x-request-id", "idempotent-replayed", "retry-after"] {
        assert!(exposed.iter().any(|e| e == name), "{name} in {exposed:?}");
    }
    assert!(!app.db.plant_exists(1).await);
    assert_eq!(
        app.db.audit_log().await,
        [(1, "initial".to_owned(), Some("from-the-shop".to_owned()))]
    );

    // Errors carry the headers too, so the page can read their Error body.
    let missing = delete_from(&app, SHOP)
        .send()
        .await
        .expect("the server answers");
    assert_eq!(
        header_text(&missing, header::ACCESS_CONTROL_ALLOW_ORIGIN),
        Some(SHOP)
    );
    assert_error(missing, StatusCode::NOT_FOUND).await;
}

async fn another_origin_gets_no_cors_headers(backend: Backend) {
    let app = spawn_with_origins(backend, SHOP).await;
    app.add_plants(&[1]).await;

    let answer = preflight(&app, "http://evil.localhost:3000").await;
    assert!(
        !answer
            .headers()
            .keys()
            .any(|name| name.as_str().starts_with("access-control-")),
        "{:?}",
        answer.headers()
    );
    assert_error(answer, StatusCode::METHOD_NOT_ALLOWED).await;

    // A request that names another origin (a server forwarding one, or the service's own
    // Swagger UI) is served as usual, without CORS headers.
    let deleted = delete_from(&app, "http://evil.localhost:3000")
        .send()
        .await
        .expect("the server answers");
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        header_text(&deleted, header::ACCESS_CONTROL_ALLOW_ORIGIN),
        None
    );
}

async fn a_wildcard_allows_any_origin(backend: Backend) {
    let app = spawn_with_origins(backend, "*").await;
    let answer = preflight(&app, "http://anywhere.localhost:8000").await;
    assert_eq!(answer.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        header_text(&answer, header::ACCESS_CONTROL_ALLOW_ORIGIN),
        Some("http://anywhere.localhost:8000")
    );
}

async fn without_the_setting_a_preflight_is_405(backend: Backend) {
    let app = spawn_app(backend).await;
    let answer = preflight(&app, SHOP).await;
    assert_eq!(header_text(&answer, header::ALLOW), Some("DELETE"));
    assert_eq!(
        header_text(&answer, header::ACCESS_CONTROL_ALLOW_ORIGIN),
        None
    );
    assert_error(answer, StatusCode::METHOD_NOT_ALLOWED).await;
}
