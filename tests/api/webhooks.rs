//! Deletion events: endpoints added with `plantstore webhooks`, and what a receiver gets
//! from the running service: every committed delete, signed, in order per plant, again
//! after failures, once across instances.

use std::{
    collections::{HashMap, HashSet},
    process::Output,
    time::Duration,
};

use plantstore::{config::Config, database};
use plantstore_store::CommitNewsReceiver;
use reqwest::StatusCode;
use serde_json::Value;

use crate::{
    fixtures::receiver::{Receiver, Reply},
    helpers::{
        Backend, TestApp, TestDb, plantstore_on, refused, serve_another, spawn_app_on,
        spawn_app_until, succeeded, test_config,
    },
    metrics::scrape,
    on_both_backends,
};

on_both_backends!(
    every_committed_delete_arrives_signed_after_the_receiver_recovers,
    a_plant_deleted_restored_and_deleted_again_arrives_in_that_order,
    a_later_restore_of_an_older_entry_still_arrives,
    a_receiver_that_closes_each_connection_gets_every_event_once,
    a_410_disables_the_endpoint_until_it_is_enabled,
    replay_sends_again_from_an_entry_with_the_same_ids,
    prune_keeps_what_an_endpoint_has_not_received,
    two_instances_deliver_each_event_once,
    a_graceful_stop_leaves_the_next_instance_nothing_to_repeat,
    each_refused_command_is_one_clear_line,
    metrics_show_deliveries_pending_and_lag_per_endpoint,
    a_slow_receiver_gets_each_event_once,
    a_removed_endpoint_gets_nothing_more_and_its_id_is_never_reused,
    a_rotated_secret_signs_beside_the_old_one_until_the_overlap_ends,
    a_redirect_is_a_failure_retry_after_is_kept_and_url_credentials_go_as_basic,
);

/// How long a running delivery may take to follow a change to its endpoint's row: it
/// claims its leases each second.
const FOLLOWS_WITHIN: Duration = Duration::from_millis(2500);

/// How long the tests wait for deliveries that should take well under a second.
const WITHIN: Duration = Duration::from_secs(20);

/// Commits made through other processes reach a store's commit news on PostgreSQL: a
/// restore from the command line, another instance's delete, and a lost listening
/// connection (when announcements may have gone unheard) each change it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_commits_elsewhere_are_heard_by_the_delivering_instance() {
    let app = spawn(Backend::Postgres).await;
    let open = || async {
        database::open(&test_config(&app.db.url), None)
            .await
            .expect("a store")
    };
    let listening = open().await;
    let mut heard = listening.commits();
    rings(&mut heard, "listening begins").await;

    app.add_plants(&[3, 4, 5]).await;
    delete_all(&app, [3]).await;
    let entry = app.db.deletion_ids().await[0].to_string();
    heard.mark_seen();
    succeeded(&plantstore(
        &app,
        &["deletions", "restore", &entry, "--by", "ops"],
    ));
    rings(&mut heard, "a restore from the command line").await;

    let other = open().await;
    heard.mark_seen();
    delete_through(other.as_ref(), 4).await;
    rings(&mut heard, "another instance's delete").await;

    app.db.terminate_service_sessions().await;
    rings(&mut heard, "listening again after a lost connection").await;
    let other = open().await;
    heard.mark_seen();
    delete_through(other.as_ref(), 5).await;
    rings(&mut heard, "a delete after the reconnection").await;
}

/// Deletes plant `id` through `store`, as another instance's request would.
async fn delete_through(store: &dyn plantstore_store::Store, id: i64) {
    let deleted = store
        .delete_plant(plantstore_store::Deletion {
            plant_id: id,
            caller: "other-instance".into(),
            request_id: format!("other-{id}"),
            idempotency_key: None,
            deadline: tokio::time::Instant::now() + Duration::from_secs(5),
        })
        .await
        .expect("a delete");
    assert_eq!(deleted, plantstore_store::Deleted::Now);
}

/// On PostgreSQL events are read in commit order up to the oldest transaction of the
/// service's own sessions: a transaction left open by another application, in another
/// database of the server or on an owner's table in the service's own, holds no event
/// back. (Before, both held every event for as long as they stayed open.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_long_transaction_elsewhere_holds_no_event_back() {
    use sqlx::Connection;
    let receiver = Receiver::start(&[], Reply::Status(204)).await;
    let app = spawn(Backend::Postgres).await;
    add_endpoint(&app, &receiver, &[]);
    app.db.execute("CREATE TABLE owner_jobs (id BIGINT)").await;
    let mut elsewhere = sqlx::PgConnection::connect(&crate::pg_server::admin_url().await)
        .await
        .expect("a connection to another database");
    let mut owners = sqlx::PgConnection::connect(&app.db.url)
        .await
        .expect("an owner's connection");
    for (conn, statement) in [
        (&mut elsewhere, "SELECT pg_current_xact_id()::TEXT"),
        (
            &mut owners,
            "INSERT INTO owner_jobs VALUES (1) RETURNING id::TEXT",
        ),
    ] {
        sqlx::raw_sql("BEGIN")
            .execute(&mut *conn)
            .await
            .expect("BEGIN");
        sqlx::query_scalar::<_, String>(statement)
            .fetch_one(&mut *conn)
            .await
            .expect("a transaction id taken");
    }

    let plants: Vec<i64> = (1..=100).collect();
    app.add_plants(&plants).await;
    delete_from_clients(&app, &plants, 10).await;
    let expected = logged_ids(&app).await;
    assert_eq!(expected.len(), 100);
    receiver
        .wait_for(
            Duration::from_secs(2),
            "every event while both stay open",
            |got| {
                let accepted: HashSet<&str> = got.iter().map(|r| r.id.as_str()).collect();
                expected.iter().all(|id| accepted.contains(id.as_str()))
            },
        )
        .await;
    for conn in [&mut elsewhere, &mut owners] {
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut *conn)
            .await
            .expect("ROLLBACK");
    }
}

async fn rings(heard: &mut CommitNewsReceiver, what: &str) {
    if tokio::time::timeout(WITHIN, heard.changed()).await.is_err() {
        panic!("nothing heard within {WITHIN:?} of {what}");
    }
}

/// Short waits, so retries happen within a test.
fn quick_retries(config: &mut Config) {
    config.serve.webhooks.webhook_timeout = Duration::from_millis(500);
    config.serve.webhooks.webhook_retry_min = Duration::from_millis(50);
    config.serve.webhooks.webhook_retry_max = Duration::from_millis(300);
}

async fn spawn(backend: Backend) -> TestApp {
    spawn_app_on(TestDb::new(backend).await, quick_retries).await
}

fn plantstore(app: &TestApp, args: &[&str]) -> Output {
    plantstore_on(&app.db.url, args)
}

/// Adds `receiver` as an endpoint, and has it verify with the secret printed.
fn add_endpoint(app: &TestApp, receiver: &Receiver, extra: &[&str]) -> i64 {
    let mut args = vec!["webhooks", "add", receiver.url.as_str()];
    args.extend_from_slice(extra);
    let out = succeeded(&plantstore(app, &args));
    let secret = out.lines().last().expect("a secret line");
    assert!(secret.starts_with("whsec_"), "{out}");
    receiver.verify_with(secret);
    out.split_whitespace()
        .nth(3)
        .and_then(|id| id.parse().ok())
        .expect("the endpoint id")
}

fn endpoints(app: &TestApp) -> Vec<Value> {
    let out = succeeded(&plantstore(app, &["webhooks", "list", "--json"]));
    match serde_json::from_str(&out) {
        Ok(Value::Array(list)) => list,
        other => panic!("not a JSON array: {other:?}\n{out}"),
    }
}

/// Waits until the endpoint's cursor is saved past every event.
async fn wait_until_nothing_pending(app: &TestApp) -> Value {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let list = endpoints(app);
        if list[0]["pending"] == 0 {
            return list[0].clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still pending: {list:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn delete_all(app: &TestApp, ids: impl IntoIterator<Item = i64>) {
    let answers = futures::future::join_all(ids.into_iter().map(|id| app.delete_id(id))).await;
    for answer in answers {
        assert_eq!(answer.status(), StatusCode::NO_CONTENT);
    }
}

/// Deletes `plants` in `clients` shares that run side by side.
async fn delete_from_clients(app: &TestApp, plants: &[i64], clients: usize) {
    let shares = plants.chunks(plants.len().div_ceil(clients).max(1));
    let deleting = futures::stream::iter(shares.map(|share| delete_all(app, share.to_vec())));
    futures::StreamExt::for_each_concurrent(deleting, clients, |delete| delete).await;
}

/// The webhook-ids of the deletion log's entries, as deletions.
async fn logged_ids(app: &TestApp) -> HashSet<String> {
    app.db
        .deletion_ids()
        .await
        .into_iter()
        .map(|id| format!("deletion_{id}"))
        .collect()
}

/// Scrapes `/metrics` until `series` has a value `wanted` takes; that scrape.
async fn wait_for_series(
    app: &TestApp,
    series: &str,
    wanted: impl Fn(f64) -> bool,
) -> HashMap<String, f64> {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let scraped = scrape(app).await;
        if scraped.get(series).is_some_and(|value| wanted(*value)) {
            return scraped;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} is {:?}",
            scraped.get(series)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the receiver has accepted each of `expected`.
async fn wait_until_accepted(receiver: &Receiver, expected: &HashSet<String>) {
    receiver
        .wait_for(WITHIN, "every delete accepted", |got| {
            let accepted: HashSet<&str> = got
                .iter()
                .filter(|r| r.accepted)
                .map(|r| r.id.as_str())
                .collect();
            expected.iter().all(|id| accepted.contains(id.as_str()))
        })
        .await;
}

fn accepted_ids(receiver: &Receiver) -> Vec<String> {
    receiver.accepted().into_iter().map(|r| r.id).collect()
}

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
    let plants: Vec<i64> = (1..=40).collect();
    app.add_plants(&plants).await;
    delete_all(&app, plants.iter().copied()).await;

    let expected = logged_ids(&app).await;
    assert_eq!(expected.len(), 40);
    wait_until_accepted(&receiver, &expected).await;

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
    let plants: Vec<i64> = (1..=60).collect();
    app.add_plants(&plants).await;
    delete_all(&app, plants.iter().copied()).await;

    let expected = logged_ids(&app).await;
    assert_eq!(expected.len(), 60);
    wait_until_accepted(&receiver, &expected).await;
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
    let series = wait_for_series(&app, &pending, |value| value == 0.0).await;
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

async fn a_410_disables_the_endpoint_until_it_is_enabled(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(410)).await;
    let app = spawn(backend).await;
    let id = add_endpoint(&app, &receiver, &[]);
    app.add_plants(&[1, 2]).await;
    delete_all(&app, [1]).await;
    receiver
        .wait_for(WITHIN, "one 410", |got| !got.is_empty())
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let endpoint = &endpoints(&app)[0];
    assert_eq!(endpoint["state"], "disabled", "{endpoint}");
    assert!(
        endpoint["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("410"),
        "{endpoint}"
    );

    delete_all(&app, [2]).await;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(
        receiver.received().len(),
        1,
        "a disabled endpoint gets nothing"
    );

    receiver.set_default(Reply::Status(204));
    succeeded(&plantstore(&app, &["webhooks", "enable", &id.to_string()]));
    let expected = logged_ids(&app).await;
    receiver
        .wait_for(WITHIN, "both deletes after enable", |got| {
            let accepted: HashSet<String> = got
                .iter()
                .filter(|r| r.accepted)
                .map(|r| r.id.clone())
                .collect();
            accepted == expected
        })
        .await;
    assert_eq!(wait_until_nothing_pending(&app).await["state"], "active");
}

async fn replay_sends_again_from_an_entry_with_the_same_ids(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(204)).await;
    let app = spawn(backend).await;
    let id = add_endpoint(&app, &receiver, &[]);
    app.add_plants(&[1, 2, 3]).await;
    for plant in [1, 2, 3] {
        delete_all(&app, [plant]).await;
    }
    receiver
        .wait_for(WITHIN, "three deletes", |got| got.len() == 3)
        .await;
    wait_until_nothing_pending(&app).await;
    let first_round = receiver.accepted();

    let entries = app.db.deletion_ids().await;
    succeeded(&plantstore(
        &app,
        &[
            "webhooks",
            "replay",
            &id.to_string(),
            "--from",
            &entries[1].to_string(),
        ],
    ));
    receiver
        .wait_for(WITHIN, "two replayed", |got| got.len() >= 5)
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = receiver.accepted();
    assert_eq!(got.len(), 5, "{got:#?}");
    // Different plants may arrive in either order; each repeat is the same event.
    let mut replayed: Vec<&str> = got[3..].iter().map(|r| r.id.as_str()).collect();
    replayed.sort_unstable();
    let from_second: Vec<String> = entries[1..]
        .iter()
        .map(|id| format!("deletion_{id}"))
        .collect();
    assert_eq!(replayed, from_second);
    for again in &got[3..] {
        let before = first_round
            .iter()
            .find(|r| r.id == again.id)
            .expect("sent before");
        assert_eq!(again.body, before.body);
    }
}

async fn prune_keeps_what_an_endpoint_has_not_received(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(500)).await;
    let app = spawn(backend).await;
    add_endpoint(&app, &receiver, &[]);
    app.add_plants(&[1, 2, 3]).await;
    delete_all(&app, [1, 2, 3]).await;
    receiver
        .wait_for(WITHIN, "a failed attempt", |got| !got.is_empty())
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let pruned = succeeded(&plantstore(
        &app,
        &["deletions", "prune", "--older-than", "0s"],
    ));
    assert!(pruned.starts_with("pruned 0 "), "{pruned}");
    assert_eq!(app.db.deletion_ids().await.len(), 3);

    receiver.set_default(Reply::Status(204));
    wait_until_nothing_pending(&app).await;
    succeeded(&plantstore(
        &app,
        &["deletions", "prune", "--older-than", "0s"],
    ));
    // SQLite keeps its newest entry, so ids never go back behind an endpoint's cursor.
    let left = app.db.deletion_ids().await.len();
    let kept = if backend == Backend::Sqlite { 1 } else { 0 };
    assert_eq!(left, kept);
}

async fn two_instances_deliver_each_event_once(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(204)).await;
    let first = spawn(backend).await;
    let mut config = test_config(&first.db.url);
    quick_retries(&mut config);
    let other_address = serve_another(&config).await;
    add_endpoint(&first, &receiver, &[]);
    // Both instances have claimed (or failed to claim) the lease by now.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let plants: Vec<i64> = (1..=60).collect();
    first.add_plants(&plants).await;
    let answers = futures::future::join_all(plants.iter().map(|id| {
        let address = if id % 2 == 0 {
            &first.address
        } else {
            &other_address
        };
        first
            .client
            .delete(format!("{address}/plants/{id}"))
            .bearer_auth(&first.token)
            .send()
    }))
    .await;
    for answer in answers {
        assert_eq!(answer.expect("an answer").status(), StatusCode::NO_CONTENT);
    }
    let expected = logged_ids(&first).await;
    wait_until_accepted(&receiver, &expected).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ids: Vec<String> = receiver.received().into_iter().map(|r| r.id).collect();
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!(ids.len(), distinct.len(), "repeats: {ids:?}");
}

/// An instance stopped as `docker stop` or a rolling restart stops it saves how far its
/// deliveries got: nothing is left pending, and the instance taking over sends only what
/// is new.
async fn a_graceful_stop_leaves_the_next_instance_nothing_to_repeat(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(204)).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (first, serving) = spawn_app_until(TestDb::new(backend).await, quick_retries, async {
        let _ = stopped.await;
    })
    .await;
    let mut config = test_config(&first.db.url);
    quick_retries(&mut config);
    add_endpoint(&first, &receiver, &[]);
    let plants: Vec<i64> = (1..=41).collect();
    first.add_plants(&plants).await;
    delete_all(&first, 1..=40).await;
    let expected = logged_ids(&first).await;
    wait_until_accepted(&receiver, &expected).await;

    let _ = stop.send(());
    serving
        .await
        .expect("the first instance ran")
        .expect("the first instance stopped cleanly");
    let endpoint = &endpoints(&first)[0];
    assert_eq!(endpoint["pending"], 0, "{endpoint}");

    let next_address = serve_another(&config).await;
    let answer = first
        .client
        .delete(format!("{next_address}/plants/41"))
        .bearer_auth(&first.token)
        .send()
        .await
        .expect("an answer");
    assert_eq!(answer.status(), StatusCode::NO_CONTENT);
    receiver
        .wait_for(WITHIN, "the delete made on the next instance", |got| {
            got.len() > 40
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ids: Vec<String> = receiver.received().into_iter().map(|r| r.id).collect();
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!((ids.len(), distinct.len()), (41, 41), "repeats: {ids:?}");
}

async fn each_refused_command_is_one_clear_line(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(204)).await;
    let app = spawn(backend).await;
    let id = add_endpoint(&app, &receiver, &[]).to_string();
    let refusals = [
        (
            vec!["webhooks", "add", "ftp://example.com/x"],
            "a webhook URL must be http:// or https://",
        ),
        (vec!["webhooks", "add", "not a url"], "is not a URL"),
        (
            vec!["webhooks", "add", receiver.url.as_str()],
            "exists already",
        ),
        (
            vec![
                "webhooks",
                "add",
                "https://example.com/x",
                "--events",
                "plant.eaten",
            ],
            "unknown event type 'plant.eaten'",
        ),
        (
            vec!["webhooks", "remove", "999"],
            "no webhook endpoint has id 999",
        ),
        (
            vec!["webhooks", "enable", "999"],
            "no webhook endpoint has id 999",
        ),
        (
            vec!["webhooks", "replay", &id, "--from", "999"],
            "no deletion log entry has id 999",
        ),
        (
            vec!["webhooks", "rotate-secret", "999"],
            "no webhook endpoint has id 999",
        ),
        (
            vec![
                "webhooks",
                "rotate-secret",
                &id,
                "--overlap",
                "1000000years",
            ],
            "the overlap is too long",
        ),
        // Past 9999, SQLite's times as text (`+10027-…`) would sort before today's.
        (
            vec!["webhooks", "rotate-secret", &id, "--overlap", "8000years"],
            "the overlap is too long",
        ),
    ];
    for (args, says) in refusals {
        let line = refused(&plantstore(&app, &args));
        assert!(line.contains(says), "{args:?}: {line}");
    }
    assert_eq!(endpoints(&app).len(), 1);
    succeeded(&plantstore(&app, &["webhooks", "remove", &id]));
    assert!(endpoints(&app).is_empty());
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

    let failing = wait_for_series(&app, &pending, |value| value == 3.0).await;
    assert!(failing[&failed] >= 1.0, "{failing:?}");
    // Each result's series is there from the start, at 0 until an attempt has it.
    assert_eq!(failing.get(&delivered), Some(&0.0), "{failing:?}");

    receiver.set_default(Reply::Status(204));
    wait_until_nothing_pending(&app).await;
    let caught_up = wait_for_series(&app, &pending, |value| value == 0.0).await;
    assert_eq!(caught_up[&delivered], 3.0, "{caught_up:?}");
    assert_eq!(caught_up[&lags], 3.0, "{caught_up:?}");

    receiver.set_default(Reply::Status(500));
    delete_all(&app, 4..=5).await;
    wait_for_series(&app, &pending, |value| value == 2.0).await;
    succeeded(&plantstore(&app, &["webhooks", "remove", &id.to_string()]));
    wait_for_series(&app, &pending, |value| value == 0.0).await;
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

/// Removing an endpoint stops its delivery; an endpoint added after it gets a new id (on
/// SQLite too, where the removed one's id was handed out again) and its own events, none
/// of which go to the removed URL.
async fn a_removed_endpoint_gets_nothing_more_and_its_id_is_never_reused(backend: Backend) {
    let (removed, added) = (
        Receiver::start(&[], Reply::Status(204)).await,
        Receiver::start(&[], Reply::Status(204)).await,
    );
    let app = spawn(backend).await;
    let first = add_endpoint(&app, &removed, &[]);
    app.add_plants(&(1..=40).collect::<Vec<_>>()).await;
    delete_all(&app, 1..=5).await;
    removed
        .wait_for(WITHIN, "the first endpoint's events", |got| got.len() >= 5)
        .await;

    succeeded(&plantstore(
        &app,
        &["webhooks", "remove", &first.to_string()],
    ));
    let second = add_endpoint(&app, &added, &[]);
    assert!(second > first, "ids {first} then {second}");
    tokio::time::sleep(FOLLOWS_WITHIN).await;
    let before = removed.received().len();
    delete_all(&app, 6..=40).await;
    added
        .wait_for(WITHIN, "the new endpoint's events", |got| {
            got.iter().filter(|r| r.accepted).count() >= 35
        })
        .await;
    wait_until_nothing_pending(&app).await;
    assert_eq!(removed.received().len(), before, "the removed URL got more");
    assert!(added.received().iter().all(|r| r.verified));
}

/// `rotate-secret` prints the new secret alone on its last line; until the overlap ends
/// every request carries a signature by each secret, so a receiver verifies with either;
/// `--overlap 0s` ends the old one at once. `webhooks list` shows when the overlap ends.
async fn a_rotated_secret_signs_beside_the_old_one_until_the_overlap_ends(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(204)).await;
    let app = spawn(backend).await;
    let id = add_endpoint(&app, &receiver, &[]).to_string();
    let first_secret = receiver_secret(&receiver);
    assert!(endpoints(&app)[0]["previous_secret_until"].is_null());
    app.add_plants(&(1..=30).collect::<Vec<_>>()).await;

    let rotate = |overlap: &str| {
        let out = succeeded(&plantstore(
            &app,
            &["webhooks", "rotate-secret", &id, "--overlap", overlap],
        ));
        let secret = out.lines().last().expect("a secret line").to_owned();
        assert!(secret.starts_with("whsec_"), "{out}");
        (out, secret)
    };
    // Deletes `plants` once the instance took up the rotation; the requests for them.
    let delivered_after_rotation = |plants: std::ops::RangeInclusive<i64>| {
        let (app, receiver) = (&app, &receiver);
        async move {
            tokio::time::sleep(FOLLOWS_WITHIN).await;
            let before = receiver.received().len();
            let count = plants.clone().count();
            delete_all(app, plants).await;
            receiver
                .wait_for(WITHIN, "the events after the rotation", |got| {
                    got.len() >= before + count
                })
                .await;
            receiver.received().split_off(before)
        }
    };

    let (said, second_secret) = rotate("1h");
    assert!(said.contains("until"), "{said}");
    assert!(endpoints(&app)[0]["previous_secret_until"].is_string());
    for request in delivered_after_rotation(1..=10).await {
        assert_eq!(request.signature.split(' ').count(), 2, "{request:?}");
        assert!(request.signed_with(&first_secret), "{request:?}");
        assert!(request.signed_with(&second_secret), "{request:?}");
    }

    let (_, third_secret) = rotate("0s");
    assert!(endpoints(&app)[0]["previous_secret_until"].is_null());
    for request in delivered_after_rotation(11..=20).await {
        assert_eq!(request.signature.split(' ').count(), 1, "{request:?}");
        assert!(request.signed_with(&third_secret), "{request:?}");
        assert!(!request.signed_with(&second_secret), "{request:?}");
    }
}

/// The secret `add_endpoint` gave `receiver`.
fn receiver_secret(receiver: &Receiver) -> String {
    receiver.secrets().first().cloned().expect("a secret")
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
    let failing = tokio::time::timeout(WITHIN, async {
        loop {
            let endpoint = endpoints(&app).remove(0);
            if endpoint["last_error"].is_string() {
                break endpoint;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the endpoint failing after the redirect");
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
