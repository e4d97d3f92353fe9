//! A PostgreSQL server named as libpq names a highly available one, by several hosts: the
//! first usable host serves, and when it goes away new connections go to the next one,
//! with no restart. (`tests/deploy/failover.py` does the same on a real pg_auto_failover
//! cluster.)

use std::time::{Duration, Instant};

use plantstore::config::Config;
use reqwest::StatusCode;

use crate::{
    fixtures::proxy::Proxy,
    helpers::{Backend, TestApp, TestDb, spawn_app_on},
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
        config.database_url = url.into();
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
    let (app, first, _second) = two_hosts(|_| {}).await;
    first.cut();
    deletes_come_back(&app, "cut", Instant::now()).await;
    assert_eq!(app.get("/readyz").await.status(), StatusCode::OK);
}

/// As above, but the first request after the cut finds the token table's copy too old
/// to answer from, so the database failure it meets is the tokens' reload, not a delete:
/// that too moves new connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_failed_token_reload_also_moves_new_connections() {
    let (app, first, _second) = two_hosts(|_| {}).await;
    first.cut();
    let cut_at = Instant::now();
    // Past the token cache's longest age (800 ms): the next request waits for a reload.
    crate::helpers::fault_lasts(Duration::from_millis(1200)).await;
    deletes_come_back(&app, "cut", cut_at).await;
}

/// Two hosts; the first goes silent (its connections stay open, new ones are never
/// answered), as a host that died without a reset does. Requests then run out of time
/// rather than fail, and that too moves new connections to the second host. The acquire
/// timeout outlasts the request deadline, so only the deadline's 503s tell of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_when_the_host_in_use_goes_silent_new_connections_go_to_the_next() {
    let (app, first, _second) = two_hosts(|config| {
        config.serve.request_timeout = Duration::from_millis(800);
        config.db_acquire_timeout = Duration::from_secs(1);
    })
    .await;
    first.stall();
    deletes_come_back(&app, "stalled", Instant::now()).await;
}

/// An app on two hosts (two proxies in front of one server) with plants 1..=200, whose
/// plant 1 was deleted through the first.
async fn two_hosts(tweak: impl FnOnce(&mut Config)) -> (TestApp, Proxy, Proxy) {
    let db = TestDb::new(Backend::Postgres).await;
    let (first, _) = Proxy::in_front_of(&db).await;
    let (second, _) = Proxy::in_front_of(&db).await;
    let url = format!(
        "{}?target_session_attrs=read-write",
        db.url_via(&format!("{},{}", first.address, second.address))
    );
    let app = spawn_app_on(db, |config| {
        config.database_url = url.into();
        config.db_acquire_timeout = Duration::from_millis(500);
        tweak(config);
    })
    .await;
    let ids: Vec<i64> = (1..=200).collect();
    app.add_plants(&ids).await;
    assert_eq!(app.delete("1").await.status(), StatusCode::NO_CONTENT);
    (app, first, second)
}

/// Deletes plants 2, 3, … until one is 204, each answer 503 before that, the first 204
/// within 5 s of `since`; then checks that every answered plant is gone exactly when
/// audited, and each 204's plant is gone and audited once.
async fn deletes_come_back(app: &TestApp, what: &str, since: Instant) {
    let mut answers = Vec::new();
    for id in 2..=200 {
        let status = app.delete_id(id).await.status();
        answers.push((id, status));
        match status {
            StatusCode::NO_CONTENT => break,
            StatusCode::SERVICE_UNAVAILABLE => {}
            other => panic!("plant {id}: {other}"),
        }
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "no 204 within 5 s of the first host being {what}"
        );
    }
    eprintln!(
        "204s again {:?} after the first host was {what}",
        since.elapsed()
    );
    assert_eq!(
        answers.last().map(|(_, status)| *status),
        Some(StatusCode::NO_CONTENT),
        "deletes work again"
    );
    for (id, status) in answers {
        let gone = !app.db.plant_exists(id).await;
        let audited = app.db.deletions(id).await.len();
        match status {
            StatusCode::NO_CONTENT => assert!(gone && audited == 1, "plant {id}"),
            _ => assert_eq!(gone, audited == 1, "plant {id}: gone exactly when audited"),
        }
    }
}
