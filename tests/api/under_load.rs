//! PostgreSQL faults while 64 clients delete: sessions killed, the server killed and
//! started again, the server turned read-only. Every answer is a 204 or a 503, and every
//! one agrees with the table afterwards.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use reqwest::StatusCode;
use tokio::task::JoinHandle;

use crate::{
    fixtures::pg_server::PgServer,
    helpers::{DbPool, TestApp, TestDb, spawn_app_on},
    outage::recovers_to,
};

const CLIENTS: i64 = 64;
const PLANTS: i64 = 20_000;
/// A plant outside the load's range, deleted once the fault is over to show recovery.
const AFTERWARDS: i64 = 1_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sessions_killed_under_load_lose_nothing() {
    let app = seeded_app(TestDb::new(crate::helpers::Backend::Postgres).await).await;
    let name = app.db.postgres_name().to_owned();

    let answers = under_load(&app, async {
        app.db
            .admin(format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false"))
            .await;
        app.db.terminate_service_sessions().await;
        crate::helpers::fault_lasts(Duration::from_secs(1)).await;
        app.db
            .admin(format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
            .await;
    })
    .await;

    assert_agrees_with_table(&app, &answers).await;
}

/// The server itself is killed (`pg_ctl stop -m immediate`) and started again a second
/// later, so the service's connections die and new ones are refused meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_under_load_loses_nothing() {
    let server = PgServer::start();
    let app = seeded_app(TestDb::postgres_on(server.admin_url()).await).await;

    let answers = under_load(&app, async {
        tokio::task::block_in_place(|| server.stop_immediately());
        crate::helpers::fault_lasts(Duration::from_secs(1)).await;
        tokio::task::block_in_place(|| server.start_again());
    })
    .await;

    assert_agrees_with_table(&app, &answers).await;
}

/// The server turns read-only for a second, as a primary demoted in a failover does
/// (`default_transaction_read_only`, which live sessions pick up on reload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_read_only_under_load_loses_nothing() {
    let server = PgServer::start();
    let app = seeded_app(TestDb::postgres_on(server.admin_url()).await).await;

    let answers = under_load(&app, async {
        read_only(&app.db, true).await;
        crate::helpers::fault_lasts(Duration::from_secs(1)).await;
        read_only(&app.db, false).await;
    })
    .await;

    assert_agrees_with_table(&app, &answers).await;
}

async fn read_only(db: &TestDb, on: bool) {
    let setting = if on { "on" } else { "off" };
    // Two calls: ALTER SYSTEM may not share a (implicit) transaction.
    db.admin(format!(
        "ALTER SYSTEM SET default_transaction_read_only = {setting}"
    ))
    .await;
    db.admin("SELECT pg_reload_conf()".to_owned()).await;
}

/// The service on a table of `PLANTS` plants and one more, with a short connection wait
/// so a dead server is noticed quickly.
async fn seeded_app(db: TestDb) -> TestApp {
    db.execute(
        "CREATE TABLE plants (id BIGINT PRIMARY KEY, name TEXT NOT NULL, tag TEXT);
         INSERT INTO plants (id, name) SELECT n, 'fern' FROM generate_series(1, 20000) AS n;
         INSERT INTO plants (id, name) VALUES (1000000, 'fern');",
    )
    .await;
    spawn_app_on(db, |config| {
        config.db_acquire_timeout = Duration::from_millis(500)
    })
    .await
}

/// Runs `fault` half a second into the load, lets the load go on for a second after it,
/// and returns every (plant id, status) answered. The fault is over by then, so a fresh
/// delete must go through.
async fn under_load(app: &TestApp, fault: impl Future<Output = ()>) -> Vec<(i64, StatusCode)> {
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<JoinHandle<Vec<(i64, StatusCode)>>> = (1..=CLIENTS)
        .map(|first| {
            let (http, base, token) = (app.client.clone(), app.address.clone(), app.token.clone());
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let mut answers = Vec::new();
                let mut id = first;
                while id <= PLANTS && !stop.load(Ordering::Relaxed) {
                    let status = http
                        .delete(format!("{base}/plants/{id}"))
                        .bearer_auth(&token)
                        .send()
                        .await
                        .map(|r| r.status());
                    answers.push((id, status.expect("the server answers")));
                    id += CLIENTS;
                }
                answers
            })
        })
        .collect();
    crate::helpers::fault_lasts(Duration::from_millis(500)).await;
    fault.await;
    crate::helpers::fault_lasts(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    for client in clients {
        answers.extend(client.await.expect("client task"));
    }
    recovers_to(StatusCode::NO_CONTENT, || app.delete_id(AFTERWARDS)).await;
    answers
}

/// No 204 whose row is still there, no row gone without exactly one audit row, nothing
/// gone that nobody asked for; and the fault was felt (some 503s) between deletes that
/// went through.
async fn assert_agrees_with_table(app: &TestApp, answers: &[(i64, StatusCode)]) {
    let DbPool::Postgres(pool) = &app.db.pool else {
        unreachable!("a PostgreSQL test")
    };
    let left: HashSet<i64> = sqlx::query_scalar("SELECT id FROM plants")
        .fetch_all(pool)
        .await
        .expect("plants")
        .into_iter()
        .collect();
    let mut audited: HashMap<i64, i64> = HashMap::new();
    let audit: Vec<i64> = sqlx::query_scalar("SELECT plant_id FROM plantstore_deletions")
        .fetch_all(pool)
        .await
        .expect("audit");
    for id in audit {
        *audited.entry(id).or_default() += 1;
    }
    let count = |status: StatusCode| answers.iter().filter(|(_, s)| *s == status).count();
    assert!(count(StatusCode::NO_CONTENT) > 0, "deletes went through");
    assert!(
        count(StatusCode::SERVICE_UNAVAILABLE) > 0,
        "the fault was felt"
    );
    assert_eq!(
        count(StatusCode::NO_CONTENT) + count(StatusCode::SERVICE_UNAVAILABLE),
        answers.len(),
        "only 204s and 503s"
    );
    for (id, status) in answers {
        let gone = !left.contains(id);
        let audits = audited.get(id).copied().unwrap_or(0);
        assert!(audits <= 1, "plant {id} audited {audits} times");
        if *status == StatusCode::NO_CONTENT {
            assert!(gone && audits == 1, "lost delete of plant {id}");
        } else {
            assert_eq!(gone, audits == 1, "plant {id}: gone exactly when audited");
        }
    }
    let asked: HashSet<i64> = answers.iter().map(|(id, _)| *id).collect();
    for id in (1..=PLANTS).filter(|id| !asked.contains(id)) {
        assert!(
            left.contains(&id) && !audited.contains_key(&id),
            "phantom delete of {id}"
        );
    }
    eprintln!(
        "{} answers: {} × 204, {} × 503",
        answers.len(),
        count(StatusCode::NO_CONTENT),
        count(StatusCode::SERVICE_UNAVAILABLE)
    );
}
