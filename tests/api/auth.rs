//! Bearer authentication: checked before anything else, for every kind of bad token.

use std::time::Duration;

use plantstore::{auth::tokens, database};
use reqwest::{StatusCode, header};

use crate::{
    helpers::{
        Backend, TestApp, TestDb, assert_error, eventually, spawn_app, spawn_app_on, test_config,
    },
    on_both_backends,
};

on_both_backends!(
    no_token_is_401_before_the_id_is_parsed,
    bad_tokens_are_401_invalid_token,
    a_revoked_token_fails_within_a_second,
    an_expired_token_fails,
    a_token_over_the_rate_limit_gets_429,
);

async fn assert_unauthorized(response: reqwest::Response, token_sent: bool) {
    let challenge = response
        .headers()
        .get(header::WWW_AUTHENTICATE)
        .map(|v| v.to_str().expect("ASCII").to_owned());
    assert_error(response, StatusCode::UNAUTHORIZED).await;
    let expected = if token_sent {
        r#"Bearer realm="plantstore", error="invalid_token""#
    } else {
        r#"Bearer realm="plantstore""#
    };
    assert_eq!(challenge.as_deref(), Some(expected));
}

async fn no_token_is_401_before_the_id_is_parsed(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[1]).await;

    assert_unauthorized(app.delete_with("1", None).await, false).await;
    assert_unauthorized(app.delete_with("abc", None).await, false).await;
    assert_unauthorized(app.delete_with("99", None).await, false).await;
    assert!(app.db.plant_exists(1).await);
}

async fn bad_tokens_are_401_invalid_token(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[1]).await;
    let (lookup_and_secret, _) = app.token.split_at(app.token.len() - 1);
    let wrong_secret = format!(
        "{lookup_and_secret}{}",
        if app.token.ends_with('x') { 'y' } else { 'x' }
    );

    // The last but one is well formed, with a lookup id no token has.
    let unknown = format!("pst_{}_{}", "a".repeat(12), "b".repeat(40));
    for token in [
        "nope",
        "pst_",
        "pst_aaaaaaaaaaaa_bbbb",
        &unknown,
        wrong_secret.as_str(),
    ] {
        assert_unauthorized(app.delete_with("1", Some(token)).await, true).await;
        assert_unauthorized(app.delete_with("abc", Some(token)).await, true).await;
    }
    for raw_header in ["Basic dXNlcjpwYXNz", "Bearer", "Bearer ", &app.token] {
        let response = app
            .client
            .delete(format!("{}/plants/1", app.address))
            .header(header::AUTHORIZATION, raw_header)
            .send()
            .await
            .expect("answer");
        assert_unauthorized(response, true).await;
    }
    assert!(app.db.plant_exists(1).await);
}

/// Tokens are checked against an in-memory copy of the table, so a revocation made by
/// another process (here: the store as the CLI opens it) holds within one second.
async fn a_revoked_token_fails_within_a_second(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[1, 2]).await;
    let store = open_store(&app).await;
    let token = tokens::create(store.as_ref(), "ci-bot", None)
        .await
        .expect("token created");
    assert_eq!(
        app.delete_with("1", Some(&token)).await.status(),
        StatusCode::NO_CONTENT,
        "a token works as soon as it is created"
    );

    tokens::revoke(store.as_ref(), "ci-bot")
        .await
        .expect("revoked");
    let revoked_at = std::time::Instant::now();

    // Until the revocation is seen, the token still answers (404 for a missing plant).
    let refused = eventually(
        Duration::from_secs(1),
        "the revoked token refused",
        || async {
            let response = app.delete_with("99", Some(&token)).await;
            if response.status() == StatusCode::UNAUTHORIZED {
                return Some(response);
            }
            assert_eq!(response.status(), StatusCode::NOT_FOUND);
            None
        },
    )
    .await;
    assert!(revoked_at.elapsed() < Duration::from_secs(1));
    assert_unauthorized(refused, true).await;
    assert_unauthorized(app.delete_with("2", Some(&token)).await, true).await;
    assert!(app.db.plant_exists(2).await);
    assert_eq!(
        app.delete("2").await.status(),
        StatusCode::NO_CONTENT,
        "other tokens still work"
    );
}

async fn an_expired_token_fails(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[1]).await;
    let store = open_store(&app).await;
    let token = tokens::create(store.as_ref(), "short", Some(Duration::from_millis(300)))
        .await
        .expect("token created");

    // Until its 300 ms are up the token works (404: no plant 99); then it is refused.
    let refused = eventually(Duration::from_secs(5), "the token expired", || async {
        let answer = app.delete_with("99", Some(&token)).await;
        (answer.status() == StatusCode::UNAUTHORIZED).then_some(answer)
    })
    .await;
    assert_unauthorized(refused, true).await;
    assert_unauthorized(app.delete_with("1", Some(&token)).await, true).await;
    assert!(app.db.plant_exists(1).await);
}

async fn a_token_over_the_rate_limit_gets_429(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app: TestApp = spawn_app_on(db, |config| {
        config.serve.rate_limit = "2".parse().expect("a rate")
    })
    .await;

    let first = app.delete("1").await.status();
    let second = app.delete("2").await.status();
    let third = app.delete("3").await;

    assert_eq!(
        (first, second),
        (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND)
    );
    let retry_after = third.headers().get(header::RETRY_AFTER).cloned();
    assert_error(third, StatusCode::TOO_MANY_REQUESTS).await;
    assert_eq!(
        retry_after.as_ref().map(|v| v.to_str().ok()),
        Some(Some("1"))
    );
}

/// The store as the CLI opens it, on the app's database.
async fn open_store(app: &TestApp) -> std::sync::Arc<dyn plantstore_store::Store> {
    database::open(&test_config(&app.db.url), None)
        .await
        .expect("store opens")
}
