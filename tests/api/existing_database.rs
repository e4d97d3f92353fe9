//! Pointing the service at a database the owner already has, with its own plants table.

use plantstore::startup::Application;
use reqwest::StatusCode;

use crate::{
    helpers::{Backend, TestDb, assert_error, spawn_app_on, test_config},
    on_both_backends,
};

on_both_backends!(
    an_existing_plants_table_is_kept_and_foreign_keys_give_409,
    with_migrate_off_an_existing_schema_is_used_as_it_is,
    with_migrate_off_a_database_without_plants_is_refused,
    a_referenced_plant_is_409_in_a_fresh_database_too,
    a_plants_id_that_is_not_an_integer_is_refused_at_start,
    a_plants_id_that_is_not_unique_is_refused_at_start,
    a_unique_index_on_plants_id_is_enough,
);

/// The one line a refused start ends with, with migrations on (they leave an existing
/// `plants` alone) and off.
async fn refusals(db: &TestDb) -> Vec<String> {
    let mut lines = Vec::new();
    for migrate in [true, false] {
        let mut config = test_config(&db.url);
        config.migrate = migrate;
        let err = Application::build(&config)
            .await
            .err()
            .expect("start is refused");
        lines.push(plantstore::telemetry::one_line(err.as_ref()));
    }
    lines
}

async fn a_plants_id_that_is_not_an_integer_is_refused_at_start(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.execute("CREATE TABLE plants (id TEXT PRIMARY KEY, name TEXT)")
        .await;

    for line in refusals(&db).await {
        assert!(
            line.to_lowercase().contains("plants.id is of type text"),
            "{line}"
        );
        assert!(line.contains("integer column"), "{line}");
        assert!(!line.contains('\n'));
    }
}

async fn a_plants_id_that_is_not_unique_is_refused_at_start(backend: Backend) {
    let db = TestDb::new(backend).await;
    // A unique index with a condition does not make every id name one row.
    db.execute(
        "CREATE TABLE plants (id BIGINT NOT NULL, name TEXT);
         CREATE UNIQUE INDEX plants_named_id ON plants (id) WHERE name IS NOT NULL;",
    )
    .await;

    for line in refusals(&db).await {
        assert!(line.contains("plants.id"), "{line}");
        assert!(line.contains("is not unique"), "{line}");
        assert!(line.contains("unique index on plants (id)"), "{line}");
    }
}

async fn a_unique_index_on_plants_id_is_enough(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.execute(
        "CREATE TABLE plants (id BIGINT NOT NULL, name TEXT);
         CREATE UNIQUE INDEX plants_id ON plants (id);
         INSERT INTO plants (id, name) VALUES (1, 'fern');",
    )
    .await;
    let app = spawn_app_on(db, |_| {}).await;

    assert_eq!(app.delete("1").await.status(), StatusCode::NO_CONTENT);
    assert!(!app.db.plant_exists(1).await);
}

/// The owner's schema: more columns than the service knows, and an orders table that
/// references plants.
const OWNER_SCHEMA: &str = "
    CREATE TABLE plants (id BIGINT PRIMARY KEY, name TEXT NOT NULL, species TEXT NOT NULL, price NUMERIC);
    CREATE TABLE orders (id BIGINT PRIMARY KEY, plant_id BIGINT NOT NULL REFERENCES plants (id));
    INSERT INTO plants (id, name, species, price) VALUES (1, 'fern', 'Nephrolepis', 9.5), (2, 'ivy', 'Hedera', 4);
    INSERT INTO orders (id, plant_id) VALUES (10, 1);
";

async fn an_existing_plants_table_is_kept_and_foreign_keys_give_409(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.execute(OWNER_SCHEMA).await;
    let app = spawn_app_on(db, |_| {}).await;

    let body = assert_error(app.delete("1").await, StatusCode::CONFLICT).await;
    assert_eq!(app.delete("2").await.status(), StatusCode::NO_CONTENT);

    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("Plant 1"))
    );
    assert!(app.db.plant_exists(1).await, "a referenced plant stays");
    assert_eq!(
        app.db
            .scalar("SELECT COUNT(*) FROM orders WHERE plant_id = $1", 1)
            .await,
        1
    );
    assert!(
        app.db.deletions(1).await.is_empty(),
        "no audit row for a refused delete"
    );
    assert_eq!(
        app.db
            .scalar(
                "SELECT COUNT(*) FROM plants WHERE species IS NOT NULL AND id <> $1",
                2
            )
            .await,
        1,
        "the owner's columns are untouched"
    );
}

async fn with_migrate_off_an_existing_schema_is_used_as_it_is(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.execute(OWNER_SCHEMA).await;
    // The service's own tables come from one `plantstore migrate`, as
    // docs/existing-database.md says.
    plantstore::database::open(&test_config(&db.url), None)
        .await
        .expect("migrate")
        .close()
        .await;

    let app = spawn_app_on(db, |config| config.migrate = false).await;

    assert_eq!(app.delete("2").await.status(), StatusCode::NO_CONTENT);
    assert_error(app.delete("1").await, StatusCode::CONFLICT).await;
}

async fn with_migrate_off_a_database_without_plants_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let mut config = test_config(&db.url);
    config.migrate = false;

    let err = Application::build(&config)
        .await
        .err()
        .expect("start is refused");

    let line = plantstore::telemetry::one_line(err.as_ref());
    assert!(line.contains("plants.id"), "{line}");
    assert!(!line.contains('\n'));
}

async fn a_referenced_plant_is_409_in_a_fresh_database_too(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = spawn_app_on(db, |_| {}).await;
    app.add_plants(&[5]).await;
    app.db
        .execute("CREATE TABLE reviews (id BIGINT PRIMARY KEY, plant_id BIGINT REFERENCES plants (id)); INSERT INTO reviews VALUES (1, 5);")
        .await;

    assert_error(app.delete("5").await, StatusCode::CONFLICT).await;

    assert!(app.db.plant_exists(5).await);
}

/// SQLite: WAL is a property of the file, so it is visible from outside the service.
#[tokio::test]
async fn a_sqlite_database_is_put_in_wal_mode() {
    let app = spawn_app_on(TestDb::new(Backend::Sqlite).await, |_| {}).await;
    let crate::helpers::DbPool::Sqlite(pool) = &app.db.pool else {
        unreachable!("a SQLite test")
    };

    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(pool)
        .await
        .expect("pragma");

    assert_eq!(mode, "wal");
}

/// PostgreSQL with `sslmode=require`: every connection the service opens is TLS (rustls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sslmode_require_connects_over_tls() {
    let db = TestDb::new(Backend::Postgres).await;
    let url = format!("{}?sslmode=require", db.url);
    let app = spawn_app_on(db, |config| {
        config.database_url = url.into();
    })
    .await;
    app.add_plants(&[1]).await;

    assert_eq!(app.delete("1").await.status(), StatusCode::NO_CONTENT);

    let crate::helpers::DbPool::Postgres(pool) = &app.db.pool else {
        unreachable!("a PostgreSQL test")
    };
    let (connections, encrypted): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COUNT(*) FILTER (WHERE s.ssl)
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
         WHERE a.datname = current_database() AND a.application_name = 'plantstore'",
    )
    .fetch_one(pool)
    .await
    .expect("connection stats");
    assert!(connections > 0, "the service holds connections");
    assert_eq!(encrypted, connections, "all of them over TLS");
}
