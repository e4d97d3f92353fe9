//! `sqlite-raw DATABASE_URL FIRST_ID SECONDS`: deletes ids FIRST_ID, FIRST_ID + 1, ... one
//! autocommit `DELETE` each, on one connection opened with exactly the service's settings,
//! for SECONDS; prints one JSON line with the count and the latency percentiles.

use std::time::{Duration, Instant};

use plantstore_store::StoreSettings;
use sqlx::{ConnectOptions, Connection};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, first_id, seconds] = args.as_slice() else {
        return Err("usage: sqlite-raw DATABASE_URL FIRST_ID SECONDS".into());
    };
    let first_id: i64 = first_id.parse().map_err(|_| "FIRST_ID: an integer")?;
    let seconds: f64 = seconds.parse().map_err(|_| "SECONDS: a number")?;
    let settings = StoreSettings {
        max_connections: 1,
        acquire_timeout: Duration::from_secs(3),
        idempotency_ttl: Duration::from_secs(60),
        commit_observer: None,
    };
    let options = plantstore_sqlite::connect_options(url, &settings).map_err(|e| e.to_string())?;
    let mut conn = options.connect().await.map_err(|e| e.to_string())?;

    let mut latencies = Vec::new();
    let mut deleted = 0u64;
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let mut id = first_id;
    while Instant::now() < until {
        let one = Instant::now();
        let done = sqlx::query("DELETE FROM plants WHERE id = ?")
            .bind(id)
            .execute(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        latencies.push(one.elapsed());
        deleted += done.rows_affected();
        id += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    conn.close().await.map_err(|e| e.to_string())?;

    latencies.sort();
    let percentile = |p: f64| {
        let index = ((latencies.len() as f64 - 1.0) * p).round() as usize;
        latencies
            .get(index)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    println!(
        r#"{{"deleted": {deleted}, "statements": {}, "seconds": {elapsed:.3}, "p50_ms": {:.3}, "p99_ms": {:.3}}}"#,
        latencies.len(),
        percentile(0.50),
        percentile(0.99)
    );
    Ok(())
}
