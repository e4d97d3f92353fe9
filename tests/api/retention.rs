//! The deletion log kept to `PLANTSTORE_DELETION_RETENTION` by the running service: entries
//! older than the retention go, while younger ones and those a destination has yet to
//! receive stay, and the instance pruning holds the chore's lease until it stops. (A
//! retention shorter than the idempotency TTL is refused at start: `cli.rs`, with the other
//! bad settings.)

use std::time::Duration;

use plantstore::config::Retention;

use crate::{
    fixtures::receiver::{Receiver, Reply},
    helpers::{
        Backend, TestApp, eventually, plantstore_on, serve_another, serve_another_until, spawn_app,
        succeeded, test_config,
    },
    metrics::scrape_at,
    on_both_backends, on_either_pool,
};

on_both_backends!(old_entries_go_and_what_a_destination_needs_stays);

const DAY: Duration = Duration::from_secs(86_400);

/// Log entries of plants `from..=to`.
async fn entries(app: &TestApp, from: i64, to: i64) -> i64 {
    let sql = "SELECT COUNT(*) FROM plantstore_deletions WHERE plant_id BETWEEN $1 AND $2";
    on_either_pool!(&app.db.pool, |pool| sqlx::query_scalar(sql)
        .bind(from)
        .bind(to)
        .fetch_one(pool)
        .await)
    .expect("a count")
}

/// Events the one webhook endpoint has yet to receive, as `webhooks list` counts them.
fn pending(app: &TestApp) -> i64 {
    crate::webhooks::endpoints(app)[0]["pending"]
        .as_i64()
        .expect("a pending count")
}

async fn old_entries_go_and_what_a_destination_needs_stays(backend: Backend) {
    let app = spawn_app(backend).await;
    let receiver = Receiver::start(&[], Reply::Status(204)).await;
    succeeded(&plantstore_on(
        &app.db.url,
        &["webhooks", "add", receiver.url.as_str()],
    ));
    // More than one batch (500) of entries the endpoint has received.
    let plants: Vec<i64> = (1..=1240).collect();
    app.add_plants(&plants).await;
    for chunk in plants[40..].chunks(64) {
        let deletes = chunk.iter().map(|&plant| app.delete_id(plant));
        for answer in futures::future::join_all(deletes).await {
            assert_eq!(answer.status(), 204);
        }
    }
    for plant in 1..=20 {
        assert_eq!(app.delete_id(plant).await.status(), 204);
    }
    eventually(Duration::from_secs(60), "every event received", || async {
        (pending(&app) == 0).then_some(())
    })
    .await;
    // The receiver fails from now on: what is deleted next waits for it.
    receiver.set_default(Reply::Status(500));
    for plant in 21..=40 {
        assert_eq!(app.delete_id(plant).await.status(), 204);
    }
    // Plants 1..=30 and 41..=1240 deleted 100 days ago, 31..=40 just now.
    let hundred_days_ago = chrono::Utc::now() - chrono::Duration::days(100);
    let sql =
        "UPDATE plantstore_deletions SET deleted_at = $1 WHERE plant_id NOT BETWEEN 31 AND $2";
    on_either_pool!(&app.db.pool, |pool| sqlx::query(sql)
        .bind(hundred_days_ago)
        .bind(40_i64)
        .execute(pool)
        .await
        .map(drop))
    .expect("entries made old");

    let mut config = test_config(&app.db.url);
    config.serve.deletion_retention = Retention(Some(90 * DAY));
    let (stop_pruning, pruning_stopped) = tokio::sync::oneshot::channel::<()>();
    let (pruning, serving) = serve_another_until(&config, async {
        let _ = pruning_stopped.await;
    })
    .await;
    eventually(
        Duration::from_secs(30),
        "the old entries no destination needs pruned",
        || async {
            (entries(&app, 1, 20).await + entries(&app, 41, 1240).await == 0).then_some(())
        },
    )
    .await;
    assert_eq!(
        entries(&app, 21, 30).await,
        10,
        "old, but the endpoint has yet to receive them"
    );
    assert_eq!(
        entries(&app, 31, 40).await,
        10,
        "younger than the retention"
    );
    let scraped = scrape_at(&app.client, &pruning).await;
    assert_eq!(
        scraped.get("plantstore_deletion_log_pruned_total"),
        Some(&1220.0)
    );
    // The size read each minute follows the prune at once, not at the next read.
    eventually(
        Duration::from_secs(5),
        "the log size after the prune",
        || async {
            let scraped = scrape_at(&app.client, &pruning).await;
            (scraped.get("plantstore_deletion_log_entries") == Some(&20.0)).then_some(())
        },
    )
    .await;
    assert_eq!(
        scraped.get("plantstore_deletion_retention_seconds"),
        Some(&(90.0 * 86_400.0))
    );
    let sql = "SELECT owner FROM plantstore_leases WHERE name = 'deletion_log_retention'";
    let owner: String = on_either_pool!(&app.db.pool, |pool| sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await)
    .expect("the chore's lease");
    let address = pruning.trim_start_matches("http://");
    assert!(owner.ends_with(address), "{owner} is not {address}");

    // Another instance with the same retention finds the lease held, and leaves it.
    serve_another(&config).await;
    crate::helpers::nothing_happens_within(Duration::from_secs(1)).await;
    let still: String = on_either_pool!(&app.db.pool, |pool| sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await)
    .expect("the chore's lease");
    assert_eq!(still, owner);

    // Stopped as SIGTERM stops it, the pruning instance gives the lease back: the next
    // instance to start (a restart, a deploy) prunes at once, not three minutes later.
    let _ = stop_pruning.send(());
    serving
        .await
        .expect("the instance's task")
        .expect("a clean stop");
    let left: Option<String> = on_either_pool!(&app.db.pool, |pool| sqlx::query_scalar(sql)
        .fetch_optional(pool)
        .await)
    .expect("the leases");
    assert_eq!(left, None, "the lease given back");
}
