//! A PostgreSQL primary with a synchronous standby, whose replication link (a relay the
//! test owns) is frozen while `DELETE /plants/2` commits. The commit then becomes visible
//! the three ways PostgreSQL allows before the standby has it: crash recovery, a cancelled
//! wait, a terminated backend. Then the primary dies and the standby is promoted, which
//! takes the delete back. A webhook endpoint and a stream destination must have been told
//! nothing of it; the cancelled one must not have been answered 204; and the service goes
//! on, by itself, on the promoted server.
//!
//! The negative control (`cargo test --features negative-control`) runs the same scenarios
//! in a build whose deliveries do not wait for the standby: there the phantom must reach
//! both destinations, or the scenario proves nothing.

use std::{collections::HashSet, time::Duration};

use reqwest::StatusCode;
use sqlx::{Connection, PgConnection};

use crate::{
    fixtures::{
        nats::{NatsServer, read_stream, stream_config},
        pg_server::PgServer,
        proxy::Proxy,
        receiver::{Receiver, Reply},
    },
    helpers::{TestApp, TestDb, eventually, plantstore_on, spawn_app_until, succeeded},
};

const STANDBY: &str = "standby1";
const STREAM: &str = "PLANTS";
const WITHIN: Duration = Duration::from_secs(30);
/// The `Idempotency-Key` of the frozen delete that carries one.
const FROZEN_KEY: &str = "frozen";

/// How a commit waiting for the standby becomes visible to other sessions.
#[derive(Debug, Clone, Copy)]
enum Exposure {
    /// The waiting backend is killed (SIGKILL): the postmaster restarts, and crash recovery
    /// marks the commit committed.
    CrashRestart,
    /// `pg_cancel_backend`, as a pooler's query timeout: the commit is answered as a
    /// success with a WARNING.
    Cancel,
    /// `pg_terminate_backend`, as a fast shutdown: the connection ends.
    Terminate,
}

/// Runs `$check` once per `Exposure`, as the tests `$module::postgres_*`.
macro_rules! each_exposure {
    ($module:ident, $check:ident) => {
        mod $module {
            use super::{Exposure, $check};

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres_crash_restart() {
                $check(Exposure::CrashRestart).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres_cancel() {
                $check(Exposure::Cancel).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres_terminate() {
                $check(Exposure::Terminate).await;
            }
        }
    };
}

#[cfg(not(feature = "negative-control"))]
each_exposure!(barrier, no_event_for_what_the_failover_took_back);
#[cfg(feature = "negative-control")]
each_exposure!(
    negative_control_without_the_barrier,
    phantom_without_the_barrier
);

#[cfg(not(feature = "negative-control"))]
async fn no_event_for_what_the_failover_took_back(exposure: Exposure) {
    let mut run = Scenario::start().await;
    let answers = run.expose_frozen_deletes(exposure).await;
    // Both deliveries read the exposed entries and wait for the standby to hold them.
    run.wait_for_barriers(2).await;
    let retried = run.retry_the_keyed_delete().await;
    run.fail_over_and_delete_again().await;
    run.wait_for_plant_events(3, "plant 3's events after the failover")
        .await;
    let events = run.events().await;
    eprintln!(
        "{exposure:?}: {} events, {} for entries the promoted server lacks; the frozen deletes were answered {answers:?}, the keyed one's retry {retried}",
        events.received.len(),
        events.phantoms.len()
    );
    assert!(
        !answers.contains(&Some(StatusCode::NO_CONTENT)),
        "{exposure:?}: {answers:?}"
    );
    assert_ne!(retried, StatusCode::NO_CONTENT, "{exposure:?}: the retry");
    assert!(
        events.phantoms.is_empty(),
        "{exposure:?}: events for entries the promoted server lacks: {:?}",
        events.phantoms
    );
}

/// SIGTERM while the standby is cut off, with both deliveries waiting at the barrier and
/// the leases' renewal waiting for the standby too: the instance still stops, in bounded
/// time, as it does with a database that does not answer.
#[cfg(not(feature = "negative-control"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_stop_during_a_partition_does_not_hang() {
    let mut run = Scenario::start().await;
    run.expose_frozen_deletes(Exposure::Cancel).await;
    run.wait_for_barriers(2).await;
    let asked = std::time::Instant::now();
    run.stop.take().map(|stop| stop.send(()));
    let stopped = tokio::time::timeout(Duration::from_secs(30), &mut run.serving).await;
    eprintln!("stopped {:?} after it was asked to", asked.elapsed());
    assert!(
        matches!(stopped, Ok(Ok(Ok(())))),
        "the service did not stop within 30 s of SIGTERM during a partition: {stopped:?}"
    );
}

#[cfg(feature = "negative-control")]
async fn phantom_without_the_barrier(exposure: Exposure) {
    let mut run = Scenario::start().await;
    let answers = run.expose_frozen_deletes(exposure).await;
    run.wait_for_frozen_events().await;
    // Not waited for: after sending what the failover took back, a delivery may not send
    // plant 3's event at all (seen once in CI; its read position is past entries the
    // promoted server lacks, whose transaction ids it may hand out again).
    run.fail_over_and_delete_again().await;
    let events = run.events().await;
    let plant_3 = events.received.iter().filter(|(_, _, p)| *p == 3).count();
    eprintln!(
        "negative control, {exposure:?}: {} events, {} for entries the promoted server lacks, {plant_3} for plant 3; the frozen deletes were answered {answers:?}",
        events.received.len(),
        events.phantoms.len()
    );
    for destination in ["webhook", "stream"] {
        assert!(
            events
                .phantoms
                .iter()
                .any(|(to, _, plant)| *to == destination && *plant == 2),
            "{exposure:?}: no phantom at the {destination} without the barrier: {events:?}"
        );
    }
}

/// The cluster, the service on both hosts, a webhook receiver and a JetStream stream.
struct Scenario {
    primary: PgServer,
    standby: PgServer,
    link: Proxy,
    /// Stops the service as SIGTERM would.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
    app: TestApp,
    receiver: Receiver,
    nats: NatsServer,
}

/// What the destinations got, and of it what names an entry the promoted server lacks.
#[derive(Debug)]
struct Events {
    /// (destination, deletion id, plant id) of every event received.
    received: Vec<(&'static str, i64, i64)>,
    phantoms: Vec<(&'static str, i64, i64)>,
}

impl Scenario {
    /// Plant 1 deleted, and its event received by both destinations, before anything
    /// fails: a scenario whose deliveries do not work proves nothing.
    async fn start() -> Self {
        let primary = tokio::task::spawn_blocking(|| {
            PgServer::start_with(&[&format!("synchronous_standby_names={STANDBY}")])
        })
        .await
        .expect("the primary starts");
        let upstream = format!("127.0.0.1:{}", primary.port());
        let link = Proxy::start("127.0.0.1:0".parse().expect("an address"), upstream).await;
        let via_link = link.address.to_string();
        let standby =
            tokio::task::spawn_blocking(move || PgServer::start_standby(&via_link, STANDBY))
                .await
                .expect("the standby starts");
        let admin = primary.admin_url();
        eventually(WITHIN, "the standby replicating synchronously", || async {
            let mut conn = PgConnection::connect(&admin).await.ok()?;
            let state: Option<String> = sqlx::query_scalar(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1",
            )
            .bind(STANDBY)
            .fetch_optional(&mut conn)
            .await
            .ok()?;
            (state.as_deref() == Some("sync")).then_some(())
        })
        .await;

        let db = TestDb::postgres_on(admin).await;
        let hosts = format!("127.0.0.1:{},127.0.0.1:{}", primary.port(), standby.port());
        let url = format!("{}?target_session_attrs=read-write", db.url_via(&hosts));
        let receiver = Receiver::start(&[], Reply::Status(204)).await;
        let nats = NatsServer::start().await;
        nats.add_stream(stream_config(STREAM, &["plantstore.plants.>"]))
            .await;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = async move {
            let _ = stopped.await;
        };
        let (app, serving) = spawn_app_until(
            db,
            |config| {
                config.database_url = url.clone().into();
                // Two commit workers, so the two frozen deletes commit side by side.
                config.db_max_connections = 8;
                config.serve.webhooks.webhook_timeout = Duration::from_millis(1000);
                config.serve.webhooks.webhook_retry_min = Duration::from_millis(50);
                config.serve.webhooks.webhook_retry_max = Duration::from_millis(500);
            },
            stopped,
        )
        .await;
        app.add_plants(&[1, 2, 3, 4]).await;
        let out = succeeded(&plantstore_on(&url, &["webhooks", "add", &receiver.url]));
        receiver.verify_with(out.lines().last().expect("the secret"));
        succeeded(&plantstore_on(
            &url,
            &["streams", "add", &nats.url(), "--stream", STREAM],
        ));
        let run = Self {
            primary,
            standby,
            link,
            stop: Some(stop),
            serving,
            app,
            receiver,
            nats,
        };
        assert_eq!(run.app.delete_id(1).await.status(), StatusCode::NO_CONTENT);
        run.wait_for_plant_events(1, "plant 1's events before the freeze")
            .await;
        // And saved: a save waits for the standby too, and one still due when the link
        // freezes would hold its delivery before it reads again.
        let url = run.test_db_url_on(&run.primary);
        let saved = "SELECT count(*) FROM plantstore_webhook_endpoints
                     WHERE delivered_through IS NOT NULL";
        count_reaches(&url, saved, 2, "both destinations' progress saved").await;
        run
    }

    /// Freezes the link, sends `DELETE /plants/2` (no key: its statement is its commit)
    /// and `DELETE /plants/4` with `Idempotency-Key: frozen` (a transaction, then
    /// `COMMIT`), sees both commits wait in `SyncRep`, and makes them visible as `exposure`
    /// says; the deletes' answers, if they came.
    async fn expose_frozen_deletes(&mut self, exposure: Exposure) -> [Option<StatusCode>; 2] {
        self.link.stall();
        let unkeyed = self.app.delete_request("2").bearer_auth(&self.app.token);
        let keyed = self
            .app
            .delete_request("4")
            .bearer_auth(&self.app.token)
            .header("Idempotency-Key", FROZEN_KEY);
        let admin = self.primary.admin_url();
        // One after the other, so that they are two batches, each with its commit.
        let mut answers = Vec::new();
        let mut waiting = Vec::new();
        for request in [unkeyed, keyed] {
            let sent = request.send();
            answers.push(tokio::spawn(
                async move { sent.await.map(|r| r.status()).ok() },
            ));
            waiting = eventually(WITHIN, "the delete's commit waiting in SyncRep", || async {
                let mut conn = PgConnection::connect(&admin).await.ok()?;
                let pids: Vec<i32> = sqlx::query_scalar(
                    "SELECT pid FROM pg_stat_activity
                     WHERE application_name = 'plantstore' AND wait_event = 'SyncRep'
                       AND (query LIKE '%DELETE FROM plants%' OR query = 'COMMIT')",
                )
                .fetch_all(&mut conn)
                .await
                .ok()?;
                (pids.len() == answers.len()).then_some(pids)
            })
            .await;
        }
        let mut conn = PgConnection::connect(&admin).await.expect("admin");
        for pid in waiting {
            match exposure {
                // One killed backend restarts the whole server.
                Exposure::CrashRestart => {
                    let killed = std::process::Command::new("kill")
                        .args(["-KILL", &pid.to_string()])
                        .status()
                        .expect("kill runs");
                    assert!(killed.success(), "the waiting backend killed");
                    break;
                }
                Exposure::Cancel | Exposure::Terminate => {
                    let function = match exposure {
                        Exposure::Cancel => "pg_cancel_backend",
                        _ => "pg_terminate_backend",
                    };
                    let sql = format!("SELECT {function}($1)");
                    let done: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                        .bind(pid)
                        .fetch_one(&mut conn)
                        .await
                        .expect("the backend signalled");
                    assert!(done, "{function} found the backend");
                }
            }
        }
        // The primary, restarted or not, now shows the deletes, which the standby lacks.
        let logged = "SELECT count(*) FROM plantstore_deletions WHERE plant_id IN (2, 4)";
        let url = self.test_db_url_on(&self.primary);
        count_reaches(&url, logged, 2, "the frozen deletes visible on the primary").await;
        let mut got = [None, None];
        for (answer, slot) in answers.into_iter().zip(&mut got) {
            *slot = tokio::time::timeout(WITHIN, answer)
                .await
                .ok()
                .and_then(Result::ok)
                .flatten();
        }
        got
    }

    /// The keyed delete sent again, as a client told `503` would: its replay is no more
    /// vouched for than the first try was, while the standby lacks the entry.
    #[cfg(not(feature = "negative-control"))]
    async fn retry_the_keyed_delete(&self) -> StatusCode {
        self.app.delete_keyed(4, FROZEN_KEY).await.status()
    }

    /// Waits until `count` of the service's sessions wait to commit the barrier after a
    /// read: the deliveries have seen the exposed entry, and hold its events back.
    #[cfg(not(feature = "negative-control"))]
    async fn wait_for_barriers(&self, count: i64) {
        let admin = self.primary.admin_url();
        let at_barrier = "SELECT count(*) FROM pg_stat_activity
                          WHERE application_name = 'plantstore' AND state = 'active'
                            AND query LIKE '%pg_logical_emit_message%'";
        count_reaches(
            &admin,
            at_barrier,
            count,
            "both deliveries waiting at the barrier",
        )
        .await;
    }

    /// The negative control: both destinations get the frozen delete's event.
    #[cfg(feature = "negative-control")]
    async fn wait_for_frozen_events(&self) {
        self.wait_for_plant_events(2, "the phantom's events without the barrier")
            .await;
    }

    /// Kills the primary, promotes the standby, and deletes plant 3 until the service, on
    /// its own, answers 204 from the promoted server.
    async fn fail_over_and_delete_again(&mut self) {
        self.primary.stop_immediately();
        self.standby.promote();
        eventually(
            WITHIN,
            "a delete answered 204 on the promoted server",
            || async {
                (self.app.delete_id(3).await.status() == StatusCode::NO_CONTENT).then_some(())
            },
        )
        .await;
    }

    /// What the destinations got, and which of it names an entry the promoted server lacks.
    async fn events(&self) -> Events {
        let mut conn = PgConnection::connect(&self.test_db_url_on(&self.standby))
            .await
            .expect("the promoted server");
        let entries: HashSet<(i64, i64)> =
            sqlx::query_as("SELECT id, plant_id FROM plantstore_deletions")
                .fetch_all(&mut conn)
                .await
                .expect("the promoted server's log")
                .into_iter()
                .collect();
        let received = self.received().await;
        let phantoms = received
            .iter()
            .filter(|(_, entry, plant)| !entries.contains(&(*entry, *plant)))
            .copied()
            .collect();
        Events { received, phantoms }
    }

    /// Waits until both destinations have an event for `plant`.
    async fn wait_for_plant_events(&self, plant: i64, what: &str) {
        eventually(WITHIN, what, || async {
            let received = self.received().await;
            let got = |kind| received.iter().any(|(to, _, p)| *to == kind && *p == plant);
            (got("webhook") && got("stream")).then_some(())
        })
        .await;
    }

    /// (destination, deletion id, plant id) of every event the destinations got.
    async fn received(&self) -> Vec<(&'static str, i64, i64)> {
        let ids = |data: &serde_json::Value| {
            Some((data["deletion_id"].as_i64()?, data["plant_id"].as_i64()?))
        };
        let mut events: Vec<_> = self
            .receiver
            .accepted()
            .iter()
            .filter_map(|request| ids(&request.json["data"]))
            .map(|(entry, plant)| ("webhook", entry, plant))
            .collect();
        let stream = read_stream(&self.nats.jetstream().await, STREAM).await;
        events.extend(
            stream
                .iter()
                .filter_map(|message| ids(&message.body["data"]))
                .map(|(entry, plant)| ("stream", entry, plant)),
        );
        events
    }

    /// The test database's URL on one server of the pair.
    fn test_db_url_on(&self, server: &PgServer) -> String {
        self.app.db.url_via(&format!("127.0.0.1:{}", server.port()))
    }
}

/// Waits until `sql`, a count, reaches `wanted` on the server and database of `url`.
async fn count_reaches(url: &str, sql: &'static str, wanted: i64, what: &str) {
    eventually(WITHIN, what, || async {
        let mut conn = PgConnection::connect(url).await.ok()?;
        let count: i64 = sqlx::query_scalar(sql).fetch_one(&mut conn).await.ok()?;
        (count >= wanted).then_some(())
    })
    .await;
}
