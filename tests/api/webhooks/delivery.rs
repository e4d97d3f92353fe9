//! What a receiver gets: every committed delete and restore, signed, in order per plant,
//! again after failures and slow answers, with what the receiver asked for kept to.

use super::*;
use crate::on_both_backends;

on_both_backends!(
    every_committed_delete_arrives_signed_after_the_receiver_recovers,
    a_receiver_that_closes_each_connection_gets_every_event_once,
    a_plant_deleted_restored_and_deleted_again_arrives_in_that_order,
    a_later_restore_of_an_older_entry_still_arrives,
    metrics_show_deliveries_pending_and_lag_per_endpoint,
    a_slow_receiver_gets_each_event_once,
    a_redirect_is_a_failure_retry_after_is_kept_and_url_credentials_go_as_basic,
    a_receiver_back_after_an_hours_backoff_is_caught_up_within_the_probe,
);

async fn every_committed_delete_arrives_signed_after_the_receiver_recovers(backend: Backend) {
    let receiver = Receiver::start(
        &[
            Reply::Status(500),
            Reply::Status(503),
            Reply::Slow(Duration::from_millis(1500)),
            Reply::Close,
        ],
        Reply::Status(204),
    )
    .await;
    let app = spawn(backend).await;
    add_endpoint(&app, &receiver, &[]);
    delete_and_await_delivery(&app, &receiver, 40).await;

    let got = receiver.received();
    assert!(got.iter().all(|r| r.verified), "unverified: {got:#?}");
    assert!(
        got.len() >= 44,
        "the four failures were retried: {}",
        got.len()
    );
    let mut bodies: HashMap<&str, &str> = HashMap::new();
    for request in &got {
        let first = bodies.entry(&request.id).or_insert(&request.body);
        assert_eq!(
            *first, request.body,
            "a retry of {} changed its body",
            request.id
        );
        let data = &request.json["data"];
        assert_eq!(request.json["type"], "plant.deleted");
        assert_eq!(request.id, format!("deletion_{}", data["deletion_id"]));
        assert_eq!(data["caller"], "initial");
        assert!(data["snapshot"]["name"].is_string(), "{}", request.body);
        assert!(data.get("restored_at").is_none());
    }
    let endpoint = wait_until_nothing_pending(&app).await;
    assert_eq!(endpoint["state"], "active", "{endpoint}");
    assert!(endpoint["delivered_through"].is_i64(), "{endpoint}");
}

/// A receiver that answers each request with `Connection: close` and closes: every
/// request takes a new connection, and each event arrives once.
async fn a_receiver_that_closes_each_connection_gets_every_event_once(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Closing(204)).await;
    let app = spawn(backend).await;
    let id = add_endpoint(&app, &receiver, &[]);
    delete_and_await_delivery(&app, &receiver, 60).await;
    let endpoint = wait_until_nothing_pending(&app).await;
    assert_eq!(endpoint["state"], "active", "{endpoint}");
    let got = receiver.received();
    assert!(got.iter().all(|r| r.verified && r.accepted), "{got:#?}");
    let ids: Vec<&str> = got.iter().map(|r| r.id.as_str()).collect();
    let once: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(once.len(), ids.len(), "an event came twice: {ids:?}");
    // No request was sent on a connection the receiver had said it would close.
    let pending = format!("plantstore_webhook_pending_events{{endpoint=\"{id}\"}}");
    let failed =
        format!("plantstore_webhook_deliveries_total{{endpoint=\"{id}\",result=\"failed\"}}");
    let series = wait_for_series(&app, WITHIN, &pending, |value| value == 0.0).await;
    assert_eq!(series[&failed], 0.0, "{series:?}");
}

async fn a_plant_deleted_restored_and_deleted_again_arrives_in_that_order(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(200)).await;
    let app = spawn(backend).await;
    add_endpoint(&app, &receiver, &[]);
    app.add_plants(&[7]).await;
    delete_all(&app, [7]).await;
    let first = app.db.deletion_ids().await[0];
    succeeded(&plantstore(
        &app,
        &["deletions", "restore", &first.to_string(), "--by", "ops"],
    ));
    delete_all(&app, [7]).await;
    let second = app.db.deletion_ids().await[1];

    let expected = vec![
        format!("deletion_{first}"),
        format!("restore_{first}"),
        format!("deletion_{second}"),
    ];
    receiver
        .wait_for(WITHIN, "three events", |got| got.len() >= 3)
        .await;
    assert_eq!(accepted_ids(&receiver), expected);
    let restore = &receiver.accepted()[1];
    assert!(restore.verified);
    assert_eq!(restore.json["type"], "plant.restored");
    assert_eq!(restore.json["data"]["restored_by"], "ops");
    assert_eq!(restore.json["data"]["plant_id"], 7);
    assert_eq!(
        restore.json["timestamp"],
        restore.json["data"]["restored_at"]
    );
}

/// Restores between the same two deletes go out in the order they were made, whichever
/// entries they restore: one of an older entry, made after a newer one's went out, is not
/// left behind the delivery's cursor.
async fn a_later_restore_of_an_older_entry_still_arrives(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(204)).await;
    let app = spawn(backend).await;
    add_endpoint(&app, &receiver, &[]);
    app.add_plants(&[1, 2, 3]).await;
    delete_all(&app, [1, 2, 3]).await;
    let entries = app.db.deletion_ids().await;
    let mut expected: Vec<String> = entries.iter().map(|id| format!("deletion_{id}")).collect();
    receiver
        .wait_for(WITHIN, "the three deletes", |got| got.len() >= 3)
        .await;

    for entry in [entries[2], entries[0]] {
        succeeded(&plantstore(
            &app,
            &["deletions", "restore", &entry.to_string(), "--by", "ops"],
        ));
        expected.push(format!("restore_{entry}"));
        let count = expected.len();
        receiver
            .wait_for(WITHIN, &format!("restore_{entry}"), |got| {
                got.len() >= count
            })
            .await;
    }
    let mut deletes = accepted_ids(&receiver);
    let restores = deletes.split_off(3);
    deletes.sort();
    expected[..3].sort();
    assert_eq!([deletes, restores].concat(), expected);
    assert_eq!(wait_until_nothing_pending(&app).await["state"], "active");
}

/// `/metrics` counts attempts by result, and shows each endpoint's pending events and the
/// lag of what it received; a removed endpoint has nothing pending any more.
async fn metrics_show_deliveries_pending_and_lag_per_endpoint(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(500)).await;
    let app = spawn(backend).await;
    let id = add_endpoint(&app, &receiver, &[]);
    let series = |name: &str, labels: &str| format!("{name}{{endpoint=\"{id}\"{labels}}}");
    let pending = series("plantstore_webhook_pending_events", "");
    let failed = series("plantstore_webhook_deliveries_total", ",result=\"failed\"");
    let delivered = series(
        "plantstore_webhook_deliveries_total",
        ",result=\"delivered\"",
    );
    let lags = series("plantstore_webhook_delivery_lag_seconds_count", "");
    app.add_plants(&[1, 2, 3, 4, 5]).await;
    delete_all(&app, 1..=3).await;

    let failing = wait_for_series(&app, WITHIN, &pending, |value| value == 3.0).await;
    assert!(failing[&failed] >= 1.0, "{failing:?}");
    // Each result's series is there from the start, at 0 until an attempt has it.
    assert_eq!(failing.get(&delivered), Some(&0.0), "{failing:?}");

    receiver.set_default(Reply::Status(204));
    wait_until_nothing_pending(&app).await;
    let caught_up = wait_for_series(&app, WITHIN, &pending, |value| value == 0.0).await;
    assert_eq!(caught_up[&delivered], 3.0, "{caught_up:?}");
    assert_eq!(caught_up[&lags], 3.0, "{caught_up:?}");

    receiver.set_default(Reply::Status(500));
    delete_all(&app, 4..=5).await;
    wait_for_series(&app, WITHIN, &pending, |value| value == 2.0).await;
    succeeded(&plantstore(&app, &["webhooks", "remove", &id.to_string()]));
    wait_for_series(&app, WITHIN, &pending, |value| value == 0.0).await;
}

/// A receiver that serves one request at a time per connection and takes 0.3 s for each,
/// as a synchronous app server does: each event arrives once, and no attempt fails. (Each
/// request has its own connection and timeout; none waits behind another's answer.)
async fn a_slow_receiver_gets_each_event_once(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Paced(Duration::from_millis(300))).await;
    let app = spawn_app_on(TestDb::new(backend).await, |config| {
        quick_retries(config);
        config.serve.webhooks.webhook_timeout = Duration::from_secs(5);
    })
    .await;
    let id = add_endpoint(&app, &receiver, &[]);
    let plants: Vec<i64> = (1..=400).collect();
    app.add_plants(&plants).await;
    delete_from_clients(&app, &plants, 16).await;

    let expected = logged_ids(&app).await;
    assert_eq!(expected.len(), 400);
    receiver
        .wait_for(WITHIN, "every delete received", |got| {
            got.iter().filter(|r| r.accepted).count() >= 400
        })
        .await;
    wait_until_nothing_pending(&app).await;
    let ids = accepted_ids(&receiver);
    let once: HashSet<&String> = ids.iter().collect();
    assert_eq!((ids.len(), once.len()), (400, 400), "repeats");
    assert!(receiver.received().iter().all(|r| r.verified));
    let failed =
        format!("plantstore_webhook_deliveries_total{{endpoint=\"{id}\",result=\"failed\"}}");
    let series = scrape(&app).await;
    assert_eq!(series.get(&failed), Some(&0.0), "{series:?}");
}

/// What a receiver says is kept to: a redirect is not followed (a failure, retried at the
/// same URL), `Retry-After` in seconds and as an HTTP date holds the next attempt back,
/// and credentials in the endpoint's URL go as HTTP Basic, never into the last error.
async fn a_redirect_is_a_failure_retry_after_is_kept_and_url_credentials_go_as_basic(
    backend: Backend,
) {
    let receiver = Receiver::start(
        &[
            Reply::WithHeader(302, "location: http://127.0.0.1:9/elsewhere".into()),
            Reply::WithHeader(503, "retry-after: 1".into()),
            // Whole seconds: 2 s ahead when answered leaves more than 1 s to wait.
            Reply::RetryAt(503, Duration::from_secs(2)),
        ],
        Reply::Status(204),
    )
    .await;
    let app = spawn_app_on(TestDb::new(backend).await, |config| {
        quick_retries(config);
        config.serve.webhooks.webhook_retry_max = Duration::from_secs(5);
    })
    .await;
    let with_credentials = receiver
        .url
        .replace("http://", "http://hook-user:s3cr%40t@");
    let out = succeeded(&plantstore(&app, &["webhooks", "add", &with_credentials]));
    receiver.verify_with(out.lines().last().expect("a secret"));
    app.add_plants(&[1]).await;
    delete_all(&app, [1]).await;
    let failing = wait_for_endpoint(&app, "the endpoint failing after the redirect", |e| {
        e["last_error"].is_string()
    })
    .await;
    let error = failing["last_error"].as_str().unwrap_or_default();
    assert!(error.starts_with("the receiver answered"), "{failing}");
    assert!(
        !error.contains("s3cr") && !error.contains("hook-user"),
        "{failing}"
    );
    receiver
        .wait_for(WITHIN, "the event after a redirect and two 503s", |got| {
            got.iter().any(|r| r.accepted)
        })
        .await;

    let got = receiver.received();
    assert_eq!(got.len(), 4, "{got:#?}");
    assert!(got.iter().all(|r| r.verified && r.id == got[0].id));
    // base64 of "hook-user:s3cr@t"
    assert!(
        got.iter()
            .all(|r| r.authorization == "Basic aG9vay11c2VyOnMzY3JAdA=="),
        "{got:#?}"
    );
    let waited = |i: usize| got[i + 1].at - got[i].at;
    assert!(waited(1) >= Duration::from_millis(950), "{:?}", waited(1));
    assert!(waited(2) >= Duration::from_millis(950), "{:?}", waited(2));
}

/// Every event refused until each one's next attempt is an hour off (both retry bounds at
/// 1 h), as after a long outage; meanwhile `list` shows the endpoint `failing`, with the
/// error and the next attempt. Once the receiver is back, the catch-up probe finds it within
/// its 30 s, and its success sends every waiting event at once, not an hour later.
async fn a_receiver_back_after_an_hours_backoff_is_caught_up_within_the_probe(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(503)).await;
    let app = spawn_app_on(TestDb::new(backend).await, |config| {
        config.serve.webhooks.webhook_timeout = Duration::from_millis(500);
        config.serve.webhooks.webhook_retry_min = Duration::from_secs(3600);
        config.serve.webhooks.webhook_retry_max = Duration::from_secs(3600);
    })
    .await;
    add_endpoint(&app, &receiver, &[]);
    let plants: Vec<i64> = (1..=8).collect();
    app.add_plants(&plants).await;
    delete_all(&app, plants.iter().copied()).await;
    receiver
        .wait_for(WITHIN, "each event refused once", |got| {
            got.len() >= plants.len()
        })
        .await;
    let failing = wait_for_endpoint(&app, "failing, with the error and the next attempt", |e| {
        e["state"] == "failing" && e["last_error"].is_string() && e["next_attempt_at"].is_string()
    })
    .await;
    eprintln!("while the receiver refuses: {failing}");

    receiver.set_default(Reply::Status(204));
    let back = std::time::Instant::now();
    let expected = logged_ids(&app).await;
    wait_until_accepted_within(Duration::from_secs(45), &receiver, &expected).await;
    eprintln!(
        "caught up {:.1} s after the receiver came back",
        back.elapsed().as_secs_f64()
    );
    let endpoint = wait_until_nothing_pending(&app).await;
    assert_eq!(endpoint["state"], "active", "{endpoint}");
}

/// A panic inside one destination's delivery, caused on purpose (`--features
/// fault-injection`: a webhook URL whose path is /panic-on-purpose): that destination shows
/// `failing` with the reason, the log says so once, not each second, and another
/// destination of the same instance gets every event.
#[cfg(feature = "fault-injection")]
#[tokio::test]
async fn fault_injection_a_panic_in_one_destination_is_shown_logged_once_and_the_others_go_on() {
    use crate::helpers::{delete_on, free_port, new_token, serve_process_with, wait_until_serving};
    let receiver = Receiver::start(&[], Reply::Status(204)).await;
    let db = TestDb::new(Backend::Sqlite).await;
    succeeded(&plantstore_on(&db.url, &["migrate"]));
    succeeded(&plantstore_on(&db.url, &["seed", "--count", "10"]));
    let token = new_token(&db.url, "fault");
    let out = succeeded(&plantstore_on(&db.url, &["webhooks", "add", &receiver.url]));
    receiver.verify_with(out.lines().last().expect("a secret"));
    let out = succeeded(&plantstore_on(
        &db.url,
        &["webhooks", "add", "http://127.0.0.1:9/panic-on-purpose"],
    ));
    let faulty = out.split_whitespace().nth(3).expect("its id").to_owned();

    let log_dir = tempfile::tempdir().expect("a folder for the log");
    let log_path = log_dir.path().join("serve.log");
    let log = std::fs::File::create(&log_path).expect("the log file");
    let port = free_port();
    let _service = serve_process_with(&db.url, port, &[], log.into());
    wait_until_serving(port).await;
    delete_on(port, &token, 1..=10).await;

    let expected: HashSet<String> = db
        .deletion_ids()
        .await
        .into_iter()
        .map(|id| format!("deletion_{id}"))
        .collect();
    wait_until_accepted(&receiver, &expected).await;
    let list = |db: &TestDb| {
        let out = succeeded(&plantstore_on(&db.url, &["webhooks", "list", "--json"]));
        serde_json::from_str::<Vec<Value>>(&out).expect("a JSON list")
    };
    let shown = eventually(
        WITHIN,
        "the faulty destination failing, with why",
        || async {
            list(&db).into_iter().find(|e| {
                e["id"].to_string() == faulty
                    && e["state"] == "failing"
                    && e["last_error"]
                        .as_str()
                        .is_some_and(|error| error.contains("a fault injected on purpose"))
            })
        },
    )
    .await;
    eprintln!("the faulty destination: {shown}");
    // Started again each second, it would panic and log again each second.
    nothing_happens_within(Duration::from_secs(3)).await;
    let logged = std::fs::read_to_string(&log_path).expect("the log");
    let stopped = logged
        .lines()
        .filter(|line| line.contains("delivery to this destination stopped"))
        .count();
    assert_eq!(stopped, 1, "logged once: {logged}");
    let healthy = list(&db)
        .into_iter()
        .find(|e| e["id"].to_string() != faulty)
        .expect("the healthy endpoint");
    assert_eq!(healthy["state"], "active", "{healthy}");
}
