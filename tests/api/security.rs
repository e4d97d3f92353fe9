//! What error answers never show: SQL, table or driver names, file paths, stack traces.

use std::time::Duration;

use reqwest::{Method, StatusCode};

use crate::{
    helpers::{Backend, TestDb, spawn_app_on},
    on_both_backends,
};

on_both_backends!(no_error_answer_shows_internals);

/// Lower-case fragments that would mean an answer leaks how the service is built.
const INTERNALS: [&str; 18] = [
    "select ",
    "delete from",
    "insert into",
    "plantstore_",
    "sqlx",
    "sqlite",
    "postgres",
    "sqlstate",
    "constraint",
    "error returned from database",
    "panicked",
    "backtrace",
    "src/",
    ".rs:",
    "/tmp",
    "/root",
    "/home",
    "stack",
];

/// Drives every error status the service answers and searches each body and header.
async fn no_error_answer_shows_internals(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = spawn_app_on(db, |config| {
        config.serve.rate_limit = "50".parse().expect("a rate");
        config.serve.request_timeout = Duration::from_millis(700);
        config.db_acquire_timeout = Duration::from_secs(5);
    })
    .await;
    app.add_plants(&[1, 2]).await;
    app.db
        .execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, plant_id BIGINT REFERENCES plants (id)); INSERT INTO orders VALUES (1, 1);")
        .await;
    let url = |path: &str| format!("{}{path}", app.address);
    let mut answers = vec![
        app.delete("abc").await,                      // 400
        app.delete_with("2", None).await,             // 401
        app.delete_with("2", Some("pst_nope")).await, // 401 invalid_token
        app.delete("99").await,                       // 404 plant
        app.get("/nothing/here").await,               // 404 route
        app.client
            .request(Method::PUT, url("/plants/2"))
            .send()
            .await
            .expect("answer"), // 405
        app.delete("1").await,                        // 409
    ];
    // 503: the writer held past the request's deadline.
    let hold = app.db.hold_writes().await;
    answers.push(app.delete("2").await);
    hold.release().await;
    // 500: a table the service needs is gone.
    app.db.execute("DROP TABLE plantstore_deletions").await;
    answers.push(app.delete("2").await);
    // 429: past the rate limit.
    let burst = futures::future::join_all((0..80).map(|_| app.delete("99"))).await;
    answers.extend(
        burst
            .into_iter()
            .filter(|r| r.status() == StatusCode::TOO_MANY_REQUESTS)
            .take(1),
    );

    let mut statuses: Vec<u16> = answers.iter().map(|r| r.status().as_u16()).collect();
    statuses.sort_unstable();
    statuses.dedup();
    assert_eq!(statuses, [400, 401, 404, 405, 409, 429, 500, 503]);
    for answer in answers {
        let status = answer.status();
        let headers: Vec<String> = answer
            .headers()
            .iter()
            .map(|(name, value)| format!("{name}: {}", value.to_str().unwrap_or("")))
            .collect();
        let body = answer.text().await.expect("a body");
        for text in headers.iter().chain(std::iter::once(&body)) {
            let lower = text.to_lowercase();
            for internal in INTERNALS {
                assert!(
                    !lower.contains(internal),
                    "{status} shows {internal:?}: {text}"
                );
            }
        }
    }
}
