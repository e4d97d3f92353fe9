//! Slow and idle clients: cut off after the idle timeout, capped in number, and everyone
//! else still served meanwhile.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::helpers::{Backend, TestApp, TestDb, spawn_app_on};

async fn spawn_with(tweak: impl FnOnce(&mut plantstore::config::Config)) -> TestApp {
    spawn_app_on(TestDb::new(Backend::Sqlite).await, tweak).await
}

fn host(app: &TestApp) -> &str {
    app.address.trim_start_matches("http://")
}

/// Waits for the server to close a connection: a read that ends (end of stream or reset)
/// instead of waiting; a response would be a failure.
async fn closed_by_server(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_headers_are_cut_off_and_others_are_still_served() {
    let app = spawn_with(|config| config.idle_timeout = Duration::from_secs(1)).await;
    let mut slow = Vec::new();
    for _ in 0..200 {
        let mut stream = TcpStream::connect(host(&app)).await.expect("connect");
        stream
            .write_all(b"DELETE /plants/1 HTTP/1.1\r\nHost: plantstore\r\nAuthoriz")
            .await
            .expect("half a header");
        slow.push(stream);
    }

    assert_eq!(app.get("/healthz").await.status(), StatusCode::OK);
    assert_eq!(app.delete("1").await.status(), StatusCode::NOT_FOUND);

    for stream in &mut slow {
        assert!(closed_by_server(stream, Duration::from_secs(10)).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_for_a_free_slot() {
    let app = spawn_with(|config| {
        config.idle_timeout = Duration::from_secs(1);
        config.max_connections = 2;
    })
    .await;
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(TcpStream::connect(host(&app)).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    let response = app.get("/healthz").await;

    // Served, but only once an idle connection had been closed to make room.
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    let mut closed = 0;
    for stream in &mut idle {
        if closed_by_server(stream, Duration::from_millis(100)).await {
            closed += 1;
        }
    }
    assert!(closed >= 1, "no idle connection was closed");
}
