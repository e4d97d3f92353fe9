//! Deletion events into NATS JetStream: destinations added with `plantstore streams`, and
//! what a consumer reading the stream back finds: every deletion log entry once, each
//! plant's in log order, through a broker that is down at the start and killed mid-way.

use std::{collections::HashMap, time::Duration};

use serde_json::Value;

use crate::{
    fixtures::nats::{NatsServer, StreamMessage, TestCa, read_stream, stream_config},
    helpers::{
        Backend, TestApp, TestDb, delete_on, eventually, free_port, new_token, plantstore_on,
        refused, serve_process, serve_process_with, spawn_app_on, succeeded, wait_until_serving,
    },
    on_both_backends,
};

const WITHIN: Duration = Duration::from_secs(30);
const STREAM: &str = "PLANTS";

on_both_backends!(
    every_entry_is_in_the_stream_once_in_plant_order,
    a_broker_down_at_start_and_killed_mid_way_loses_nothing_and_repeats_nothing,
    a_missing_or_full_stream_is_explained_and_nothing_is_lost,
    two_instances_publish_each_entry_once,
    a_silent_broker_then_healed_loses_nothing,
    rotated_credentials_are_named_and_set_url_keeps_every_event_once,
);

/// Short waits, so retries happen within a test.
fn quick_retries(config: &mut plantstore::config::Config) {
    config.serve.webhooks.webhook_timeout = Duration::from_millis(1000);
    config.serve.webhooks.webhook_retry_min = Duration::from_millis(50);
    config.serve.webhooks.webhook_retry_max = Duration::from_millis(500);
}

fn add_destination(db_url: &str, nats: &NatsServer) -> i64 {
    let out = succeeded(&plantstore_on(
        db_url,
        &["streams", "add", &nats.url(), "--stream", STREAM],
    ));
    out.split_whitespace()
        .nth(3)
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("the destination id in {out}"))
}

fn destinations(db_url: &str) -> Vec<Value> {
    let out = succeeded(&plantstore_on(db_url, &["streams", "list", "--json"]));
    match serde_json::from_str(&out) {
        Ok(Value::Array(list)) => list,
        other => panic!("not a JSON array: {other:?}\n{out}"),
    }
}

/// Waits until the (first) destination is `failing` with `cause` in its last error.
async fn failing_because(db_url: &str, cause: &str) -> Value {
    let what = format!("failing: {cause}");
    wait_for_destination(db_url, &what, |d| {
        d["state"] == "failing" && d["last_error"].as_str().is_some_and(|e| e.contains(cause))
    })
    .await
}

async fn wait_for_destination(db_url: &str, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
    let wanted = &wanted;
    eventually(WITHIN, what, || async move {
        destinations(db_url).into_iter().next().filter(wanted)
    })
    .await
}

/// What the exactly-once check counts: the log's events, the stream's messages, their
/// distinct ids, and the plants whose messages are out of log order.
#[derive(Debug, PartialEq, Eq)]
struct ExactlyOnce {
    log_events: usize,
    messages: usize,
    distinct_ids: usize,
    order_violations: usize,
}

/// Compares the stream with `expected`: each plant's webhook ids in log order.
fn exactly_once(expected: &HashMap<i64, Vec<String>>, messages: &[StreamMessage]) -> ExactlyOnce {
    let mut per_plant: HashMap<i64, Vec<String>> = HashMap::new();
    for message in messages {
        let plant = message
            .subject
            .strip_prefix("plantstore.plants.")
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("a subject of ours: {message:?}"));
        per_plant
            .entry(plant)
            .or_default()
            .push(message.msg_id.clone());
    }
    let distinct: std::collections::HashSet<&str> =
        messages.iter().map(|m| m.msg_id.as_str()).collect();
    let order_violations = expected
        .iter()
        .filter(|(plant, ids)| per_plant.get(plant) != Some(ids))
        .count();
    ExactlyOnce {
        log_events: expected.values().map(Vec::len).sum(),
        messages: messages.len(),
        distinct_ids: distinct.len(),
        order_violations,
    }
}

/// Deletes each plant with a 204; each one's expected `deletion_<id>`, from the log.
async fn delete_plants(app: &TestApp, plants: &[i64], expected: &mut HashMap<i64, Vec<String>>) {
    for &plant in plants {
        assert_eq!(app.delete_id(plant).await.status(), 204);
    }
    for (plant, id) in logged(app).await {
        let ids = expected.entry(plant).or_default();
        let event = format!("deletion_{id}");
        if !ids.contains(&event) {
            ids.push(event);
        }
    }
}

/// The log's `(plant, deletion id)` pairs, oldest first.
async fn logged(app: &TestApp) -> Vec<(i64, i64)> {
    logged_on(&app.db.url)
}

fn logged_on(db_url: &str) -> Vec<(i64, i64)> {
    let out = succeeded(&plantstore_on(db_url, &["deletions", "list", "--json"]));
    let list: Vec<Value> = serde_json::from_str(&out).expect("a JSON list");
    let mut pairs: Vec<(i64, i64)> = list
        .iter()
        .map(|e| {
            (
                e["plant_id"].as_i64().unwrap_or(-1),
                e["id"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    pairs.sort_by_key(|(_, id)| *id);
    pairs
}

/// Waits until the stream holds as many messages as `expected` has events, then gives the
/// check's counts, printed for the record.
async fn check_stream(
    nats: &NatsServer,
    expected: &HashMap<i64, Vec<String>>,
    case: &str,
) -> ExactlyOnce {
    check_stream_within(WITHIN, nats, expected, case).await
}

async fn check_stream_within(
    within: Duration,
    nats: &NatsServer,
    expected: &HashMap<i64, Vec<String>>,
    case: &str,
) -> ExactlyOnce {
    let js = nats.jetstream().await;
    let wanted: usize = expected.values().map(Vec::len).sum();
    let messages = eventually(within, "every event in the stream", || async {
        let messages = read_stream(&js, STREAM).await;
        (messages.len() >= wanted).then_some(messages)
    })
    .await;
    let counts = exactly_once(expected, &messages);
    eprintln!("exactly-once check, {case}: {counts:?}");
    counts
}

fn all_once(expected: &HashMap<i64, Vec<String>>) -> ExactlyOnce {
    let events = expected.values().map(Vec::len).sum();
    ExactlyOnce {
        log_events: events,
        messages: events,
        distinct_ids: events,
        order_violations: 0,
    }
}

async fn every_entry_is_in_the_stream_once_in_plant_order(backend: Backend) {
    let nats = NatsServer::start_with(Some(("plants", "s3cret-pass"))).await;
    nats.add_stream(stream_config(STREAM, &["plantstore.plants.>"]))
        .await;
    let app = spawn_app_on(TestDb::new(backend).await, quick_retries).await;
    let id = add_destination(&app.db.url, &nats);
    let plants: Vec<i64> = (1..=30).collect();
    app.add_plants(&plants).await;

    let mut expected = HashMap::new();
    delete_plants(&app, &plants, &mut expected).await;
    // Plant 7 deleted, restored and deleted again: three messages on its subject, in order.
    let first = expected[&7][0].trim_start_matches("deletion_").to_owned();
    succeeded(&plantstore_on(
        &app.db.url,
        &["deletions", "restore", &first, "--by", "ops"],
    ));
    expected
        .entry(7)
        .or_default()
        .push(format!("restore_{first}"));
    delete_plants(&app, &[7], &mut expected).await;

    let counts = check_stream(&nats, &expected, "one instance, no fault").await;
    assert_eq!(counts, all_once(&expected));

    let messages = read_stream(&nats.jetstream().await, STREAM).await;
    let restore = messages
        .iter()
        .find(|m| m.msg_id == format!("restore_{first}"))
        .expect("the restore's message");
    assert_eq!(restore.subject, "plantstore.plants.7");
    assert_eq!(restore.event_type, "plant.restored");
    assert_eq!(restore.content_type, "application/json");
    // The fourth header, as docs/deletion-events.md tells consumers: the stream sequence
    // of the plant's message before it (none before a plant's first: 0).
    let before_restore = messages
        .iter()
        .position(|m| m.msg_id == format!("deletion_{first}"))
        .expect("plant 7's first delete");
    assert_eq!(
        restore.expected_last_subject_sequence,
        (before_restore + 1).to_string()
    );
    assert_eq!(messages[0].expected_last_subject_sequence, "0");
    assert_eq!(restore.body["type"], "plant.restored");
    assert_eq!(restore.body["data"]["restored_by"], "ops");
    assert_eq!(restore.body["data"]["deletion_id"].to_string(), first);
    let delete = &messages[0];
    assert_eq!(delete.event_type, "plant.deleted");
    assert_eq!(delete.body["type"], "plant.deleted");
    assert_eq!(delete.body["data"]["caller"], "initial");
    assert!(
        delete.body["data"]["snapshot"]["name"].is_string(),
        "{:?}",
        delete.body
    );

    let listed = wait_for_destination(&app.db.url, "nothing pending", |d| d["pending"] == 0).await;
    assert_eq!(listed["id"], id);
    assert_eq!(listed["state"], "active", "{listed}");
    assert_eq!(listed["stream"], STREAM);
    assert_eq!(listed["subject_prefix"], "plantstore.plants");
    let table = succeeded(&plantstore_on(&app.db.url, &["streams", "list"]));
    for shown in [listed.to_string(), table] {
        assert!(!shown.contains("s3cret-pass"), "credentials shown: {shown}");
    }
    let webhooks = succeeded(&plantstore_on(&app.db.url, &["webhooks", "list", "--json"]));
    assert_eq!(webhooks.trim(), "[]", "a stream is no webhook endpoint");
    let wrong_group = refused(&plantstore_on(
        &app.db.url,
        &["webhooks", "remove", &id.to_string()],
    ));
    assert!(
        wrong_group.contains("no webhook endpoint has id"),
        "{wrong_group}"
    );
    succeeded(&plantstore_on(
        &app.db.url,
        &["streams", "remove", &id.to_string()],
    ));
    assert!(destinations(&app.db.url).is_empty());
}

async fn a_broker_down_at_start_and_killed_mid_way_loses_nothing_and_repeats_nothing(
    backend: Backend,
) {
    let mut nats = NatsServer::start().await;
    nats.add_stream(stream_config(STREAM, &["plantstore.plants.>"]))
        .await;
    let db = TestDb::new(backend).await;
    succeeded(&plantstore_on(&db.url, &["migrate"]));
    add_destination(&db.url, &nats);
    nats.kill();

    let app = spawn_app_on(db, quick_retries).await;
    let plants: Vec<i64> = (1..=60).collect();
    app.add_plants(&plants).await;
    let mut expected = HashMap::new();
    delete_plants(&app, &plants[..20], &mut expected).await;
    let failing = wait_for_destination(&app.db.url, "failing with the reason", |d| {
        d["state"] == "failing"
    })
    .await;
    let reason = failing["last_error"].as_str().unwrap_or_default();
    assert!(
        reason.contains("cannot connect to the NATS server"),
        "{failing}"
    );

    nats.start_again().await;
    let counts = check_stream(&nats, &expected, "broker down at the service's start").await;
    assert_eq!(counts, all_once(&expected));

    // Killed while the next deletes are being published, and started again.
    let deleting = {
        let plants = plants[20..].to_vec();
        let app = &app;
        async move {
            for plant in plants {
                assert_eq!(app.delete_id(plant).await.status(), 204);
            }
        }
    };
    let killing = async {
        let js = nats.jetstream().await;
        eventually(WITHIN, "some of the next deletes in the stream", || async {
            (read_stream(&js, STREAM).await.len() > 25).then_some(())
        })
        .await;
    };
    futures::join!(deleting, killing);
    nats.kill();
    nats.start_again().await;
    delete_plants(&app, &[], &mut expected).await;
    let counts = check_stream(&nats, &expected, "broker killed mid-stream").await;
    assert_eq!(counts, all_once(&expected));
    wait_for_destination(&app.db.url, "active again", |d| {
        d["state"] == "active" && d["pending"] == 0
    })
    .await;
}

#[tokio::test]
async fn add_refuses_what_cannot_work_and_never_prints_the_password() {
    let nats = NatsServer::start_with(Some(("plants", "s3cret-pass"))).await;
    nats.add_stream(stream_config(STREAM, &["plantstore.plants.>"]))
        .await;
    nats.add_stream(stream_config("OTHER", &["elsewhere.>"]))
        .await;
    let db = TestDb::new(Backend::Sqlite).await;
    succeeded(&plantstore_on(&db.url, &["migrate"]));
    let url = nats.url();
    let closed = "nats://plants:s3cret-pass@127.0.0.1:1".to_owned();
    let wrong_password = url.replace("s3cret-pass", "not-it");
    let cases: [(&[&str], &str); 7] = [
        (
            &[&closed, "--stream", STREAM],
            "cannot connect to the NATS server",
        ),
        (
            &[&wrong_password, "--stream", STREAM],
            "authorization violation",
        ),
        (
            &[&url, "--stream", "MISSING"],
            "cannot use the stream MISSING",
        ),
        (
            &[&url, "--stream", "OTHER"],
            "does not capture plantstore.plants.>",
        ),
        (
            &[&url, "--stream", STREAM, "--subject-prefix", "a.*"],
            "not a subject prefix",
        ),
        (
            &["http://plants:s3cret-pass@127.0.0.1:1", "--stream", STREAM],
            "must be nats:// or tls://",
        ),
        (&["not a url", "--stream", STREAM], "not a URL"),
    ];
    for (args, why) in cases {
        let mut command = vec!["streams", "add"];
        command.extend_from_slice(args);
        let line = refused(&plantstore_on(&db.url, &command));
        assert!(line.contains(why), "{args:?}: {line}");
        assert!(
            !line.contains("s3cret-pass"),
            "the password printed: {line}"
        );
    }
    // Several destinations on one server, each with its own stream or prefix; the same
    // stream and prefix twice is refused, however the URL is written.
    nats.add_stream(stream_config("BOTH", &["a.plants.>", "b.plants.>"]))
        .await;
    let mut added = Vec::new();
    for prefix in ["a.plants", "b.plants"] {
        let out = succeeded(&plantstore_on(
            &db.url,
            &[
                "streams",
                "add",
                &url,
                "--stream",
                "BOTH",
                "--subject-prefix",
                prefix,
            ],
        ));
        added.push(out.split_whitespace().nth(3).expect("an id").to_owned());
    }
    let line = refused(&plantstore_on(
        &db.url,
        &[
            "streams",
            "add",
            &format!("{url}/"),
            "--stream",
            "BOTH",
            "--subject-prefix",
            "a.plants",
        ],
    ));
    assert!(
        line.contains("publishes to the stream BOTH under a.plants.>")
            && !line.contains("s3cret-pass"),
        "{line}"
    );
    for id in added {
        succeeded(&plantstore_on(&db.url, &["streams", "remove", &id]));
    }
    // A message already on the subjects would stand where the destination expects none.
    let js = nats.jetstream().await;
    js.publish("plantstore.plants.1", "not ours".into())
        .await
        .expect("a publish")
        .await
        .expect("stored");
    let line = refused(&plantstore_on(
        &db.url,
        &["streams", "add", &url, "--stream", STREAM],
    ));
    assert!(line.contains("already holds messages"), "{line}");
    assert!(destinations(&db.url).is_empty());
}

/// A broker that requires TLS, its certificate signed by a CA made for the test. `tls://`
/// and a plain `nats://` to it are refused in one line that says why, never a panic (two
/// TLS crypto providers compiled in, with none chosen, made rustls panic here), without the
/// CA and with another one; with the CA in `SSL_CERT_FILE`, `add` goes on to the stream and
/// prints its line alone. The service, trusting the CA the same way, publishes every event
/// once.
#[tokio::test]
async fn a_tls_broker_with_a_private_ca_gets_every_event_once_and_is_refused_in_one_line_without_it()
 {
    let ca = TestCa::new();
    let another_ca = TestCa::new();
    let nats = NatsServer::start_tls(&ca.broker_certificate()).await;
    let db = TestDb::new(Backend::Sqlite).await;
    succeeded(&plantstore_on(&db.url, &["migrate"]));
    let add = |url: &str, trusted: Option<&std::path::Path>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_plantstore"));
        command.env_clear().env("DATABASE_URL", &db.url);
        if let Some(ca) = trusted {
            command.env("SSL_CERT_FILE", ca);
        }
        command
            .args(["streams", "add", url, "--stream", STREAM])
            .output()
            .expect("run plantstore")
    };
    let one_line = |output: &std::process::Output| {
        let line = refused(output);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        line
    };
    for url in [
        format!("tls://127.0.0.1:{}", nats.port),
        format!("nats://127.0.0.1:{}", nats.port),
    ] {
        for trusted in [None, Some(another_ca.pem())] {
            let line = one_line(&add(&url, trusted.as_deref()));
            assert!(line.contains("certificate"), "{url}: {line}");
        }
        let line = one_line(&add(&url, Some(&ca.pem())));
        assert!(
            line.contains("cannot use the stream PLANTS"),
            "{url}: {line}"
        );
    }
    nats.add_stream(stream_config(STREAM, &["plantstore.plants.>"]))
        .await;
    let added = add(&format!("tls://127.0.0.1:{}", nats.port), Some(&ca.pem()));
    let out = succeeded(&added);
    assert!(out.starts_with("added stream destination"), "{out}");
    assert!(
        added.stderr.is_empty(),
        "the command's output is its own: {}",
        String::from_utf8_lossy(&added.stderr)
    );

    succeeded(&plantstore_on(&db.url, &["seed", "--count", "20"]));
    let token = new_token(&db.url, "tls");
    let port = free_port();
    let ca_file = ca.pem().display().to_string();
    let _service = serve_process_with(
        &db.url,
        port,
        &[("SSL_CERT_FILE", &ca_file)],
        std::process::Stdio::inherit(),
    );
    wait_until_serving(port).await;
    delete_on(port, &token, 1..=20).await;
    let expected = expected_from_log(&db.url);
    let counts = check_stream(&nats, &expected, "TLS with a private CA").await;
    assert_eq!(counts, all_once(&expected));
}

/// A NATS server without JetStream is named as such, not taken for a missing stream.
#[tokio::test]
async fn a_server_without_jetstream_is_named_as_such() {
    let port = free_port();
    let mut broker = std::process::Command::new("nats-server")
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("nats-server runs");
    eventually(WITHIN, "the broker listening", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
    })
    .await;
    let db = TestDb::new(Backend::Sqlite).await;
    succeeded(&plantstore_on(&db.url, &["migrate"]));
    let line = refused(&plantstore_on(
        &db.url,
        &[
            "streams",
            "add",
            &format!("nats://127.0.0.1:{port}"),
            "--stream",
            STREAM,
        ],
    ));
    assert!(line.contains("JetStream is not enabled"), "{line}");
    let _ = broker.kill();
    let _ = broker.wait();
}

/// Credentials rotated on the broker: `streams list` shows the destination `failing`
/// with the broker's reason while deletes go on; `set-url` refuses a password the broker
/// refuses, and with the new one the destination goes on from where it got to, every
/// event in the stream once.
async fn rotated_credentials_are_named_and_set_url_keeps_every_event_once(backend: Backend) {
    let mut nats = NatsServer::start_with(Some(("plants", "old-pass"))).await;
    nats.add_stream(stream_config(STREAM, &["plantstore.plants.>"]))
        .await;
    let app = spawn_app_on(TestDb::new(backend).await, quick_retries).await;
    let id = add_destination(&app.db.url, &nats).to_string();
    let plants: Vec<i64> = (1..=20).collect();
    app.add_plants(&plants).await;
    let mut expected = HashMap::new();
    delete_plants(&app, &plants[..10], &mut expected).await;
    assert_eq!(
        check_stream(&nats, &expected, "before the rotation").await,
        all_once(&expected)
    );

    nats.rotate_credentials("plants", "new-pass").await;
    delete_plants(&app, &plants[10..], &mut expected).await;
    let failing = failing_because(&app.db.url, "authorization violation").await;
    assert!(failing["next_attempt_at"].is_string(), "{failing}");
    let url = |password: &str| format!("nats://plants:{password}@127.0.0.1:{}", nats.port);
    let line = refused(&plantstore_on(
        &app.db.url,
        &["streams", "set-url", &id, &url("wrong-pass")],
    ));
    assert!(line.contains("authorization violation"), "{line}");
    let out = succeeded(&plantstore_on(
        &app.db.url,
        &["streams", "set-url", &id, &url("new-pass")],
    ));
    assert!(!out.contains("new-pass"), "{out}");

    let counts = check_stream(&nats, &expected, "across a credentials rotation").await;
    assert_eq!(counts, all_once(&expected));
    let listed = wait_for_destination(&app.db.url, "nothing pending", |d| d["pending"] == 0).await;
    assert_eq!(listed["state"], "active", "{listed}");
    assert_eq!(
        listed["delivered_through"],
        expected_last(&expected),
        "{listed}"
    );
}

/// The broker away long enough that each event's next attempt is an hour off (both
/// retry bounds at 1 h): once it is back, the catch-up probe finds it and every event is
/// in the stream once, within the probe's 30 s, not the hour. Meanwhile `list` shows the
/// destination `failing`, with the cause and the next attempt.
#[tokio::test]
async fn a_broker_back_after_an_hours_backoff_is_caught_up_within_the_probe() {
    let mut nats = NatsServer::start().await;
    nats.add_stream(stream_config(STREAM, &["plantstore.plants.>"]))
        .await;
    let app = spawn_app_on(TestDb::new(Backend::Sqlite).await, |config| {
        config.serve.webhooks.webhook_timeout = Duration::from_millis(1000);
        config.serve.webhooks.webhook_retry_min = Duration::from_secs(3600);
        config.serve.webhooks.webhook_retry_max = Duration::from_secs(3600);
    })
    .await;
    add_destination(&app.db.url, &nats);
    let plants: Vec<i64> = (1..=10).collect();
    app.add_plants(&plants).await;
    nats.kill();
    let mut expected = HashMap::new();
    delete_plants(&app, &plants, &mut expected).await;
    let failing = wait_for_destination(&app.db.url, "failing while the broker is away", |d| {
        d["state"] == "failing" && d["last_error"].is_string() && d["next_attempt_at"].is_string()
    })
    .await;
    eprintln!("while the broker is away: {failing}");
    nats.start_again().await;
    let back = std::time::Instant::now();
    let within = Duration::from_secs(45);
    let counts = check_stream_within(within, &nats, &expected, "an hour's backoff").await;
    eprintln!(
        "caught up {:.1} s after the broker came back",
        back.elapsed().as_secs_f64()
    );
    assert_eq!(counts, all_once(&expected));
}

/// The largest deletion id in `expected`: where `delivered_through` ends.
fn expected_last(expected: &HashMap<i64, Vec<String>>) -> i64 {
    expected
        .values()
        .flatten()
        .filter_map(|id| id.strip_prefix("deletion_")?.parse().ok())
        .max()
        .expect("an event")
}

/// Each plant's `deletion_<id>` in log order, from the log.
fn expected_from_log(db_url: &str) -> HashMap<i64, Vec<String>> {
    let mut expected: HashMap<i64, Vec<String>> = HashMap::new();
    for (plant, id) in logged_on(db_url) {
        expected
            .entry(plant)
            .or_default()
            .push(format!("deletion_{id}"));
    }
    expected
}

/// The service killed (SIGKILL) after JetStream acknowledged messages and before it saved
/// them, then started again once the duplicate window has passed: the expected last subject
/// sequence refuses each repeat, and the message found on the subject is recorded instead.
#[cfg(not(feature = "negative-control"))]
async fn a_kill_between_acknowledgement_and_save_stores_nothing_twice(backend: Backend) {
    let (expected, counts) = kill_between_acknowledgement_and_save(backend).await;
    assert_eq!(counts, all_once(&expected));
}

#[cfg(not(feature = "negative-control"))]
on_both_backends!(a_kill_between_acknowledgement_and_save_stores_nothing_twice);

/// The negative control: the same crash in a build that publishes without the expected
/// sequence (`cargo test --features negative-control`) stores repeats, so the test above
/// can fail.
#[cfg(feature = "negative-control")]
async fn negative_control_without_the_expected_sequence_a_kill_stores_repeats(backend: Backend) {
    let (_, counts) = kill_between_acknowledgement_and_save(backend).await;
    eprintln!(
        "negative control: {} repeats ({counts:?})",
        counts.messages - counts.distinct_ids
    );
    assert!(counts.messages > counts.distinct_ids, "{counts:?}");
}

#[cfg(feature = "negative-control")]
on_both_backends!(negative_control_without_the_expected_sequence_a_kill_stores_repeats);

/// What keeps the service from saving a destination's progress while it still publishes.
/// PostgreSQL: a lock on the destination's row, which deletes never touch. SQLite: the
/// write lock, which deletes need too.
enum SaveHold {
    Sqlite(crate::helpers::WriteHold),
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
}

impl SaveHold {
    async fn take(db: &TestDb) -> Self {
        match &db.pool {
            crate::helpers::DbPool::Sqlite(_) => SaveHold::Sqlite(db.hold_writes().await),
            crate::helpers::DbPool::Postgres(pool) => {
                let mut hold = pool.begin().await.expect("a transaction");
                sqlx::query("SELECT 1 FROM plantstore_webhook_endpoints FOR UPDATE")
                    .execute(&mut *hold)
                    .await
                    .expect("the row locked");
                SaveHold::Postgres(hold)
            }
        }
    }

    async fn release(self) {
        match self {
            SaveHold::Sqlite(hold) => hold.release().await,
            SaveHold::Postgres(hold) => hold.rollback().await.expect("the lock released"),
        }
    }
}

/// Deletes 40 plants and has their messages acknowledged while every save of the
/// destination's progress is held; kills the service; lets the duplicate window pass and
/// starts the service again. Gives the log's events per plant, and the check's counts once
/// nothing is pending.
async fn kill_between_acknowledgement_and_save(
    backend: Backend,
) -> (HashMap<i64, Vec<String>>, ExactlyOnce) {
    let mut nats = NatsServer::start().await;
    let mut config = stream_config(STREAM, &["plantstore.plants.>"]);
    config.duplicate_window = Duration::from_secs(1);
    nats.add_stream(config).await;
    let db = TestDb::new(backend).await;
    succeeded(&plantstore_on(&db.url, &["migrate"]));
    succeeded(&plantstore_on(&db.url, &["seed", "--count", "40"]));
    let token = new_token(&db.url, "crash");
    add_destination(&db.url, &nats);
    let port = free_port();
    let mut service = serve_process(&db.url, port);
    let client = reqwest::Client::new();
    let delete_all = || async {
        let deletes = (1..=40).map(|id| {
            client
                .delete(format!("http://127.0.0.1:{port}/plants/{id}"))
                .bearer_auth(&token)
                .send()
        });
        for answer in futures::future::join_all(deletes).await {
            assert_eq!(answer.expect("an answer").status(), 204);
        }
    };
    eventually(WITHIN, "the service holds the destination's lease", || async {
        (db.scalar(
            "SELECT count(*) FROM plantstore_webhook_endpoints WHERE lease_owner IS NOT NULL AND id > $1",
            0,
        )
        .await
            == 1)
            .then_some(())
    })
    .await;
    let hold = match backend {
        // The row lock first: deletes go on beside it, and their messages are published.
        Backend::Postgres => {
            let hold = SaveHold::take(&db).await;
            delete_all().await;
            hold
        }
        // Deletes need the write lock too: they are made while the broker is down, and
        // the lock is taken before it is back. A save waiting on it gives up after the
        // busy wait, and delivery goes on.
        Backend::Sqlite => {
            nats.kill();
            delete_all().await;
            wait_for_destination(&db.url, "failing while the broker is down", |d| {
                d["state"] == "failing"
            })
            .await;
            let hold = SaveHold::take(&db).await;
            nats.start_again().await;
            hold
        }
    };
    let js = nats.jetstream().await;
    let published = eventually(WITHIN, "messages acknowledged", || async {
        let count = read_stream(&js, STREAM).await.len();
        (count > 0).then_some(count)
    })
    .await;
    let recorded = db
        .scalar(
            "SELECT count(*) FROM plantstore_stream_subjects WHERE endpoint_id > $1",
            0,
        )
        .await;
    assert_eq!(recorded, 0, "nothing saved before the kill");
    service.kill();
    hold.release().await;
    eprintln!("killed with {published} messages acknowledged and none saved");

    // The one fixed wait: JetStream's duplicate window (1 s here) passes, so that only the
    // expected sequence stands between a repeat and the stream.
    crate::helpers::nothing_happens_within(Duration::from_millis(1500)).await;
    let mut service = serve_process(&db.url, port);
    let mut expected: HashMap<i64, Vec<String>> = HashMap::new();
    for (plant, id) in logged_on(&db.url) {
        expected
            .entry(plant)
            .or_default()
            .push(format!("deletion_{id}"));
    }
    check_stream(
        &nats,
        &expected,
        "service killed between acknowledgement and save",
    )
    .await;
    wait_for_destination(&db.url, "nothing pending", |d| d["pending"] == 0).await;
    let counts = exactly_once(&expected, &read_stream(&js, STREAM).await);
    eprintln!("once nothing is pending: {counts:?}");
    service.kill();
    (expected, counts)
}

/// The stream deleted while the service runs, then made again; then made full (a
/// `max_msgs` limit with discard `new`), then given room: each time the destination says
/// why it fails, deletes go on, and once the stream takes messages every event is in it
/// once.
async fn a_missing_or_full_stream_is_explained_and_nothing_is_lost(backend: Backend) {
    let nats = NatsServer::start().await;
    nats.add_stream(stream_config(STREAM, &["plantstore.plants.>"]))
        .await;
    let app = spawn_app_on(TestDb::new(backend).await, quick_retries).await;
    add_destination(&app.db.url, &nats);
    let plants: Vec<i64> = (1..=30).collect();
    app.add_plants(&plants).await;
    let js = nats.jetstream().await;
    let mut expected = HashMap::new();

    js.delete_stream(STREAM).await.expect("the stream deleted");
    delete_plants(&app, &plants[..10], &mut expected).await;
    let failing = wait_for_destination(&app.db.url, "failing: no stream", |d| {
        d["state"] == "failing"
    })
    .await;
    assert!(
        failing["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("no stream captures plantstore.plants.>")),
        "{failing}"
    );
    nats.add_stream(stream_config(STREAM, &["plantstore.plants.>"]))
        .await;
    let counts = check_stream(&nats, &expected, "stream deleted and made again").await;
    assert_eq!(counts, all_once(&expected));

    let mut full = stream_config(STREAM, &["plantstore.plants.>"]);
    full.max_messages = 15;
    full.discard = async_nats::jetstream::stream::DiscardPolicy::New;
    js.update_stream(full.clone()).await.expect("a limit");
    delete_plants(&app, &plants[10..], &mut expected).await;
    let failing = failing_because(&app.db.url, "maximum messages").await;
    assert!(failing["pending"].as_i64() > Some(0), "{failing}");
    full.max_messages = -1;
    js.update_stream(full).await.expect("room again");
    let counts = check_stream(&nats, &expected, "stream full, then given room").await;
    assert_eq!(counts, all_once(&expected));
    wait_for_destination(&app.db.url, "active again", |d| {
        d["state"] == "active" && d["pending"] == 0
    })
    .await;
}

/// Two instances on one database, deletes on both: one publishes at a time, and the
/// stream holds every entry once.
async fn two_instances_publish_each_entry_once(backend: Backend) {
    let nats = NatsServer::start().await;
    nats.add_stream(stream_config(STREAM, &["plantstore.plants.>"]))
        .await;
    let app = spawn_app_on(TestDb::new(backend).await, quick_retries).await;
    add_destination(&app.db.url, &nats);
    let mut config = crate::helpers::test_config(&app.db.url);
    quick_retries(&mut config);
    let other = crate::helpers::serve_another(&config).await;
    let plants: Vec<i64> = (1..=80).collect();
    app.add_plants(&plants).await;
    let deletes = plants.iter().map(|&plant| {
        let address = if plant % 2 == 0 { &app.address } else { &other };
        app.delete_request_at(address, &plant.to_string())
            .bearer_auth(&app.token)
            .send()
    });
    for answer in futures::future::join_all(deletes).await {
        assert_eq!(answer.expect("an answer").status(), 204);
    }
    let mut expected = HashMap::new();
    delete_plants(&app, &[], &mut expected).await;
    let counts = check_stream(&nats, &expected, "two instances").await;
    assert_eq!(counts, all_once(&expected));
}

/// The path to the broker goes silent (packets neither answered nor refused), then heals:
/// the destination fails with the reason meanwhile, and afterwards every event is in the
/// stream once.
async fn a_silent_broker_then_healed_loses_nothing(backend: Backend) {
    let nats = NatsServer::start().await;
    nats.add_stream(stream_config(STREAM, &["plantstore.plants.>"]))
        .await;
    let upstream = format!("127.0.0.1:{}", nats.port);
    let proxy = crate::fixtures::proxy::Proxy::start(
        "127.0.0.1:0".parse().expect("an address"),
        upstream.clone(),
    )
    .await;
    let through_proxy = format!("nats://{}", proxy.address);
    let app = spawn_app_on(TestDb::new(backend).await, quick_retries).await;
    succeeded(&plantstore_on(
        &app.db.url,
        &["streams", "add", &through_proxy, "--stream", STREAM],
    ));
    let plants: Vec<i64> = (1..=40).collect();
    app.add_plants(&plants).await;
    let mut expected = HashMap::new();
    delete_plants(&app, &plants[..10], &mut expected).await;
    check_stream(&nats, &expected, "before the partition").await;

    proxy.stall();
    delete_plants(&app, &plants[10..], &mut expected).await;
    let failing = wait_for_destination(&app.db.url, "failing while silent", |d| {
        d["state"] == "failing"
    })
    .await;
    eprintln!("while silent: {}", failing["last_error"]);
    let address = proxy.address;
    proxy.cut();
    // The cut proxy's listener closes as its task ends: then the path comes back there.
    eventually(WITHIN, "the partitioned port free again", || async {
        std::net::TcpListener::bind(address).ok().map(drop)
    })
    .await;
    let _healed = crate::fixtures::proxy::Proxy::start(address, upstream).await;
    let counts = check_stream(&nats, &expected, "silent partition, healed").await;
    assert_eq!(counts, all_once(&expected));
}

/// The path to the broker goes silent, then carries new connections again while the one
/// in use stays silent. A publish that times out drops that connection, so the events are
/// in the stream within about an attempt's timeout and the longest backoff of the heal,
/// not when the client's ping (a minute) finds the old connection dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_left_silent_is_replaced_after_a_publish_times_out() {
    let nats = NatsServer::start().await;
    nats.add_stream(stream_config(STREAM, &["plantstore.plants.>"]))
        .await;
    let proxy = crate::fixtures::proxy::Proxy::start(
        "127.0.0.1:0".parse().expect("an address"),
        format!("127.0.0.1:{}", nats.port),
    )
    .await;
    let app = spawn_app_on(TestDb::new(Backend::Sqlite).await, quick_retries).await;
    succeeded(&plantstore_on(
        &app.db.url,
        &[
            "streams",
            "add",
            &format!("nats://{}", proxy.address),
            "--stream",
            STREAM,
        ],
    ));
    let plants: Vec<i64> = (1..=20).collect();
    app.add_plants(&plants).await;
    let mut expected = HashMap::new();
    delete_plants(&app, &plants[..10], &mut expected).await;
    check_stream(&nats, &expected, "before the path went silent").await;

    proxy.stall();
    delete_plants(&app, &plants[10..], &mut expected).await;
    wait_for_destination(&app.db.url, "failing while silent", |d| {
        d["state"] == "failing"
    })
    .await;
    proxy.forward_new_connections();
    let healed = std::time::Instant::now();
    // The attempt timeout (1 s) and the longest backoff (0.5 s), with room for a read, a
    // connect and the scheduling of a loaded machine.
    let js = nats.jetstream().await;
    eventually(
        Duration::from_secs(8),
        "every event in the stream after the heal",
        || async { (read_stream(&js, STREAM).await.len() >= 20).then_some(()) },
    )
    .await;
    eprintln!(
        "every event in the stream {:?} after the heal",
        healed.elapsed()
    );
    let counts = check_stream(&nats, &expected, "silent connection replaced").await;
    assert_eq!(counts, all_once(&expected));
}

/// `replay` into a stream that still holds the messages is refused, as they would stand
/// where the destination expects none; once they are purged, it publishes every event
/// again, once. `enable` takes the destination back where it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_fills_a_purged_stream_once_and_is_refused_over_a_full_one() {
    let nats = NatsServer::start().await;
    // JetStream takes a message whose id it saw within this window for a repeat, even of
    // one purged since: the replay's messages are stored once it has passed.
    let mut config = stream_config(STREAM, &["plantstore.plants.>"]);
    config.duplicate_window = Duration::from_secs(2);
    nats.add_stream(config).await;
    let app = spawn_app_on(TestDb::new(Backend::Sqlite).await, quick_retries).await;
    let id = add_destination(&app.db.url, &nats).to_string();
    let plants: Vec<i64> = (1..=10).collect();
    app.add_plants(&plants).await;
    let mut expected = HashMap::new();
    delete_plants(&app, &plants, &mut expected).await;
    check_stream(&nats, &expected, "before the replay").await;
    let first = logged(&app).await[0].1.to_string();

    let line = refused(&plantstore_on(
        &app.db.url,
        &["streams", "replay", &id, "--from", &first],
    ));
    assert!(line.contains("already holds messages"), "{line}");
    assert!(
        !line.contains("--subject-prefix"),
        "replay has no such flag: {line}"
    );
    let js = nats.jetstream().await;
    js.get_stream(STREAM)
        .await
        .expect("the stream")
        .purge()
        .await
        .expect("purged");
    succeeded(&plantstore_on(
        &app.db.url,
        &["streams", "replay", &id, "--from", &first],
    ));
    let counts = check_stream(&nats, &expected, "replayed into the purged stream").await;
    assert_eq!(counts, all_once(&expected));
    succeeded(&plantstore_on(&app.db.url, &["streams", "enable", &id]));
    let listed = wait_for_destination(&app.db.url, "nothing pending", |d| d["pending"] == 0).await;
    assert_eq!(listed["state"], "active", "{listed}");
    let line = refused(&plantstore_on(&app.db.url, &["streams", "enable", "999"]));
    assert!(line.contains("no stream destination has id 999"), "{line}");
}
