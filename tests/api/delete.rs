//! `DELETE /plants/{id}`: what a client with a valid token sees, and what the table keeps.

use std::collections::HashMap;

use reqwest::{StatusCode, header};

use plantstore::startup::Application;

use crate::{
    helpers::{Backend, assert_error, assert_request_id, spawn_app, test_config},
    on_both_backends,
};

on_both_backends!(
    deleting_a_plant_answers_204_and_audits_it,
    the_callers_request_id_is_echoed_and_audited,
    an_unknown_plant_is_404_and_nothing_changes,
    ids_that_are_not_int64_are_400,
    fifty_concurrent_deletes_of_one_id_give_one_204,
    a_failing_audit_write_is_500_and_keeps_the_plant,
    two_instances_on_one_database_answer_as_one,
);

async fn deleting_a_plant_answers_204_and_audits_it(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[1, 2]).await;

    let response = app.delete("1").await;

    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert!(response.headers().get(header::CONTENT_TYPE).is_none());
    let request_id = assert_request_id(&response);
    assert!(response.bytes().await.expect("body").is_empty());
    assert!(!app.db.plant_exists(1).await);
    assert!(app.db.plant_exists(2).await, "only the named plant goes");
    assert_eq!(
        app.db.deletions(1).await,
        vec![("initial".to_owned(), request_id)]
    );
}

async fn the_callers_request_id_is_echoed_and_audited(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[7, 8]).await;
    let send = |id: &'static str, request_id: &'static str| {
        app.client
            .delete(format!("{}/plants/{id}", app.address))
            .bearer_auth(&app.token)
            .header("x-request-id", request_id)
            .send()
    };

    let kept = send("7", "trace-7.abc:1").await.expect("answer");
    let replaced = send("8", "no spaces allowed").await.expect("answer");

    assert_eq!(assert_request_id(&kept), "trace-7.abc:1");
    assert_eq!(app.db.deletions(7).await[0].1, "trace-7.abc:1");
    let fresh = assert_request_id(&replaced);
    assert_ne!(fresh, "no spaces allowed");
    assert_eq!(app.db.deletions(8).await[0].1, fresh);
}

async fn an_unknown_plant_is_404_and_nothing_changes(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[1]).await;

    let body = assert_error(app.delete("2").await, StatusCode::NOT_FOUND).await;

    assert_eq!(body["message"], "No plant with id 2 exists.");
    assert!(app.db.plant_exists(1).await);
    assert!(app.db.deletions(2).await.is_empty());
}

async fn ids_that_are_not_int64_are_400(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[1]).await;

    for raw in [
        "abc",
        "1.5",
        "1e3",
        "9223372036854775808",
        "-9223372036854775809",
        "%201",
        "1%20",
        "0x1",
    ] {
        let response = app.delete(raw).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "id {raw:?}");
        assert_error(response, StatusCode::BAD_REQUEST).await;
    }
    assert!(app.db.plant_exists(1).await);
    // The extremes of int64 are valid ids: they parse, and simply do not exist.
    for raw in ["9223372036854775807", "-9223372036854775808", "0"] {
        assert_error(app.delete(raw).await, StatusCode::NOT_FOUND).await;
    }
}

async fn fifty_concurrent_deletes_of_one_id_give_one_204(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[42]).await;

    let answers = futures::future::join_all((0..50).map(|_| app.delete("42"))).await;

    let mut by_status: HashMap<StatusCode, usize> = HashMap::new();
    for answer in answers {
        *by_status.entry(answer.status()).or_default() += 1;
    }
    assert_eq!(
        by_status.get(&StatusCode::NO_CONTENT),
        Some(&1),
        "{by_status:?}"
    );
    assert_eq!(
        by_status.get(&StatusCode::NOT_FOUND),
        Some(&49),
        "{by_status:?}"
    );
    assert!(!app.db.plant_exists(42).await);
    assert_eq!(app.db.deletions(42).await.len(), 1);
}

async fn a_failing_audit_write_is_500_and_keeps_the_plant(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[3]).await;
    // Something the service cannot foresee: its audit table is gone.
    app.db.execute("DROP TABLE plantstore_deletions").await;

    let body = assert_error(app.delete("3").await, StatusCode::INTERNAL_SERVER_ERROR).await;

    assert!(
        app.db.plant_exists(3).await,
        "the delete and its audit row commit together or not at all"
    );
    let message = body["message"].as_str().unwrap_or_default().to_lowercase();
    for internal in ["plantstore_deletions", "sql", "table", "insert"] {
        assert!(!message.contains(internal), "no internals leak: {message}");
    }
}

async fn two_instances_on_one_database_answer_as_one(backend: Backend) {
    let first = spawn_app(backend).await;
    let second = Application::build(&test_config(&first.db.url))
        .await
        .expect("a second instance starts");
    assert_eq!(
        second.initial_token(),
        None,
        "the initial token is made once per database"
    );
    let second_address = format!("http://{}", second.address());
    tokio::spawn(second.run_until_stopped(std::future::pending()));
    first.add_plants(&[42]).await;

    let answers = futures::future::join_all((0..50).map(|n| {
        let base = if n % 2 == 0 {
            &first.address
        } else {
            &second_address
        };
        first
            .delete_request_at(base, "42")
            .bearer_auth(&first.token)
            .send()
    }))
    .await;

    let statuses: Vec<StatusCode> = answers
        .into_iter()
        .map(|a| a.expect("answer").status())
        .collect();
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::NO_CONTENT)
            .count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::NOT_FOUND)
            .count(),
        49,
        "{statuses:?}"
    );
    assert_eq!(first.db.deletions(42).await.len(), 1);
}
