//! Deletion events: endpoints added with `plantstore webhooks`, and what a receiver gets
//! from the running service: every committed delete, signed, in order per plant, again
//! after failures, once across instances. One file per subject: `delivery.rs` (what a
//! receiver gets), `commands.rs` (the endpoint commands' effect on delivery),
//! `instances.rs` (several instances, stops, and commits made elsewhere).

mod commands;
mod delivery;
mod instances;

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
    fixtures::receiver::{Received, Receiver, Reply},
    helpers::{
        Backend, TestApp, TestDb, eventually, nothing_happens_within, plantstore_on, refused,
        serve_another, spawn_app_on, spawn_app_until, succeeded, test_config,
    },
    metrics::{scrape, wait_for_series},
};

/// How long the tests wait for deliveries that should take well under a second.
const WITHIN: Duration = Duration::from_secs(20);

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

/// The endpoints as `webhooks list --json` shows them.
pub fn endpoints(app: &TestApp) -> Vec<Value> {
    let out = succeeded(&plantstore(app, &["webhooks", "list", "--json"]));
    match serde_json::from_str(&out) {
        Ok(Value::Array(list)) => list,
        other => panic!("not a JSON array: {other:?}\n{out}"),
    }
}

/// Waits until the (first) endpoint, as `webhooks list` shows it, is `wanted`; returns it.
async fn wait_for_endpoint(app: &TestApp, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
    let wanted = &wanted;
    eventually(WITHIN, what, || async move {
        endpoints(app).into_iter().next().filter(wanted)
    })
    .await
}

/// Waits until the endpoint's cursor is saved past every event.
async fn wait_until_nothing_pending(app: &TestApp) -> Value {
    wait_for_endpoint(app, "nothing pending", |endpoint| endpoint["pending"] == 0).await
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

/// Adds plants 1..=`count`, deletes each with a 204, and waits until the receiver has
/// accepted the event of every entry that logged.
async fn delete_and_await_delivery(app: &TestApp, receiver: &Receiver, count: i64) {
    let plants: Vec<i64> = (1..=count).collect();
    app.add_plants(&plants).await;
    delete_all(app, plants.iter().copied()).await;
    let expected = logged_ids(app).await;
    assert_eq!(expected.len(), plants.len());
    wait_until_accepted(receiver, &expected).await;
}

/// Waits until the receiver has accepted each of `expected`.
async fn wait_until_accepted(receiver: &Receiver, expected: &HashSet<String>) {
    wait_until_accepted_within(WITHIN, receiver, expected).await;
}

async fn wait_until_accepted_within(
    within: Duration,
    receiver: &Receiver,
    expected: &HashSet<String>,
) {
    receiver
        .wait_for(within, "every delete accepted", |got| {
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

/// The secret `add_endpoint` gave `receiver`.
fn receiver_secret(receiver: &Receiver) -> String {
    receiver.secrets().first().cloned().expect("a secret")
}
