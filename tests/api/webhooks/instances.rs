//! Several instances and other processes: each event delivered once across instances, a
//! graceful stop that leaves nothing to repeat, and commits made elsewhere heard.

use super::*;
use crate::on_both_backends;

on_both_backends!(
    two_instances_deliver_each_event_once,
    a_graceful_stop_leaves_the_next_instance_nothing_to_repeat,
);

async fn two_instances_deliver_each_event_once(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(204)).await;
    let first = spawn(backend).await;
    let mut config = test_config(&first.db.url);
    quick_retries(&mut config);
    let other_address = serve_another(&config).await;
    add_endpoint(&first, &receiver, &[]);
    let plants: Vec<i64> = (1..=60).collect();
    first.add_plants(&plants).await;
    first.add_plants(&[61]).await;
    // One instance holds the lease once an event arrives; the other has tried for it.
    delete_all(&first, [61]).await;
    receiver
        .wait_for(WITHIN, "the first event", |got| !got.is_empty())
        .await;

    let answers = futures::future::join_all(plants.iter().map(|id| {
        let address = if id % 2 == 0 {
            &first.address
        } else {
            &other_address
        };
        first
            .delete_request_at(address, &id.to_string())
            .bearer_auth(&first.token)
            .send()
    }))
    .await;
    for answer in answers {
        assert_eq!(answer.expect("an answer").status(), StatusCode::NO_CONTENT);
    }
    let expected = logged_ids(&first).await;
    wait_until_accepted(&receiver, &expected).await;
    nothing_happens_within(Duration::from_millis(1500)).await;
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
        .delete_request_at(&next_address, "41")
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
    nothing_happens_within(Duration::from_millis(500)).await;
    let ids: Vec<String> = receiver.received().into_iter().map(|r| r.id).collect();
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!((ids.len(), distinct.len()), (41, 41), "repeats: {ids:?}");
}

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

async fn rings(heard: &mut CommitNewsReceiver, what: &str) {
    if tokio::time::timeout(WITHIN, heard.changed()).await.is_err() {
        panic!("nothing heard within {WITHIN:?} of {what}");
    }
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
    let mut elsewhere = sqlx::PgConnection::connect(&crate::fixtures::pg_server::admin_url().await)
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
