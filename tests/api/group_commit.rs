//! Group commit: requests that queue while a commit is in flight share the next one, and
//! each is still told the truth about its own row.

use std::{collections::HashMap, time::Duration};

use futures::future::join_all;
use reqwest::StatusCode;

use crate::{
    helpers::{Backend, TestApp, TestDb, assert_request_id, spawn_app_on},
    on_both_backends,
};

on_both_backends!(
    requests_queued_behind_a_commit_share_the_next_one,
    the_same_id_twice_in_one_batch_gives_one_204_and_one_404,
    a_referenced_row_fails_alone_and_its_batch_neighbours_are_deleted,
    a_mixed_burst_is_answered_truthfully,
);

/// One commit worker, and waits long enough that a held commit is never given up on.
async fn spawn_single_worker_app(db: TestDb) -> TestApp {
    spawn_app_on(db, |config| {
        config.db_max_connections = 2;
        config.db_acquire_timeout = Duration::from_secs(10);
    })
    .await
}

/// Sends `ids` while another session holds the writer, so that (after one blocker
/// request occupies the worker) they all queue and commit together once it lets go.
/// Returns (status, request id) per id, in order.
async fn delete_as_one_batch(
    app: &TestApp,
    blocker: i64,
    ids: &[i64],
) -> Vec<(StatusCode, String)> {
    let hold = app.db.hold_writes().await;
    let blocked = app.delete_id(blocker);
    let batch = async {
        app.db.wait_for_blocked_commits(1).await;
        let answers = join_all(ids.iter().map(|id| app.delete_id(*id)));
        let release = async {
            app.wait_until_queued(ids.len()).await;
            hold.release().await;
        };
        tokio::join!(answers, release).0
    };
    let (blocked, batch) = tokio::join!(blocked, batch);
    assert_eq!(blocked.status(), StatusCode::NO_CONTENT, "the blocker");
    batch
        .into_iter()
        .map(|response| (response.status(), assert_request_id(&response)))
        .collect()
}

async fn requests_queued_behind_a_commit_share_the_next_one(backend: Backend) {
    let app = spawn_single_worker_app(TestDb::new(backend).await).await;
    let ids: Vec<i64> = (1..=10).collect();
    app.add_plants(&[100]).await;
    app.add_plants(&ids).await;

    let answers = delete_as_one_batch(&app, 100, &ids).await;

    for (id, (status, request_id)) in ids.iter().zip(&answers) {
        assert_eq!(*status, StatusCode::NO_CONTENT, "plant {id}");
        assert!(!app.db.plant_exists(*id).await);
        assert_eq!(
            app.db.deletions(*id).await,
            vec![("initial".to_owned(), request_id.clone())],
            "each deletion is audited with its own request id"
        );
    }
    assert_eq!(
        app.db.distinct_commit_times(&ids).await,
        1,
        "the ten deletes were one commit"
    );
    assert_eq!(app.db.distinct_commit_times(&[100, 1]).await, 2);
}

async fn the_same_id_twice_in_one_batch_gives_one_204_and_one_404(backend: Backend) {
    let app = spawn_single_worker_app(TestDb::new(backend).await).await;
    app.add_plants(&[100, 5, 6]).await;

    let answers = delete_as_one_batch(&app, 100, &[5, 5, 6]).await;

    let mut for_five: Vec<StatusCode> = answers[..2].iter().map(|(s, _)| *s).collect();
    for_five.sort();
    assert_eq!(for_five, [StatusCode::NO_CONTENT, StatusCode::NOT_FOUND]);
    assert_eq!(answers[2].0, StatusCode::NO_CONTENT);
    let winner = answers[..2]
        .iter()
        .find(|(s, _)| *s == StatusCode::NO_CONTENT)
        .map(|(_, id)| id.clone())
        .expect("one 204");
    assert_eq!(
        app.db.deletions(5).await,
        vec![("initial".to_owned(), winner)],
        "one audit row, for the request that got the 204"
    );
    assert_eq!(app.db.distinct_commit_times(&[5, 6]).await, 1);
}

async fn a_referenced_row_fails_alone_and_its_batch_neighbours_are_deleted(backend: Backend) {
    let db = TestDb::new(backend).await;
    // One reference checked at once, one only at commit.
    db.execute(
        "CREATE TABLE plants (id BIGINT PRIMARY KEY, name TEXT NOT NULL, tag TEXT);
         CREATE TABLE orders (id BIGINT PRIMARY KEY, plant_id BIGINT REFERENCES plants (id));
         CREATE TABLE wishes (id BIGINT PRIMARY KEY,
             plant_id BIGINT REFERENCES plants (id) DEFERRABLE INITIALLY DEFERRED);
         INSERT INTO plants (id, name) VALUES (100, 'x'), (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd');
         INSERT INTO orders VALUES (10, 1);
         INSERT INTO wishes VALUES (20, 3);",
    )
    .await;
    let app = spawn_single_worker_app(db).await;

    let answers = delete_as_one_batch(&app, 100, &[1, 2, 3, 4]).await;

    let statuses: Vec<StatusCode> = answers.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        statuses,
        [
            StatusCode::CONFLICT,
            StatusCode::NO_CONTENT,
            StatusCode::CONFLICT,
            StatusCode::NO_CONTENT
        ]
    );
    for (id, kept) in [(1, true), (2, false), (3, true), (4, false)] {
        assert_eq!(app.db.plant_exists(id).await, kept, "plant {id}");
        assert_eq!(
            app.db.deletions(id).await.len(),
            usize::from(!kept),
            "audit of {id}"
        );
    }
}

/// Hits, repeats, misses and a referenced row, all at once: every answer matches the table.
async fn a_mixed_burst_is_answered_truthfully(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = spawn_app_on(db, |_| {}).await;
    let existing: Vec<i64> = (1..=100).collect();
    app.add_plants(&existing).await;
    app.db
        .execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, plant_id BIGINT REFERENCES plants (id)); INSERT INTO orders VALUES (1, 50);")
        .await;
    let requests: Vec<i64> = existing
        .iter()
        .copied()
        .chain(1..=20)
        .chain(1000..1020)
        .collect();

    let answers = join_all(requests.iter().map(|id| app.delete_id(*id))).await;

    let mut by_id: HashMap<i64, Vec<(StatusCode, String)>> = HashMap::new();
    for (id, response) in requests.iter().zip(answers) {
        let request_id = assert_request_id(&response);
        by_id
            .entry(*id)
            .or_default()
            .push((response.status(), request_id));
    }
    for (id, answers) in by_id {
        let statuses: Vec<StatusCode> = answers.iter().map(|(s, _)| *s).collect();
        let deleted: Vec<&String> = answers
            .iter()
            .filter(|(s, _)| *s == StatusCode::NO_CONTENT)
            .map(|(_, r)| r)
            .collect();
        let audit: Vec<String> = app
            .db
            .deletions(id)
            .await
            .into_iter()
            .map(|(_, r)| r)
            .collect();
        match id {
            50 => assert_eq!(statuses, [StatusCode::CONFLICT], "referenced"),
            1000.. => assert_eq!(statuses, [StatusCode::NOT_FOUND], "missing {id}"),
            _ => {
                assert_eq!(deleted.len(), 1, "plant {id}: {statuses:?}");
                assert!(
                    statuses
                        .iter()
                        .all(|s| [StatusCode::NO_CONTENT, StatusCode::NOT_FOUND].contains(s)),
                    "plant {id}: {statuses:?}"
                );
                assert_eq!(audit, [deleted[0].clone()], "plant {id}");
            }
        }
        assert_eq!(app.db.plant_exists(id).await, id == 50, "plant {id}");
    }
}

/// PostgreSQL: a row another session holds (`FOR UPDATE`) waits alone; the rest of the
/// traffic is answered meanwhile, through the same single commit worker, and the held
/// delete completes once the row is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_held_row_does_not_stall_its_neighbours() {
    let app = spawn_single_worker_app(TestDb::new(Backend::Postgres).await).await;
    let neighbours: Vec<i64> = (2..=21).collect();
    app.add_plants(&[1]).await;
    app.add_plants(&neighbours).await;
    let holder = app.db.hold_row(1).await;

    let held = tokio::spawn({
        let (client, address, token) = (app.client.clone(), app.address.clone(), app.token.clone());
        async move {
            client
                .delete(format!("{address}/plants/1"))
                .bearer_auth(token)
                .send()
                .await
                .map(|r| r.status())
        }
    });
    app.db.wait_for_blocked_commits(1).await;
    // Sequential and concurrent traffic both get through while the row is held.
    for id in &neighbours[..10] {
        assert_eq!(app.delete_id(*id).await.status(), StatusCode::NO_CONTENT);
    }
    let burst = join_all(neighbours[10..].iter().map(|id| app.delete_id(*id))).await;
    assert!(burst.iter().all(|r| r.status() == StatusCode::NO_CONTENT));
    assert!(
        !held.is_finished(),
        "the held delete is still waiting for its row"
    );

    holder.rollback().await.expect("release the row");
    let status = held.await.expect("task").expect("answer");
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(!app.db.plant_exists(1).await);
    assert_eq!(app.db.deletions(1).await.len(), 1);
}
