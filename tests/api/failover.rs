//! A PostgreSQL server named as libpq names a highly available one, by several hosts: the
//! first usable host serves, and when it goes away new connections go to the next one,
//! with no restart. (`tests/failover/` does the same on a real pg_auto_failover cluster.)

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::{
    fixtures::proxy::Proxy,
    helpers::{Backend, TestDb, spawn_app_on},
};

/// A host that refuses connections is passed over, at start and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_host_list_starts_on_the_first_host_that_answers() {
    let db = TestDb::new(Backend::Postgres).await;
    let (proxy, _) = Proxy::in_front_of(&db).await;
    let refusing = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let dead = refusing.local_addr().expect("address");
    drop(refusing);
    let url = format!(
        "{}?target_session_attrs=read-write",
        db.url_via(&format!("{dead},{}", proxy.address))
    );
    let app = spawn_app_on(db, |config| {
        config.database_url = url.parse().unwrap_or_else(|never| match never {});
    })
    .await;
    app.add_plants(&[1]).await;
    assert_eq!(app.delete("1").await.status(), StatusCode::NO_CONTENT);
    assert_eq!(app.get("/readyz").await.status(), StatusCode::OK);
}

/// Two hosts (two proxies in front of one server): the service uses the first; when it
/// is cut, answers are 503 (never a lost or phantom delete) until new connections go to
/// the second, which takes well under five seconds, and the service was never restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_when_the_host_in_use_fails_new_connections_go_to_the_next() {
    let db = TestDb::new(Backend::Postgres).await;
    let (first, _) = Proxy::in_front_of(&db).await;
    let (second, _) = Proxy::in_front_of(&db).await;
    let url = format!(
        "{}?target_session_attrs=read-write",
        db.url_via(&format!("{},{}", first.address, second.address))
    );
    let app = spawn_app_on(db, |config| {
        config.database_url = url.parse().unwrap_or_else(|never| match never {});
        config.db_acquire_timeout = Duration::from_millis(500);
    })
    .await;
    let ids: Vec<i64> = (1..=200).collect();
    app.add_plants(&ids).await;
    assert_eq!(app.delete("1").await.status(), StatusCode::NO_CONTENT);

    first.cut();
    let cut_at = Instant::now();
    let mut answers = Vec::new();
    let mut back_after = None;
    for id in 2..=200 {
        let status = app.delete_id(id).await.status();
        answers.push((id, status));
        match status {
            StatusCode::NO_CONTENT => {
                back_after = Some(cut_at.elapsed());
                break;
            }
            StatusCode::SERVICE_UNAVAILABLE => {}
            other => panic!("plant {id}: {other}"),
        }
        assert!(
            cut_at.elapsed() < Duration::from_secs(5),
            "no 204 within 5 s"
        );
    }
    let back_after = back_after.expect("deletes work again");
    eprintln!("204s again {back_after:?} after the first host was cut");
    assert_eq!(app.get("/readyz").await.status(), StatusCode::OK);
    for (id, status) in answers {
        let gone = !app.db.plant_exists(id).await;
        let audited = app.db.deletions(id).await.len();
        match status {
            StatusCode::NO_CONTENT => assert!(gone && audited == 1, "plant {id}"),
            _ => assert_eq!(gone, audited == 1, "plant {id}: gone exactly when audited"),
        }
    }
    drop(second);
}
