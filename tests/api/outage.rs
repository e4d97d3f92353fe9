//! When the database cannot answer in time: 503 with `Retry-After`, nothing lost, and
//! recovery once it answers again.

use reqwest::{StatusCode, header};

use crate::{
    fixtures::{proxy::Proxy, tmpfs::Tmpfs},
    helpers::{Backend, DbPool, TestDb, assert_error, spawn_app_on},
    on_both_backends,
};

on_both_backends!(
    a_request_past_its_deadline_is_503_on_time_and_loses_nothing,
    deletes_answered_503_commit_nothing_after_the_holder_lets_go,
);

pub async fn assert_unavailable(response: reqwest::Response) -> serde_json::Value {
    let retry_after = response.headers().get(header::RETRY_AFTER).cloned();
    let body = assert_error(response, StatusCode::SERVICE_UNAVAILABLE).await;
    let seconds = retry_after.expect("Retry-After is sent");
    assert!(
        seconds
            .to_str()
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .is_some()
    );
    body
}

/// One deadline covers the whole request: with the database held by another session for
/// longer than any of the service's waits, the answer is a 503 at the deadline, not after
/// the connection wait and the lock wait added up. Whatever the held commit does once it
/// is let go, the table and the audit agree.
async fn a_request_past_its_deadline_is_503_on_time_and_loses_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = spawn_app_on(db, |config| {
        config.serve.request_timeout = std::time::Duration::from_secs(1);
        config.db_acquire_timeout = std::time::Duration::from_secs(6);
    })
    .await;
    app.add_plants(&[1]).await;
    let hold = app.db.hold_writes().await;

    let started = std::time::Instant::now();
    let response = app.delete("1").await;
    let took = started.elapsed();

    let body = assert_unavailable(response).await;
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("in time")),
        "{body}"
    );
    // A correctness bound, not a speed target: about the deadline (a lock wait gives up a
    // tenth of it early, to leave time to answer), plus a wide margin.
    assert!(
        took >= std::time::Duration::from_millis(800) && took < std::time::Duration::from_secs(3),
        "answered after {took:?}"
    );
    hold.release().await;
    // A commit sent before the deadline could still land: none does.
    crate::helpers::nothing_happens_within(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        app.db.plant_exists(1).await,
        app.db.deletions(1).await.is_empty(),
        "gone exactly when audited"
    );
}

/// 64 deletes of one plant while another session holds it (PostgreSQL: its row, `FOR
/// UPDATE`; SQLite: the write lock) all answer 503 by their deadline. When the holder lets
/// go, none of them commits later: every wait they started ended with their deadline.
async fn deletes_answered_503_commit_nothing_after_the_holder_lets_go(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = spawn_app_on(db, |config| {
        config.serve.request_timeout = std::time::Duration::from_secs(1);
        config.db_acquire_timeout = std::time::Duration::from_secs(3);
    })
    .await;
    app.add_plants(&[1]).await;
    let row_holder = match backend {
        Backend::Postgres => Some(app.db.hold_row(1).await),
        Backend::Sqlite => None,
    };
    let write_holder = match backend {
        Backend::Sqlite => Some(app.db.hold_writes().await),
        Backend::Postgres => None,
    };

    let answers = futures::future::join_all((0..64).map(|_| app.delete("1"))).await;
    for answer in answers {
        assert_unavailable(answer).await;
    }

    if let Some(holder) = row_holder {
        holder.rollback().await.expect("let the row go");
    }
    if let Some(holder) = write_holder {
        holder.release().await;
    }
    // Longer than any wait the service allows itself (the connection wait, 3 s): a delete
    // still waiting on the hold would have committed by now.
    crate::helpers::nothing_happens_within(std::time::Duration::from_millis(3500)).await;
    assert!(app.db.plant_exists(1).await, "no 503 deleted the plant");
    assert!(app.db.deletions(1).await.is_empty(), "nothing audited");
    assert_eq!(app.delete("1").await.status(), StatusCode::NO_CONTENT);
}

/// SQLite: another writer holds the database past the wait the service allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_busy_past_the_timeout_is_503_then_recovers() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = spawn_app_on(db, |config| {
        config.db_acquire_timeout = std::time::Duration::from_millis(300)
    })
    .await;
    app.add_plants(&[1]).await;
    let writer = app.db.hold_writes().await;

    assert_unavailable(app.delete("1").await).await;
    assert!(app.db.plant_exists(1).await);

    writer.release().await;
    assert_eq!(app.delete("1").await.status(), StatusCode::NO_CONTENT);
}

/// SQLite on a filesystem that fills up: deletes answer 503 (the disk is full), none is
/// lost or made up, and once space is freed the file passes `PRAGMA integrity_check` and
/// deletes work again. Mounts a 2 MiB tmpfs, so it needs root (as CI has).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_full_disk_is_503_and_loses_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let mount = Tmpfs::mount(dir.path(), "2m");
    let app = spawn_app_on(TestDb::sqlite_in(dir).await, |_| {}).await;
    app.db
        .execute(
            "WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < 2000)
             INSERT INTO plants (id, name) SELECT n, 'fern' FROM seq",
        )
        .await;
    let filler = mount.fill();

    let ids: Vec<i64> = (1..=2000).collect();
    let mut answers = Vec::new();
    for chunk in ids.chunks(50) {
        let statuses = futures::future::join_all(chunk.iter().map(|id| app.delete_id(*id))).await;
        answers.extend(statuses.into_iter().map(|r| r.status()));
    }

    let full = answers
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert!(full > 0, "the disk filled up and deletes said so");
    for (id, status) in ids.iter().zip(&answers) {
        let gone = !app.db.plant_exists(*id).await;
        let audited = app.db.deletions(*id).await.len();
        match *status {
            StatusCode::NO_CONTENT => assert!(gone && audited == 1, "lost delete of {id}"),
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(gone, audited == 1, "plant {id}: gone exactly when audited")
            }
            other => panic!("plant {id}: {other}"),
        }
    }
    drop(filler);
    let DbPool::Sqlite(pool) = &app.db.pool else {
        unreachable!("a SQLite test")
    };
    let check: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(pool)
        .await
        .expect("integrity check");
    assert_eq!(check, "ok");
    let kept = ids
        .iter()
        .zip(&answers)
        .find(|(_, s)| **s == StatusCode::SERVICE_UNAVAILABLE)
        .map(|(id, _)| *id)
        .expect("a refused delete");
    let expected = if app.db.plant_exists(kept).await {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::NOT_FOUND
    };
    assert_eq!(app.delete_id(kept).await.status(), expected);
}

/// PostgreSQL: the server becomes unreachable (a proxy in between is cut), then returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_unreachable_is_503_then_recovers() {
    let db = TestDb::new(Backend::Postgres).await;
    let (proxy, upstream) = Proxy::in_front_of(&db).await;
    let url = db.url_via(&proxy.address.to_string());
    let app = spawn_app_on(db, |config| {
        config.database_url = url.into();
        config.db_acquire_timeout = std::time::Duration::from_millis(500);
    })
    .await;
    app.add_plants(&[1]).await;
    let address = proxy.address;
    // Several connections open and idle in the pool when the network goes: all dead after.
    let checks = (0..5).map(|_| app.get("/readyz"));
    for answer in futures::future::join_all(checks).await {
        assert_eq!(answer.status(), StatusCode::OK);
    }

    proxy.cut();

    assert_unavailable(app.delete("1").await).await;
    assert_unavailable(app.get("/readyz").await).await;
    assert!(app.db.plant_exists(1).await);

    // Back: not one request meets a connection the cut left dead.
    let _proxy = Proxy::start(address, upstream).await;
    let checks = (0..5).map(|_| app.get("/readyz"));
    for answer in futures::future::join_all(checks).await {
        assert_eq!(answer.status(), StatusCode::OK);
    }
    assert_eq!(app.delete("1").await.status(), StatusCode::NO_CONTENT);
}

/// PostgreSQL: another session holds the plant's row longer than the service waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_row_held_past_the_timeout_is_503_then_recovers() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = spawn_app_on(db, |config| {
        config.db_acquire_timeout = std::time::Duration::from_millis(500)
    })
    .await;
    app.add_plants(&[1]).await;
    let holder = app.db.hold_row(1).await;

    assert_unavailable(app.delete("1").await).await;
    assert!(app.db.plant_exists(1).await);

    holder.rollback().await.expect("release the row");
    assert_eq!(app.delete("1").await.status(), StatusCode::NO_CONTENT);
}

/// PostgreSQL: the connection is lost while a batch waits to commit. Nobody can know
/// whether the server went on to commit it, so its requests answer 503; whatever the
/// server did, the table and the audit agree (no lost delete, no phantom one), and the
/// same requests succeed once the database is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_connection_lost_mid_batch_answers_503_and_loses_nothing() {
    let db = TestDb::new(Backend::Postgres).await;
    let (proxy, upstream) = Proxy::in_front_of(&db).await;
    let address = proxy.address;
    let url = db.url_via(&address.to_string());
    let app = spawn_app_on(db, |config| {
        config.database_url = url.into();
        config.db_max_connections = 2;
        config.db_acquire_timeout = std::time::Duration::from_secs(2);
    })
    .await;
    let ids: Vec<i64> = (1..=5).collect();
    app.add_plants(&ids).await;
    let hold = app.db.hold_writes().await;

    let answers = futures::future::join_all(ids.iter().map(|id| app.delete_id(*id)));
    let cut = async {
        app.db.wait_for_blocked_commits(1).await;
        crate::helpers::fault_lasts(std::time::Duration::from_millis(200)).await;
        proxy.cut();
    };
    let (answers, ()) = tokio::join!(answers, cut);
    for answer in answers {
        assert_unavailable(answer).await;
    }
    hold.release().await;

    for id in &ids {
        assert_eq!(
            app.db.plant_exists(*id).await,
            app.db.deletions(*id).await.is_empty(),
            "plant {id}: gone exactly when audited"
        );
    }
    let _proxy = Proxy::start(address, upstream).await;
    for id in &ids {
        let expected = if app.db.plant_exists(*id).await {
            StatusCode::NO_CONTENT
        } else {
            StatusCode::NOT_FOUND
        };
        assert_eq!(app.delete_id(*id).await.status(), expected);
        assert!(!app.db.plant_exists(*id).await);
        assert_eq!(app.db.deletions(*id).await.len(), 1, "plant {id}");
    }
}

/// PostgreSQL: the database refuses new connections (`ALLOW_CONNECTIONS false`, the
/// service's sessions ended): an error while getting a connection is a 503, whatever its
/// SQLSTATE, and `/readyz` says so; both recover once connections are allowed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refusing_connections_is_503_then_recovers() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = spawn_app_on(db, |config| {
        config.db_acquire_timeout = std::time::Duration::from_millis(500)
    })
    .await;
    app.add_plants(&[1]).await;
    let name = app.db.postgres_name().to_owned();

    app.db
        .admin(format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false"))
        .await;
    app.db.terminate_service_sessions().await;

    assert_unavailable(app.delete("1").await).await;
    assert_unavailable(app.get("/readyz").await).await;
    assert!(app.db.plant_exists(1).await);

    app.db
        .admin(format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
        .await;
    recovers_to(StatusCode::OK, || app.get("/readyz")).await;
    recovers_to(StatusCode::NO_CONTENT, || app.delete("1")).await;
}

/// Once the database serves again: connections are not pinged before use, so each pooled
/// one that died answers one more 503 as it is found dead and replaced, never a 500;
/// after a few, the answer is `expected`.
pub async fn recovers_to<F, Fut>(expected: StatusCode, mut send: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = reqwest::Response>,
{
    for _ in 0..5 {
        let answer = send().await;
        if answer.status() == expected {
            return;
        }
        assert_unavailable(answer).await;
    }
    assert_eq!(send().await.status(), expected);
}

/// PostgreSQL: a server that takes no writes now (read-only after a failover, or in
/// recovery) answers 503 to deletes and to `/readyz`, and nothing is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_read_only_is_503_then_recovers() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = spawn_app_on(db, |_| {}).await;
    app.add_plants(&[1]).await;
    let name = app.db.postgres_name().to_owned();

    app.db
        .admin(format!(
            "ALTER DATABASE {name} SET default_transaction_read_only = on"
        ))
        .await;
    app.db.terminate_service_sessions().await;

    // The first meets the session the termination ended, the second a read-only one.
    assert_unavailable(app.delete("1").await).await;
    assert_unavailable(app.delete("1").await).await;
    assert_unavailable(app.get("/readyz").await).await;
    assert!(app.db.plant_exists(1).await);
    assert!(app.db.deletions(1).await.is_empty());

    app.db
        .admin(format!(
            "ALTER DATABASE {name} RESET default_transaction_read_only"
        ))
        .await;
    app.db.terminate_service_sessions().await;
    recovers_to(StatusCode::OK, || app.get("/readyz")).await;
    recovers_to(StatusCode::NO_CONTENT, || app.delete("1")).await;
}
