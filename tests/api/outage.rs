//! When the database cannot answer in time: 503 with `Retry-After`, nothing lost, and
//! recovery once it answers again.

use std::net::SocketAddr;

use reqwest::{StatusCode, header};
use sqlx::Executor;
use tokio::{
    net::{TcpListener, TcpStream},
    task::{JoinHandle, JoinSet},
};

use crate::helpers::{Backend, DbPool, TestDb, assert_error, spawn_app_on};

async fn assert_unavailable(response: reqwest::Response) {
    let retry_after = response.headers().get(header::RETRY_AFTER).cloned();
    assert_error(response, StatusCode::SERVICE_UNAVAILABLE).await;
    let seconds = retry_after.expect("Retry-After is sent");
    assert!(
        seconds
            .to_str()
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .is_some()
    );
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
    let DbPool::Sqlite(pool) = &app.db.pool else {
        unreachable!("a SQLite test")
    };
    let mut writer = pool.acquire().await.expect("a connection");
    writer
        .execute("BEGIN IMMEDIATE")
        .await
        .expect("take the write lock");

    assert_unavailable(app.delete("1").await).await;
    assert!(app.db.plant_exists(1).await);

    writer.execute("ROLLBACK").await.expect("release the lock");
    assert_eq!(app.delete("1").await.status(), StatusCode::NO_CONTENT);
}

/// PostgreSQL: the server becomes unreachable (a proxy in between is cut), then returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_unreachable_is_503_then_recovers() {
    let db = TestDb::new(Backend::Postgres).await;
    let (proxy, upstream) = Proxy::in_front_of(&db).await;
    let url = db.url_via(&proxy.address.to_string());
    let app = spawn_app_on(db, |config| {
        config.database_url = url.parse().unwrap_or_else(|never| match never {});
        config.db_acquire_timeout = std::time::Duration::from_millis(500);
    })
    .await;
    app.add_plants(&[1]).await;
    let address = proxy.address;

    proxy.cut();

    assert_unavailable(app.delete("1").await).await;
    assert_unavailable(app.get("/readyz").await).await;
    assert!(app.db.plant_exists(1).await);

    let _proxy = Proxy::start(address, upstream).await;
    assert_eq!(app.get("/readyz").await.status(), StatusCode::OK);
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
    let DbPool::Postgres(pool) = &app.db.pool else {
        unreachable!("a PostgreSQL test")
    };
    let mut holder = pool.begin().await.expect("a transaction");
    holder
        .execute("SELECT id FROM plants WHERE id = 1 FOR UPDATE")
        .await
        .expect("lock the row");

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
        config.database_url = url.parse().unwrap_or_else(|never| match never {});
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
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
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

/// A TCP forwarder whose cut closes every connection and refuses new ones.
struct Proxy {
    address: SocketAddr,
    task: JoinHandle<()>,
}

impl Proxy {
    /// A proxy on a free port in front of the test database's server; also returns the
    /// server's address, to start a proxy on the same port again later.
    async fn in_front_of(db: &TestDb) -> (Self, String) {
        let upstream = db
            .url
            .split_once('@')
            .and_then(|(_, rest)| rest.split_once('/'))
            .expect("host")
            .0
            .to_owned();
        let proxy = Self::start("127.0.0.1:0".parse().expect("addr"), upstream.clone()).await;
        (proxy, upstream)
    }

    async fn start(address: SocketAddr, upstream: String) -> Self {
        let listener = TcpListener::bind(address).await.expect("bind the proxy");
        let address = listener.local_addr().expect("proxy address");
        let task = tokio::spawn(async move {
            // Dropped with the task, which aborts every forwarded connection.
            let mut connections = JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                let upstream = upstream.clone();
                connections.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Self { address, task }
    }

    fn cut(self) {
        self.task.abort();
    }
}
