//! Slow, idle and oversized clients: cut off after the idle or header timeout, refused in
//! the `Error` shape when a head is too large, capped in number, and everyone else still
//! served meanwhile.

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
    let app =
        spawn_with(|config| config.serve.connections.idle_timeout = Duration::from_secs(1)).await;
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
        config.serve.connections.idle_timeout = Duration::from_secs(1);
        config.serve.connections.max_connections = 2;
    })
    .await;
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(TcpStream::connect(host(&app)).await.expect("connect"));
    }
    // The two idle connections stay open, holding both slots.
    crate::helpers::nothing_happens_within(Duration::from_millis(200)).await;

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

/// What a raw HTTP/1.1 exchange got back: status, lower-cased headers and the body, with
/// the connection read to its end.
struct RawAnswer {
    status: u16,
    headers: Vec<(String, String)>,
    body: serde_json::Value,
}

impl RawAnswer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The answer in the service's `Error` shape, for `status`.
    fn assert_error(&self, status: u16) {
        assert_eq!(self.status, status, "{:?}", self.body);
        assert_eq!(self.header("content-type"), Some("application/json"));
        assert!(self.header("x-request-id").is_some_and(|id| id.len() == 36));
        assert_eq!(self.header("connection"), Some("close"));
        assert_eq!(self.body["error"], status);
        let message = self.body["message"].as_str().expect("a message");
        assert!(message.ends_with('.'), "{message}");
        assert_eq!(self.body.as_object().map(|o| o.len()), Some(2));
    }
}

/// Sends `parts` with `pause` between them while reading the answer, until the server
/// closes the connection (sending stops quietly once the server stops reading).
async fn raw_exchange(app: &TestApp, parts: Vec<Vec<u8>>, pause: Duration) -> RawAnswer {
    let stream = TcpStream::connect(host(app)).await.expect("connect");
    let (mut read, mut write) = stream.into_split();
    let sender = tokio::spawn(async move {
        for part in parts {
            if write.write_all(&part).await.is_err() {
                return;
            }
            tokio::time::sleep(pause).await;
        }
        // Holds the connection open, as a slow client would.
        std::future::pending::<()>().await;
    });
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), read.read_to_end(&mut raw))
        .await
        .expect("the server closes the connection")
        .expect("read the answer");
    sender.abort();
    let text = String::from_utf8(raw).expect("an ASCII answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole answer");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|line| line.split_once(": "))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned()))
        .collect();
    let body = serde_json::from_str(body).expect("a JSON body");
    RawAnswer {
        status,
        headers,
        body,
    }
}

/// A header trickled in a line at a time (each well inside the idle timeout) is cut off
/// at the header timeout with a 408 in the `Error` shape; others are served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_head_gets_408_at_the_header_timeout() {
    let app =
        spawn_with(|config| config.serve.connections.header_timeout = Duration::from_secs(1)).await;
    let mut parts = vec![b"DELETE /plants/1 HTTP/1.1\r\nHost: plantstore\r\n".to_vec()];
    parts.extend((0..100).map(|n| format!("x-slow-{n}: 1\r\n").into_bytes()));

    let started = Instant::now();
    let (answer, others) = tokio::join!(
        raw_exchange(&app, parts, Duration::from_millis(100)),
        app.get("/healthz")
    );

    answer.assert_error(408);
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed < Duration::from_millis(1800),
        "{elapsed:?}"
    );
    assert_eq!(others.status(), StatusCode::OK);
}

/// A 1 MB header, more header lines than hyper takes, or an overlong request line: each
/// answered by the service in the `Error` shape, not hyper's bare status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_get_the_error_shape() {
    let app = spawn_with(|_| {}).await;
    let huge = format!(
        "DELETE /plants/1 HTTP/1.1\r\nHost: plantstore\r\nx-big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    raw_exchange(&app, vec![huge.into_bytes()], Duration::ZERO)
        .await
        .assert_error(431);

    let mut many = String::from("DELETE /plants/1 HTTP/1.1\r\nHost: plantstore\r\n");
    many.extend((0..100).map(|n| format!("x-h{n}: 1\r\n")));
    many.push_str("\r\n");
    raw_exchange(&app, vec![many.into_bytes()], Duration::ZERO)
        .await
        .assert_error(431);

    let long = format!(
        "DELETE /plants/{} HTTP/1.1\r\nHost: plantstore\r\n\r\n",
        "1".repeat(100_000)
    );
    raw_exchange(&app, vec![long.into_bytes()], Duration::ZERO)
        .await
        .assert_error(414);

    assert_eq!(app.get("/healthz").await.status(), StatusCode::OK);
}

/// A head at the limits (100 header lines) is served, and so are two requests sent
/// in one write on one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_within_the_limits_are_served_back_to_back() {
    let app = spawn_with(|_| {}).await;
    app.add_plants(&[1]).await;
    let mut head = format!(
        "DELETE /plants/1 HTTP/1.1\r\nHost: plantstore\r\nAuthorization: Bearer {}\r\n",
        app.token
    );
    head.extend((0..98).map(|n| format!("x-h{n}: 1\r\n")));
    head.push_str("\r\n");
    let second = "DELETE /plants/1 HTTP/1.1\r\nHost: plantstore\r\nConnection: close\r\n\r\n";

    let mut stream = TcpStream::connect(host(&app)).await.expect("connect");
    stream
        .write_all(format!("{head}{second}").as_bytes())
        .await
        .expect("send both");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("both answered")
        .expect("read");
    let text = String::from_utf8_lossy(&raw);
    let statuses: Vec<&str> = text
        .match_indices("HTTP/1.1 ")
        .map(|(at, _)| &text[at + 9..at + 12])
        .collect();
    assert_eq!(statuses, ["204", "401"], "{text}");
    assert!(!app.db.plant_exists(1).await);
}
