//! `Idempotency-Key`: a retry of a delete whose answer was lost gets its 204 again, and
//! nothing is deleted twice or by a key meant for another plant.

use std::time::Duration;

use futures::{FutureExt, future::join_all};
use reqwest::{Response, StatusCode};

use crate::{
    helpers::{
        Backend, TestDb, assert_error, eventually, serve_another, spawn_app, spawn_app_on,
        test_config,
    },
    on_both_backends,
};

on_both_backends!(
    a_retry_after_a_lost_response_gets_204_again,
    a_key_reused_for_another_plant_is_422_and_deletes_nothing,
    another_caller_with_the_same_key_is_independent,
    a_first_try_that_deleted_nothing_is_simply_tried_again,
    a_key_stops_replaying_after_the_ttl,
    concurrent_duplicates_on_two_instances_delete_once,
    a_group_commit_holding_several_keyed_requests_answers_each,
    malformed_keys_are_400_and_delete_nothing,
);

const REPLAYED: &str = "idempotent-replayed";

/// 204, and whether it says it was replayed.
fn assert_204(response: &Response) -> bool {
    assert_eq!(response.status(), StatusCode::NO_CONTENT, "{response:?}");
    match response.headers().get(REPLAYED) {
        None => false,
        Some(value) => {
            assert_eq!(value, "true");
            true
        }
    }
}

async fn a_retry_after_a_lost_response_gets_204_again(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[1]).await;

    assert!(!assert_204(&app.delete_keyed(1, "retry-1").await));
    assert!(assert_204(&app.delete_keyed(1, "retry-1").await));
    // The draft's quoted form names the same key.
    assert!(assert_204(&app.delete_keyed(1, "\"retry-1\"").await));
    // Without the key, the truth about the row.
    assert_error(app.delete_id(1).await, StatusCode::NOT_FOUND).await;

    assert_eq!(
        app.db.audit_log().await,
        vec![(1, "initial".to_owned(), Some("retry-1".to_owned()))],
        "one deletion, keeping its key"
    );
}

async fn a_key_reused_for_another_plant_is_422_and_deletes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[1, 2]).await;

    assert!(!assert_204(&app.delete_keyed(1, "k").await));
    let body = assert_error(
        app.delete_keyed(2, "k").await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;

    assert_eq!(
        body["message"],
        "This Idempotency-Key already deleted plant 1; use a new key to delete plant 2."
    );
    assert!(app.db.plant_exists(2).await, "plant 2 is kept");
    assert_eq!(app.db.audit_log().await.len(), 1);
}

async fn another_caller_with_the_same_key_is_independent(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[1, 2]).await;
    let other = app.new_token("other").await;

    assert!(!assert_204(&app.delete_keyed(1, "shared").await));
    // Not the other caller's key: plant 1 is simply gone, plant 2 is theirs to delete.
    assert_error(
        app.delete_keyed_with(1, "shared", &other).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert!(!assert_204(
        &app.delete_keyed_with(2, "shared", &other).await
    ));
    assert!(assert_204(
        &app.delete_keyed_with(2, "shared", &other).await
    ));

    assert_eq!(
        app.db.audit_log().await,
        vec![
            (1, "initial".to_owned(), Some("shared".to_owned())),
            (2, "other".to_owned(), Some("shared".to_owned())),
        ]
    );
}

async fn a_first_try_that_deleted_nothing_is_simply_tried_again(backend: Backend) {
    let app = spawn_app(backend).await;

    assert_error(app.delete_keyed(5, "late").await, StatusCode::NOT_FOUND).await;
    app.add_plants(&[5]).await;
    assert!(
        !assert_204(&app.delete_keyed(5, "late").await),
        "a real delete"
    );
    assert!(
        assert_204(&app.delete_keyed(5, "late").await),
        "now a replay"
    );
    assert_eq!(app.db.audit_log().await.len(), 1);
}

async fn a_key_stops_replaying_after_the_ttl(backend: Backend) {
    let app = spawn_app_on(TestDb::new(backend).await, |config| {
        config.serve.idempotency_ttl = Duration::from_secs(1);
    })
    .await;
    app.add_plants(&[1, 2]).await;

    assert!(!assert_204(&app.delete_keyed(1, "short").await));
    assert!(assert_204(&app.delete_keyed(1, "short").await));

    // Replays answer 204 until the key's second is up; then the plant is simply gone.
    let expired = eventually(Duration::from_secs(5), "the key expired", || async {
        let answer = app.delete_keyed(1, "short").await;
        (answer.status() == StatusCode::NOT_FOUND).then_some(answer)
    })
    .await;
    assert_error(expired, StatusCode::NOT_FOUND).await;
    // Expired, the key is free for another plant.
    assert!(!assert_204(&app.delete_keyed(2, "short").await));
    assert_eq!(app.db.audit_log().await.len(), 2);
}

async fn concurrent_duplicates_on_two_instances_delete_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let second_address = serve_another(&test_config(&app.db.url)).await;
    let ids: Vec<i64> = (1..=20).collect();
    app.add_plants(&ids).await;

    // Each plant: four tries with one key, two on each instance, all at once.
    let tries = ids.iter().flat_map(|&id| {
        [&app.address, &second_address, &app.address, &second_address].map(|address| {
            app.client
                .delete(format!("{address}/plants/{id}"))
                .bearer_auth(&app.token)
                .header("Idempotency-Key", format!("race-{id}"))
                .send()
        })
    });
    let answers = join_all(tries).await;

    let mut replays = 0;
    for answer in &answers {
        let answer = answer.as_ref().expect("an answer");
        replays += usize::from(assert_204(answer));
    }
    assert_eq!(
        replays,
        answers.len() - ids.len(),
        "one real delete per plant"
    );
    let log = app.db.audit_log().await;
    assert_eq!(log.len(), ids.len(), "one deletion per plant: {log:?}");
    for id in ids {
        assert!(!app.db.plant_exists(id).await);
    }
}

async fn a_group_commit_holding_several_keyed_requests_answers_each(backend: Backend) {
    let app = spawn_app_on(TestDb::new(backend).await, |config| {
        config.db_max_connections = 2;
        config.db_acquire_timeout = Duration::from_secs(10);
    })
    .await;
    app.add_plants(&[1, 2, 3, 4, 5, 6, 7, 100]).await;
    assert!(!assert_204(&app.delete_keyed(4, "used").await));

    // A blocker occupies the commit worker while the writes are held; the rest queue behind it and
    // go out in one commit. Requests reach the queue in no set order, so pairs whose
    // answers depend on it are checked as pairs.
    let hold = app.db.hold_writes().await;
    let blocker = app.delete_id(100);
    let batch = async {
        app.db.wait_for_blocked_commits(1).await;
        let answers = join_all([
            app.delete_keyed(1, "a").boxed(),
            app.delete_keyed(1, "a").boxed(),
            app.delete_keyed(2, "b").boxed(),
            app.delete_keyed(99, "c").boxed(),
            app.delete_keyed(3, "used").boxed(),
            app.delete_keyed(4, "used").boxed(),
            app.delete_id(5).boxed(),
            app.delete_keyed(6, "d").boxed(),
            app.delete_keyed(7, "d").boxed(),
        ]);
        let release = async {
            app.wait_until_queued(9).await;
            hold.release().await;
        };
        tokio::join!(answers, release).0
    };
    let (blocker, answers) = tokio::join!(blocker, batch);
    assert_eq!(blocker.status(), StatusCode::NO_CONTENT);

    let seen: Vec<(u16, bool)> = answers
        .iter()
        .map(|r| (r.status().as_u16(), r.headers().contains_key(REPLAYED)))
        .collect();
    let (ok, replayed) = ((204, false), (204, true));
    let mut twice_a = vec![seen[0], seen[1]];
    twice_a.sort();
    assert_eq!(
        twice_a,
        vec![ok, replayed],
        "plant 1 twice with key a: {seen:?}"
    );
    assert_eq!(
        &seen[2..7],
        &[ok, (404, false), (422, false), replayed, ok],
        "b on 2, c on no plant, 'used' on 3 and on 4, 5 without a key"
    );
    let mut key_d = vec![seen[7], seen[8]];
    key_d.sort();
    assert_eq!(
        key_d,
        vec![ok, (422, false)],
        "key d on plants 6 and 7: {seen:?}"
    );
    let d_deleted = if seen[7] == ok { 6 } else { 7 };
    assert!(!app.db.plant_exists(d_deleted).await);
    assert!(
        app.db.plant_exists(13 - d_deleted).await,
        "the 422 kept its plant"
    );
    assert!(app.db.plant_exists(3).await);

    let mut keys: Vec<(i64, Option<String>)> = app
        .db
        .audit_log()
        .await
        .into_iter()
        .map(|(plant, _, key)| (plant, key))
        .collect();
    keys.sort();
    let key = |k: &str| Some(k.to_owned());
    assert_eq!(
        keys,
        vec![
            (1, key("a")),
            (2, key("b")),
            (4, key("used")),
            (5, None),
            (d_deleted, key("d")),
            (100, None),
        ]
    );
}

async fn malformed_keys_are_400_and_delete_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[1]).await;
    let long = "k".repeat(256);
    for key in ["\"\"", "\"open", "\"a\"b\"", long.as_str(), "tab\there"] {
        let body = assert_error(app.delete_keyed(1, key).await, StatusCode::BAD_REQUEST).await;
        assert!(
            body["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("The Idempotency-Key header must be")),
            "{key:?}: {body}"
        );
    }
    let non_ascii = reqwest::header::HeaderValue::from_bytes(b"caf\xe9").expect("obs-text");
    let twice = app
        .delete_request("1")
        .bearer_auth(&app.token)
        .header("Idempotency-Key", "one")
        .header("Idempotency-Key", "two");
    let latin1 = app
        .delete_request("1")
        .bearer_auth(&app.token)
        .header("Idempotency-Key", non_ascii);
    for (what, request) in [("twice", twice), ("latin1", latin1)] {
        let answer = request.send().await.expect("an answer");
        assert_eq!(answer.status(), StatusCode::BAD_REQUEST, "{what}");
        assert_error(answer, StatusCode::BAD_REQUEST).await;
    }
    // Without a token, 401 comes first whatever the key.
    let anonymous = app
        .delete_request("1")
        .header("Idempotency-Key", "\"open")
        .send()
        .await
        .expect("an answer");
    assert_error(anonymous, StatusCode::UNAUTHORIZED).await;

    assert!(app.db.plant_exists(1).await);
    assert!(app.db.audit_log().await.is_empty());
}
