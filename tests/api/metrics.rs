//! `/metrics`: each counter moves by exactly what the requests between two scrapes did,
//! and the pool, the queue and the group-commit batches are there; the gauges the alert
//! rules read (deploy/prometheus) tell the instance's state.

use std::{collections::HashMap, time::Duration};

use reqwest::StatusCode;

use crate::{
    fixtures::receiver::{Receiver, Reply},
    helpers::{
        Backend, TestApp, eventually, http_client, plantstore_on, serve_another, spawn_app,
        succeeded, test_config,
    },
    on_both_backends, on_either_pool,
};

on_both_backends!(every_counter_moves_by_what_the_requests_did);
on_both_backends!(the_gauges_the_alerts_read_tell_the_instance_s_state);

/// One scrape: each series (name and labels, as printed) with its value.
pub async fn scrape(app: &TestApp) -> HashMap<String, f64> {
    scrape_at(&app.client, &app.address).await
}

/// One scrape of the instance at `address` (`http://host:port`).
pub async fn scrape_at(client: &reqwest::Client, address: &str) -> HashMap<String, f64> {
    let response = client
        .get(format!("{address}/metrics"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = response.text().await.expect("a body");
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("series and value");
            (series.to_owned(), value.parse().expect("a number"))
        })
        .collect()
}

/// Scrapes `/metrics` until `series` has a value `wanted` takes, within `within`; that
/// scrape.
pub async fn wait_for_series(
    app: &TestApp,
    within: Duration,
    series: &str,
    wanted: impl Fn(f64) -> bool,
) -> HashMap<String, f64> {
    let (wanted, what) = (&wanted, format!("{series} as wanted"));
    eventually(within, &what, || async move {
        let scraped = scrape(app).await;
        let value = scraped.get(series).copied();
        value.is_some_and(wanted).then_some(scraped)
    })
    .await
}

async fn every_counter_moves_by_what_the_requests_did(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[1]).await;
    let before = scrape(&app).await;

    assert_eq!(app.delete("1").await.status(), StatusCode::NO_CONTENT);
    assert_eq!(app.delete("1").await.status(), StatusCode::NOT_FOUND);
    assert_eq!(app.delete("abc").await.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        app.delete_with("1", None).await.status(),
        StatusCode::UNAUTHORIZED
    );
    let unknown = format!("pst_{}_{}", "a".repeat(12), "b".repeat(40));
    assert_eq!(
        app.delete_with("1", Some(&unknown)).await.status(),
        StatusCode::UNAUTHORIZED
    );
    let basic = app
        .client
        .delete(format!("{}/plants/1", app.address))
        .header("authorization", "Basic dXNlcjpwYXNz")
        .send()
        .await
        .expect("answer");
    assert_eq!(basic.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(app.get("/healthz").await.status(), StatusCode::OK);
    // The route's label comes from the router: a refused method is still its route's, a
    // path no route matches is `other` (so invented paths make no new series).
    assert_eq!(
        app.get("/plants/1").await.status(),
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        app.get("/no/such/path").await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(app.get("/openapi.json").await.status(), StatusCode::OK);
    let root = app.client.get(format!("{}/", app.address));
    let root = root.send().await.expect("answer");
    assert_eq!(root.status(), StatusCode::OK, "redirected to Swagger UI");
    let after = scrape(&app).await;

    let moved = |series: &str| {
        after.get(series).copied().unwrap_or(0.0) - before.get(series).copied().unwrap_or(0.0)
    };
    let requests = |method: &str, route: &str, status: u16| {
        moved(&format!(
            r#"plantstore_http_requests_total{{route="{route}",method="{method}",status="{status}"}}"#
        ))
    };
    assert_eq!(requests("DELETE", "/plants/{id}", 204), 1.0);
    assert_eq!(requests("DELETE", "/plants/{id}", 404), 1.0);
    assert_eq!(requests("DELETE", "/plants/{id}", 400), 1.0);
    assert_eq!(requests("DELETE", "/plants/{id}", 401), 3.0);
    assert_eq!(requests("GET", "/healthz", 200), 1.0);
    assert_eq!(requests("GET", "/plants/{id}", 405), 1.0);
    assert_eq!(requests("GET", "other", 404), 1.0);
    assert_eq!(requests("GET", "/openapi.json", 200), 1.0);
    assert_eq!(requests("GET", "/", 303), 1.0);
    assert_eq!(requests("GET", "/docs", 200), 1.0);
    // The first scrape is counted once it has been answered.
    assert_eq!(requests("GET", "/metrics", 200), 1.0);
    assert_eq!(
        moved(r#"plantstore_http_request_duration_seconds_count{route="/plants/{id}"}"#),
        7.0
    );
    assert_eq!(moved("plantstore_deletions_total"), 1.0);
    for (reason, count) in [
        ("missing", 1.0),
        ("unknown", 1.0),
        ("malformed", 1.0),
        ("revoked", 0.0),
    ] {
        let series = format!(r#"plantstore_auth_failures_total{{reason="{reason}"}}"#);
        assert_eq!(moved(&series), count, "{reason}");
    }
    // Two commits of one delete each: the 204, then the 404 (its id was looked for).
    assert_eq!(moved("plantstore_commit_batch_size_count"), 2.0);
    assert_eq!(moved("plantstore_commit_batch_size_sum"), 2.0);
    // Three requests with the app's token and one with an unknown one reached the table.
    let lookups = moved(r#"plantstore_token_cache_lookups_total{result="hit"}"#)
        + moved(r#"plantstore_token_cache_lookups_total{result="miss"}"#);
    assert_eq!(lookups, 4.0);
    for state in ["idle", "in_use"] {
        assert!(after.contains_key(&format!(
            r#"plantstore_db_pool_connections{{state="{state}"}}"#
        )));
    }
    assert_eq!(after.get("plantstore_delete_queue_waiting"), Some(&0.0));
}

async fn the_gauges_the_alerts_read_tell_the_instance_s_state(backend: Backend) {
    let app = spawn_app(backend).await;
    let receiver = Receiver::start(&[], Reply::Status(500)).await;
    succeeded(&plantstore_on(
        &app.db.url,
        &["webhooks", "add", receiver.url.as_str()],
    ));
    let endpoint = crate::webhooks::endpoints(&app)[0]["id"].to_string();
    app.add_plants(&[1, 2, 3]).await;
    for plant in 1..=3 {
        assert_eq!(app.delete_id(plant).await.status(), StatusCode::NO_CONTENT);
    }
    let day_ago = chrono::Utc::now() - chrono::Duration::days(1);
    let sql = "UPDATE plantstore_deletions SET deleted_at = $1 WHERE plant_id = 1";
    on_either_pool!(&app.db.pool, |pool| sqlx::query(sql)
        .bind(day_ago)
        .execute(pool)
        .await
        .map(drop))
    .expect("the first entry made a day old");
    // Another instance, whose first read of the log's size comes after the deletes.
    let mut config = test_config(&app.db.url);
    config.serve.request_timeout = Duration::from_secs(7);
    let other = serve_another(&config).await;
    let client = http_client();
    let failing =
        format!(r#"plantstore_webhook_endpoint_state{{endpoint="{endpoint}",state="failing"}}"#);
    // Both are read in the background, each on its own round: the log's size (a count of
    // the whole table on PostgreSQL) may come after the endpoint's state on a loaded machine.
    let scraped = eventually(
        Duration::from_secs(30),
        "the endpoint seen failing, and the log's size read",
        || async {
            let scraped = scrape_at(&client, &other).await;
            (scraped.get(&failing) == Some(&1.0)
                && scraped.contains_key("plantstore_deletion_log_entries"))
            .then_some(scraped)
        },
    )
    .await;
    let value = |series: &str| {
        *scraped
            .get(series)
            .unwrap_or_else(|| panic!("{series} is missing"))
    };
    for (series, expected) in [
        ("plantstore_ready", 1.0),
        ("plantstore_database_reachable", 1.0),
        ("plantstore_database_hosts", 1.0),
        ("plantstore_database_host_changes_total", 0.0),
        ("plantstore_request_timeout_seconds", 7.0),
        ("plantstore_deletion_retention_seconds", 0.0),
        ("plantstore_deletion_log_entries", 3.0),
    ] {
        assert_eq!(value(series), expected, "{series}");
    }
    for (state, expected) in [("active", 0.0), ("failing", 1.0), ("disabled", 0.0)] {
        let series = format!(
            r#"plantstore_webhook_endpoint_state{{endpoint="{endpoint}",state="{state}"}}"#
        );
        assert_eq!(value(&series), expected, "{series}");
    }
    let pending = format!(r#"plantstore_webhook_pending_events{{endpoint="{endpoint}"}}"#);
    assert_eq!(value(&pending), 3.0);
    // As of the scrape: a day and the few seconds since.
    let age = value("plantstore_deletion_log_oldest_entry_age_seconds");
    assert!(
        (86_400.0..86_460.0).contains(&age),
        "oldest entry {age} s old"
    );
    assert!(value("process_resident_memory_bytes") > 1e6);
    assert!(value("process_open_fds") > 0.0);
    assert!(value("process_max_fds") >= value("process_open_fds"));
    assert!(value("process_threads") >= 1.0);
    assert!(value("process_cpu_seconds_total") >= 0.0);
    let started = value("process_start_time_seconds");
    let now = chrono::Utc::now().timestamp() as f64;
    assert!(
        (now - 3600.0..=now).contains(&started),
        "started at {started}"
    );
}
