//! The `plantstore` binary as a user runs it: commands, bad settings, signals.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use reqwest::StatusCode;
use sqlx::{Executor, SqlitePool};

use crate::fixtures::otlp::{Received, otlp_receiver};

fn plantstore(dir: &Path, database_url: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_plantstore"));
    // A clean environment in an empty folder: no stray DATABASE_URL, no .env.
    command
        .env_clear()
        .env("DATABASE_URL", database_url)
        .env("PLANTSTORE_DB_ACQUIRE_TIMEOUT", "1s")
        .current_dir(dir);
    command
}

/// Runs one command to completion, as a user at a shell would.
fn run(dir: &Path, database_url: &str, args: &[&str]) -> Output {
    plantstore(dir, database_url)
        .args(args)
        .output()
        .expect("run plantstore")
}

fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}?mode=rwc", dir.join("plantstore.db").display())
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn token_create_prints_the_token_alone_on_the_last_line_and_list_never_shows_it() {
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());
    assert!(run(dir.path(), &url, &["migrate"]).status.success());

    let created = run(
        dir.path(),
        &url,
        &["token", "create", "--name", "ci", "--expires-in", "90d"],
    );
    let again = run(dir.path(), &url, &["token", "create", "--name", "ci"]);
    // Past 9999 SQLite's times as text would sort wrong; such an expiry is refused.
    let far = run(
        dir.path(),
        &url,
        &[
            "token",
            "create",
            "--name",
            "far",
            "--expires-in",
            "8000years",
        ],
    );
    let listed = run(dir.path(), &url, &["token", "list"]);
    let revoked = run(dir.path(), &url, &["token", "revoke", "ci"]);
    let unknown = run(dir.path(), &url, &["token", "revoke", "nobody"]);
    let relisted = run(dir.path(), &url, &["token", "list"]);

    assert!(created.status.success(), "{}", stderr(&created));
    let token = stdout(&created)
        .lines()
        .last()
        .expect("a last line")
        .to_owned();
    assert!(token.starts_with("pst_") && !token.contains(' '), "{token}");
    assert!(!again.status.success());
    assert_eq!(
        stderr(&again).trim(),
        "plantstore: a token named 'ci' already exists"
    );
    assert_eq!(
        stderr(&far).trim(),
        "plantstore: the expiry is too far in the future"
    );
    let list = stdout(&listed);
    assert!(list.contains("NAME") && list.contains("ci "), "{list}");
    assert!(!list.contains(&token[4..]), "never the secret");
    assert!(revoked.status.success());
    assert!(!unknown.status.success());
    assert_eq!(stderr(&unknown).lines().count(), 1);
    let ci_row = stdout(&relisted)
        .lines()
        .find(|l| l.starts_with("ci "))
        .map(str::to_owned)
        .expect("row");
    assert_eq!(
        ci_row
            .split_whitespace()
            .filter(|cell| *cell != "-")
            .count(),
        4,
        "created, expires, revoked: {ci_row}"
    );
}

#[test]
fn seed_adds_only_missing_plants_and_migrate_prepares_the_schema() {
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());

    let migrated = run(dir.path(), &url, &["migrate"]);
    let first = run(dir.path(), &url, &["seed", "--count", "3"]);
    let second = run(dir.path(), &url, &["seed", "--count", "5"]);
    let zero = run(dir.path(), &url, &["seed", "--count", "0"]);

    assert!(migrated.status.success(), "{}", stderr(&migrated));
    assert!(stdout(&first).contains("added 3 "), "{}", stdout(&first));
    assert!(stdout(&second).contains("added 2 "), "{}", stdout(&second));
    assert!(!zero.status.success());
    assert_eq!(stderr(&zero).lines().count(), 1, "{}", stderr(&zero));
}

/// Output into a pipe whose reader has gone (`| head -1`, done reading): each command still
/// does its work and ends as it would have, with no panic.
#[test]
fn output_to_a_reader_that_went_away_is_no_failure() {
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());
    let commands: [&[&str]; 6] = [
        &["migrate"],
        &["openapi"],
        &["openapi", "--format", "yaml"],
        &["completions", "bash"],
        &["token", "create", "--name", "piped"],
        &["deletions", "list", "--json"],
    ];
    for args in commands {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let output = plantstore(dir.path(), &url)
            .args(args)
            .stdout(writer)
            .output()
            .expect("run plantstore");
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        assert!(
            !stderr(&output).contains("panicked"),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    let listed = run(dir.path(), &url, &["token", "list"]);
    assert!(stdout(&listed).contains("piped"), "{}", stdout(&listed));
}

/// Every command migrates first; on PostgreSQL that raises notices ("relation … already
/// exists, skipping") that said nothing a user needs, on every `docker compose exec`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_on_postgres_print_no_migration_notices() {
    let db = crate::helpers::TestDb::new(crate::helpers::Backend::Postgres).await;
    let dir = tempfile::tempdir().expect("dir");
    let first = run(dir.path(), &db.url, &["migrate"]);
    let again = run(dir.path(), &db.url, &["seed", "--count", "2"]);

    assert!(
        first.status.success() && again.status.success(),
        "{again:?}"
    );
    assert_eq!(
        stdout(&again).trim(),
        "added 2 missing demo plants with ids 1..=2"
    );
    assert_eq!(
        stderr(&again),
        "",
        "nothing on stderr at the default RUST_LOG"
    );
}

#[test]
fn bad_configuration_ends_with_one_clear_line_and_no_panic() {
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());
    let cases: [(&str, &str, &str, &str); 18] = [
        (
            "DATABASE_URL",
            "mysql://root@localhost/plants",
            "unknown scheme 'mysql'",
            "",
        ),
        ("DATABASE_URL", "plantstore.db", "not a URL", ""),
        (
            "DATABASE_URL",
            "postgres://app:hunter2@db1:5432,db2:99999/plants?target_session_attrs=read-write",
            "host 2 has an invalid port number",
            "hunter2",
        ),
        (
            "DATABASE_URL",
            "postgres://app:hunter2@127.0.0.1:1/plants",
            "cannot open the database",
            "hunter2",
        ),
        (
            "DATABASE_URL",
            "sqlite:///no/such/folder/p.db?mode=rwc",
            "cannot open the database",
            "",
        ),
        (
            "PLANTSTORE_LISTEN",
            "not-an-address",
            "invalid value 'not-an-address' for PLANTSTORE_LISTEN",
            "",
        ),
        (
            "PLANTSTORE_DB_ACQUIRE_TIMEOUT",
            "soon",
            "invalid value 'soon' for PLANTSTORE_DB_ACQUIRE_TIMEOUT",
            "",
        ),
        (
            "PLANTSTORE_SHUTDOWN_DELAY",
            "-2s",
            "invalid value '-2s' for PLANTSTORE_SHUTDOWN_DELAY",
            "",
        ),
        ("PLANTSTORE_MIGRATE", "false", "plants.id", ""),
        (
            "PLANTSTORE_JWT_SECRET",
            "too-short-secret",
            "PLANTSTORE_JWT_SECRET must be at least 32 bytes",
            "too-short-secret",
        ),
        (
            "PLANTSTORE_JWT_PUBLIC_KEY",
            "/no/such/key.pem",
            "cannot read PLANTSTORE_JWT_PUBLIC_KEY /no/such/key.pem",
            "",
        ),
        (
            "PLANTSTORE_CORS_ALLOWED_ORIGINS",
            "https://shop.example,shop.example",
            "'shop.example' is not an origin",
            "",
        ),
        (
            "PLANTSTORE_ADMIN_LISTEN",
            "9090",
            "such as 127.0.0.1:9090",
            "",
        ),
        (
            "PLANTSTORE_WEBHOOK_TIMEOUT",
            "fast",
            "invalid value 'fast' for PLANTSTORE_WEBHOOK_TIMEOUT",
            "",
        ),
        (
            "PLANTSTORE_WEBHOOK_RETRY_MIN",
            "2h",
            "PLANTSTORE_WEBHOOK_RETRY_MIN must be above zero and at most PLANTSTORE_WEBHOOK_RETRY_MAX",
            "",
        ),
        (
            "PLANTSTORE_WEBHOOK_RETRY_MIN",
            "0s",
            "PLANTSTORE_WEBHOOK_RETRY_MIN must be above zero and at most PLANTSTORE_WEBHOOK_RETRY_MAX",
            "",
        ),
        (
            "PLANTSTORE_DELETION_RETENTION",
            "0s",
            "invalid value '0s' for PLANTSTORE_DELETION_RETENTION",
            "",
        ),
        (
            "PLANTSTORE_DELETION_RETENTION",
            "1h",
            "PLANTSTORE_DELETION_RETENTION (1h) must be at least PLANTSTORE_IDEMPOTENCY_TTL (1day)",
            "",
        ),
    ];
    for (variable, value, expected, never) in cases {
        let output = plantstore(dir.path(), &url)
            .env(variable, value)
            .arg("serve")
            .output()
            .expect("run");
        let err = stderr(&output);
        assert!(!output.status.success(), "{variable}={value}");
        assert_eq!(err.lines().count(), 1, "{variable}={value}: {err}");
        assert!(
            err.starts_with("plantstore: ") && err.contains(expected),
            "{variable}={value}: {err}"
        );
        assert!(!err.contains("panicked"));
        if !never.is_empty() {
            assert!(!err.contains(never), "no secrets in errors: {err}");
        }
    }
}

/// Starts `plantstore serve` on a free port, its logs going to `dir/stderr.log`; returns
/// the child, its stdout banner (up to the Swagger UI line) and the base URL.
fn serve(dir: &Path, database_url: &str) -> (Child, Vec<String>, String) {
    serve_with(plantstore(dir, database_url), dir)
}

fn serve_with(mut command: Command, dir: &Path) -> (Child, Vec<String>, String) {
    let log = std::fs::File::create(dir.join("stderr.log")).expect("log file");
    let mut child = command
        .env("PLANTSTORE_LISTEN", "127.0.0.1:0")
        .env("PLANTSTORE_DB_ACQUIRE_TIMEOUT", "10s")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("start");
    let mut lines = Vec::new();
    let reader = BufReader::new(child.stdout.take().expect("stdout"));
    for line in reader.lines() {
        let line = line.expect("utf-8");
        let done = line.starts_with("Swagger UI: ");
        lines.push(line);
        if done {
            break;
        }
    }
    let base = lines
        .iter()
        .find_map(|l| l.strip_prefix("Plant Store listening on "))
        .expect("a listening line")
        .to_owned();
    (child, lines, base)
}

/// Sends SIGTERM, as `docker stop` and systemd do, and waits for the exit.
async fn stop_with_sigterm(mut child: Child) -> std::process::ExitStatus {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_request_in_flight_finish_then_exits_0() {
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());
    let (mut child, banner, base) = serve(dir.path(), &url);
    let token = banner
        .iter()
        .find(|l| l.starts_with("pst_"))
        .expect("the initial token is printed")
        .clone();
    assert!(
        banner.iter().any(|l| l.contains("/docs")),
        "the Swagger UI address is printed"
    );
    let pool = SqlitePool::connect(&url).await.expect("open");
    pool.execute("INSERT INTO plants (id, name) VALUES (1, 'fern')")
        .await
        .expect("insert");
    // Hold the write lock so the delete is still in flight when SIGTERM arrives.
    let mut writer = pool.acquire().await.expect("connection");
    writer.execute("BEGIN IMMEDIATE").await.expect("lock");
    let in_flight = tokio::spawn(
        crate::helpers::http_client()
            .delete(format!("{base}/plants/1"))
            .bearer_auth(&token)
            .send(),
    );
    // The delete stays unanswered behind the held write lock.
    crate::helpers::nothing_happens_within(Duration::from_millis(500)).await;

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    // The stopping service waits for the request still in flight.
    crate::helpers::nothing_happens_within(Duration::from_millis(500)).await;
    writer.execute("ROLLBACK").await.expect("unlock");

    assert!(killed.success());
    let answer = in_flight
        .await
        .expect("task")
        .expect("the in-flight request is answered");
    assert_eq!(answer.status(), StatusCode::NO_CONTENT);
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert_eq!(status.code(), Some(0));
    drop(writer);
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM plants")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(left, 0);
}

/// `PLANTSTORE_SHUTDOWN_DELAY`: after SIGTERM the instance says it is not ready at once,
/// yet goes on serving for the delay, each answer closing its connection, so a load
/// balancer drains it before it stops accepting; then it exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_shutdown_delay_drains_before_stopping() {
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());
    let mut command = plantstore(dir.path(), &url);
    command.env("PLANTSTORE_SHUTDOWN_DELAY", "1500ms");
    let (mut child, banner, base) = serve_with(command, dir.path());
    let token = banner
        .iter()
        .find(|l| l.starts_with("pst_"))
        .expect("the initial token is printed")
        .clone();
    let pool = SqlitePool::connect(&url).await.expect("open");
    pool.execute("INSERT INTO plants (id, name) VALUES (1, 'fern'), (2, 'moss')")
        .await
        .expect("insert");
    let client = crate::helpers::http_client();
    let delete = |id: i64| {
        client
            .delete(format!("{base}/plants/{id}"))
            .bearer_auth(&token)
            .send()
    };
    let before = delete(1).await.expect("answer");
    assert_eq!(before.status(), StatusCode::NO_CONTENT);
    assert!(before.headers().get("connection").is_none(), "kept alive");
    let ready = client.get(format!("{base}/readyz")).send().await;
    assert_eq!(ready.expect("answer").status(), StatusCode::OK);

    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    let signalled = std::time::Instant::now();
    let ready = crate::helpers::eventually(
        Duration::from_secs(5),
        "/readyz answering 503 while draining",
        || async {
            let ready = client.get(format!("{base}/readyz")).send().await.ok()?;
            (ready.status() == StatusCode::SERVICE_UNAVAILABLE).then_some(ready)
        },
    )
    .await;
    assert!(ready.headers().contains_key("retry-after"));
    assert_eq!(ready.headers()["connection"], "close");
    crate::helpers::assert_error(ready, StatusCode::SERVICE_UNAVAILABLE).await;
    let during = delete(2).await.expect("still serving");
    assert_eq!(during.status(), StatusCode::NO_CONTENT);
    assert_eq!(during.headers()["connection"], "close");

    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert_eq!(status.code(), Some(0));
    assert!(
        signalled.elapsed() >= Duration::from_millis(1500),
        "served for the whole delay, stopped after {:?}",
        signalled.elapsed()
    );
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM plants")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(left, 0, "both deletes committed");
}

#[test]
fn the_initial_token_is_printed_on_the_first_start_only() {
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());

    let (mut first, first_banner, _) = serve(dir.path(), &url);
    let _ = first.kill();
    let _ = first.wait();
    let (mut second, second_banner, _) = serve(dir.path(), &url);
    let _ = second.kill();
    let _ = second.wait();

    assert_eq!(
        first_banner
            .iter()
            .filter(|l| l.starts_with("pst_"))
            .count(),
        1
    );
    assert!(
        second_banner.iter().all(|l| !l.starts_with("pst_")),
        "{second_banner:?}"
    );
}

#[test]
fn a_start_that_cannot_bind_keeps_the_initial_token_for_the_next_start() {
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = taken.local_addr().expect("address").to_string();

    let refused = plantstore(dir.path(), &url)
        .env("PLANTSTORE_LISTEN", &address)
        .output()
        .expect("run");
    let (mut next, banner, _) = serve(dir.path(), &url);
    let _ = next.kill();
    let _ = next.wait();

    assert!(!refused.status.success());
    assert_eq!(stderr(&refused).lines().count(), 1, "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains(&format!("cannot listen on {address}")),
        "{}",
        stderr(&refused)
    );
    assert_eq!(
        banner.iter().filter(|l| l.starts_with("pst_")).count(),
        1,
        "{banner:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_request_id_and_never_a_token() {
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());
    let mut command = plantstore(dir.path(), &url);
    command
        .env("RUST_LOG", "trace")
        .env("PLANTSTORE_LOG_FORMAT", "json");
    let (child, banner, base) = serve_with(command, dir.path());
    let token = banner
        .iter()
        .find(|l| l.starts_with("pst_"))
        .expect("token")
        .clone();
    let secret = token.rsplit('_').next().expect("secret half").to_owned();
    let client = crate::helpers::http_client();
    let wrong = format!(
        "{}{}",
        &token[..token.len() - 1],
        if token.ends_with('x') { 'y' } else { 'x' }
    );

    let answer = client
        .delete(format!("{base}/plants/9"))
        .bearer_auth(&token)
        .header("x-request-id", "log-check-1")
        .send()
        .await
        .expect("answer");
    let refused = client
        .delete(format!("{base}/plants/9"))
        .bearer_auth(&wrong)
        .send()
        .await
        .expect("answer");
    let status = stop_with_sigterm(child).await;

    assert_eq!(
        (answer.status(), refused.status()),
        (StatusCode::NOT_FOUND, StatusCode::UNAUTHORIZED)
    );
    assert_eq!(status.code(), Some(0));
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).expect("log");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("a JSON line: {line}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|line| line["span"]["request_id"] == "log-check-1"
                && line["fields"]["status"] == 404),
        "the request's log line names its request id"
    );
    assert!(!log.contains(&secret), "the token's secret is never logged");
    // Nor its stored hash, in hex or as the list of bytes a `Debug` would print.
    let hash = <sha2::Sha256 as sha2::Digest>::digest(secret.as_bytes());
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    let bytes = format!("{:?}", hash.iter().collect::<Vec<_>>());
    assert!(
        !log.to_lowercase().contains(&hex),
        "the hash is never logged"
    );
    assert!(!log.contains(&bytes[1..bytes.len() - 1]), "nor its bytes");
    assert!(
        !log.contains(&wrong[wrong.len() - 40..]),
        "nor a presented one"
    );
}

/// `docker compose logs` would be mostly health checks otherwise: at `info`, probes leave
/// no line while a DELETE does, and `/metrics` still counts the probes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_counted_but_logged_only_at_debug() {
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());
    let mut command = plantstore(dir.path(), &url);
    command.env("RUST_LOG", "info");
    let (child, _banner, base) = serve_with(command, dir.path());
    let client = crate::helpers::http_client();

    for path in ["/healthz", "/readyz", "/readyz"] {
        let answer = client
            .get(format!("{base}{path}"))
            .send()
            .await
            .expect("answer");
        assert_eq!(answer.status(), StatusCode::OK, "{path}");
    }
    let missing = client
        .delete(format!("{base}/plants/9"))
        .send()
        .await
        .expect("answer");
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("answer")
        .text()
        .await
        .expect("text");
    let status = stop_with_sigterm(child).await;

    assert_eq!(missing.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(status.code(), Some(0));
    assert!(
        metrics.contains(
            r#"plantstore_http_requests_total{route="/readyz",method="GET",status="200"} 2"#
        ),
        "{metrics}"
    );
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).expect("log");
    let finished: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("request finished"))
        .collect();
    assert_eq!(finished.len(), 1, "{log}");
    assert!(finished[0].contains("/plants/9"), "{log}");
}

#[test]
fn token_list_json_is_one_array_a_script_can_read() {
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());
    assert!(run(dir.path(), &url, &["migrate"]).status.success());
    let created = run(dir.path(), &url, &["token", "create", "--name", "ci"]);
    let token = stdout(&created).lines().last().expect("a token").to_owned();
    run(
        dir.path(),
        &url,
        &["token", "create", "--name", "deploy", "--expires-in", "1d"],
    );
    run(dir.path(), &url, &["token", "revoke", "ci"]);

    let listed = run(dir.path(), &url, &["token", "list", "--json"]);

    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(!stdout(&listed).contains(&token[4..]), "never the secret");
    let rows: serde_json::Value = serde_json::from_str(&stdout(&listed)).expect("JSON");
    let row = |name: &str| {
        rows.as_array()
            .expect("an array")
            .iter()
            .find(|row| row["name"] == name)
            .cloned()
            .expect("a row")
    };
    let (ci, deploy) = (row("ci"), row("deploy"));
    assert!(
        ci["revoked_at"].is_string() && ci["expires_at"].is_null(),
        "{ci}"
    );
    assert!(
        deploy["revoked_at"].is_null() && deploy["expires_at"].is_string(),
        "{deploy}"
    );
    let created_at = ci["created_at"].as_str().expect("a time");
    assert!(
        chrono::DateTime::parse_from_rfc3339(created_at).is_ok(),
        "{created_at}"
    );
}

/// Each command's help lists only the options it reads, every one with a line of help;
/// a server option before another command is refused rather than ignored.
#[test]
fn each_command_shows_and_takes_only_its_own_options() {
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());
    let help = |args: &[&str]| {
        let output = run(dir.path(), &url, args);
        assert!(output.status.success(), "{args:?}");
        stdout(&output)
    };
    for command in [
        &["--help"][..],
        &["serve", "--help"],
        &["migrate", "--help"],
        &["seed", "--help"],
        &["openapi", "--help"],
        &["completions", "--help"],
        &["token", "create", "--help"],
        &["token", "list", "--help"],
        &["token", "revoke", "--help"],
    ] {
        let text = help(command);
        let lines: Vec<&str> = text.lines().collect();
        for (at, line) in lines.iter().enumerate() {
            let option = line.trim_start();
            if option.starts_with("--") || option.starts_with("-h") || option.starts_with('<') {
                // Help on the same line (after two spaces) or on the next, indented.
                let same_line = option
                    .split_once("  ")
                    .is_some_and(|(_, h)| !h.trim().is_empty());
                let next = lines.get(at + 1).map_or("", |l| l.trim());
                let next_line =
                    !next.is_empty() && !next.starts_with('-') && !next.starts_with('<');
                assert!(same_line || next_line, "{command:?}: {line} has no help");
            }
        }
        let server_options = text.contains("--listen");
        let serves = matches!(command[0], "--help" | "serve");
        assert_eq!(
            server_options, serves,
            "{command:?} lists --listen: {server_options}"
        );
    }

    let misplaced = run(
        dir.path(),
        &url,
        &["--listen", "127.0.0.1:1", "token", "list"],
    );
    assert!(!misplaced.status.success());
    assert_eq!(
        stderr(&misplaced).trim(),
        "plantstore: --listen is a setting of the server, not of `token`"
    );
}

#[test]
fn completions_are_printed_for_each_shell() {
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());
    let bash = run(dir.path(), &url, &["completions", "bash"]);
    assert!(bash.status.success());
    assert!(stdout(&bash).contains("_plantstore()") && stdout(&bash).contains("revoke"));
    let zsh = run(dir.path(), &url, &["completions", "zsh"]);
    assert!(stdout(&zsh).starts_with("#compdef plantstore"));
    let unknown = run(dir.path(), &url, &["completions", "cmd.exe"]);
    assert!(!unknown.status.success());
}

/// With `OTEL_EXPORTER_OTLP_ENDPOINT` set, a delete's spans reach an OTLP/HTTP receiver
/// (a local one here) by the time the server has stopped: in the caller's trace (its W3C
/// `traceparent`), with the request id, the handler's span and the store's commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_s_spans_are_exported_over_otlp_in_the_caller_s_trace() {
    let received = Received::default();
    let receiver = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let endpoint = format!("http://{}", receiver.local_addr().expect("address"));
    let bodies = std::sync::Arc::clone(&received);
    tokio::spawn(async move {
        while let Ok((stream, _)) = receiver.accept().await {
            tokio::spawn(otlp_receiver(stream, std::sync::Arc::clone(&bodies)));
        }
    });
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());
    let mut command = plantstore(dir.path(), &url);
    command.env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint);
    let (mut child, banner, base) = serve_with(command, dir.path());
    let token = banner
        .iter()
        .find(|l| l.starts_with("pst_"))
        .expect("a token")
        .clone();
    run(dir.path(), &url, &["seed", "--count", "1"]);

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let answer = reqwest::Client::new()
        .delete(format!("{base}/plants/1"))
        .bearer_auth(&token)
        .header("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01"))
        .header("x-request-id", "otlp-test-1")
        .send()
        .await
        .expect("answer");
    assert_eq!(answer.status(), StatusCode::NO_CONTENT);
    let stopped = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(stopped.success());
    assert!(child.wait().expect("exit").success());

    let received = received.lock().expect("not poisoned").clone();
    assert!(!received.is_empty(), "no spans arrived");
    assert!(received.iter().all(|(path, _)| path == "/v1/traces"));
    let spans: Vec<u8> = received.into_iter().flat_map(|(_, body)| body).collect();
    let has = |needle: &[u8]| spans.windows(needle.len()).any(|w| w == needle);
    let trace_bytes: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&trace_id[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    assert!(has(&trace_bytes), "the caller's trace id");
    assert!(has(b"otlp-test-1"), "the request id");
    assert!(has(b"delete_plant"), "the handler's span");
    assert!(has(b"delete_batch"), "the store's commit span");
}

/// Settings given in the environment are named by their variable when wrong, never by the
/// flag the user did not write; a flag given on the command line is named as a flag.
#[test]
fn a_bad_value_is_named_where_the_user_gave_it() {
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());
    let from_env = plantstore(dir.path(), &url)
        .env("PLANTSTORE_WEBHOOK_TIMEOUT", "fast")
        .arg("serve")
        .output()
        .expect("run");
    let err = stderr(&from_env);
    assert!(
        err.contains("PLANTSTORE_WEBHOOK_TIMEOUT") && !err.contains("--webhook-timeout"),
        "{err}"
    );
    let from_flag = run(dir.path(), &url, &["serve", "--webhook-timeout", "fast"]);
    let err = stderr(&from_flag);
    assert!(err.contains("--webhook-timeout"), "{err}");
}

/// `--help` groups each flag with what it is for: the delivery group holds the delivery
/// settings alone.
#[test]
fn help_groups_the_flags_by_what_they_are_for() {
    let dir = tempfile::tempdir().expect("dir");
    let url = sqlite_url(dir.path());
    let help = stdout(&run(dir.path(), &url, &["serve", "--help"]));
    let mut heading = String::new();
    let mut under: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            heading = line.trim_end_matches(':').to_owned();
        } else if let Some(flag) = line.trim_start().strip_prefix("--") {
            let flag = flag.split([' ', '=']).next().unwrap_or_default().to_owned();
            under.push((flag, heading.clone()));
        }
    }
    let heading_of = |flag: &str| {
        under
            .iter()
            .find(|(f, _)| f == flag)
            .map(|(_, h)| h.as_str())
            .unwrap_or_else(|| panic!("--{flag} in --help: {help}"))
    };
    for flag in ["webhook-timeout", "webhook-retry-min", "webhook-retry-max"] {
        assert!(
            heading_of(flag).starts_with("Deletion event delivery"),
            "{flag}"
        );
    }
    for (flag, wanted) in [
        ("otlp-endpoint", "Telemetry options"),
        ("rate-limit", "Server options"),
        ("cors-allowed-origins", "Server options"),
        ("admin-listen", "Server options"),
        ("idempotency-ttl", "Deletion log options"),
        ("deletion-retention", "Deletion log options"),
    ] {
        assert_eq!(heading_of(flag), wanted, "--{flag}");
    }
}

/// Run from a folder without the service's database, a command that needs one says where
/// it looked and how to name the right one, and leaves no empty database behind; `migrate`
/// still makes one.
#[test]
fn an_admin_command_without_a_database_says_where_it_looked_and_makes_none() {
    let dir = tempfile::tempdir().expect("dir");
    let default_url = "sqlite://plantstore.db?mode=rwc";
    for args in [
        &[
            "streams",
            "add",
            "nats://127.0.0.1:4222",
            "--stream",
            "PLANTS",
        ][..],
        &["webhooks", "list"],
        &["token", "list"],
        &["deletions", "list"],
    ] {
        let output = run(dir.path(), default_url, args);
        let err = stderr(&output);
        assert!(!output.status.success(), "{args:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        let looked = dir.path().join("plantstore.db");
        assert!(
            err.contains(&format!("no database at {}", looked.display()))
                && err.contains("DATABASE_URL"),
            "{args:?}: {err}"
        );
        assert!(!looked.exists(), "{args:?} made an empty database");
    }
    let made = run(dir.path(), default_url, &["migrate"]);
    assert!(made.status.success(), "{}", stderr(&made));
    assert!(dir.path().join("plantstore.db").exists());
    let listed = run(dir.path(), default_url, &["token", "list"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
}
