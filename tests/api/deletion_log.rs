//! The deletion log: each delete keeps a snapshot of the row, and `plantstore deletions`
//! lists, restores and prunes, run as a user runs it.

use std::process::{Command, Output};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    helpers::{
        Backend, DbPool, TestApp, TestDb, assert_request_id, plantstore_on, refused, spawn_app,
        spawn_app_on, succeeded,
    },
    on_both_backends, on_either_pool,
};

on_both_backends!(
    a_plant_deleted_restored_and_deleted_again_through_http,
    an_owner_table_with_typed_columns_is_restored_exactly,
    each_refusal_is_one_clear_line_and_changes_nothing,
    the_list_filters_and_prune_ends_replays,
    an_install_from_before_snapshots_is_upgraded_in_place,
    a_restore_without_by_names_the_user_running_it,
);

/// `plantstore deletions …` on the app's database, in a clean environment.
fn deletions(app: &TestApp, args: &[&str]) -> Output {
    let mut all = vec!["deletions"];
    all.extend_from_slice(args);
    plantstore_on(&app.db.url, &all)
}

fn list(app: &TestApp, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["list", "--json"];
    all.extend_from_slice(args);
    let out = succeeded(&deletions(app, &all));
    match serde_json::from_str(&out) {
        Ok(Value::Array(entries)) => entries,
        other => panic!("not a JSON array: {other:?}\n{out}"),
    }
}

fn entry_id(entry: &Value) -> String {
    entry["id"].as_i64().expect("an id").to_string()
}

async fn a_plant_deleted_restored_and_deleted_again_through_http(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[1, 2]).await;
    let deleted = app.delete_keyed(1, "first").await;
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    let request_id = assert_request_id(&deleted);

    let entries = list(&app, &[]);
    assert_eq!(entries.len(), 1);
    let entry = &entries[0];
    assert_eq!(entry["plant_id"], 1);
    assert_eq!(entry["caller"], "initial");
    assert_eq!(entry["request_id"], request_id.as_str());
    assert_eq!(entry["idempotency_key"], "first");
    assert_eq!(
        entry["snapshot"],
        json!({"id": 1, "name": "fern", "tag": null})
    );
    assert_eq!(entry["restored_at"], Value::Null);

    let id = entry_id(entry);
    let out = succeeded(&deletions(&app, &["restore", &id, "--by", "ops"]));
    assert_eq!(
        out.trim(),
        format!("restored plant 1 from deletion {id}, by 'ops'")
    );
    assert!(app.db.plant_exists(1).await);
    let entry = &list(&app, &["--plant", "1"])[0];
    assert_eq!(entry["restored_by"], "ops");
    assert!(entry["restored_at"].is_string());

    // Back in the table, the plant is deleted like any other.
    assert_eq!(app.delete_id(1).await.status(), StatusCode::NO_CONTENT);
    assert!(!app.db.plant_exists(1).await);
    assert_eq!(app.db.deletions(1).await.len(), 2);

    let line = refused(&deletions(&app, &["restore", &id, "--by", "ops"]));
    assert!(
        line.contains(&format!(
            "cannot restore deletion {id}: it was already restored at"
        )),
        "{line}"
    );
    assert!(line.contains("by 'ops'"), "{line}");
    assert!(
        !app.db.plant_exists(1).await,
        "the refusal put nothing back"
    );
}

/// The owner's plants table, every kind of column it might have, and one row of it as
/// text that shows each value's exact type and bytes.
fn typed_table(backend: Backend) -> (&'static str, &'static str) {
    match backend {
        Backend::Sqlite => (
            "CREATE TABLE plants (
                 id INTEGER PRIMARY KEY, name TEXT NOT NULL, price NUMERIC, weight REAL,
                 exact REAL, in_stock BOOLEAN, planted_at TIMESTAMP, notes TEXT, photo BLOB,
                 added TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP, loose);
             INSERT INTO plants (id, name, price, weight, exact, in_stock, planted_at, notes, photo, loose)
             VALUES (7, 'fern \"quoted\" ''and'' {json}', 12.50, 0.1, 0.30000000000000004, 1,
                     '2026-11-22 10:30:00.123456', NULL, x'00ff10', '42');",
            "SELECT group_concat(typeof(v) || ':' || quote(v), ' | ') FROM (
                 SELECT id AS v FROM plants WHERE id = $1 UNION ALL SELECT name FROM plants WHERE id = $1
                 UNION ALL SELECT price FROM plants WHERE id = $1 UNION ALL SELECT weight FROM plants WHERE id = $1
                 UNION ALL SELECT exact FROM plants WHERE id = $1 UNION ALL SELECT in_stock FROM plants WHERE id = $1
                 UNION ALL SELECT planted_at FROM plants WHERE id = $1 UNION ALL SELECT notes FROM plants WHERE id = $1
                 UNION ALL SELECT photo FROM plants WHERE id = $1 UNION ALL SELECT added FROM plants WHERE id = $1
                 UNION ALL SELECT loose FROM plants WHERE id = $1)",
        ),
        Backend::Postgres => (
            "CREATE TABLE plants (
                 id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name TEXT NOT NULL,
                 price NUMERIC(10, 2), weight DOUBLE PRECISION, exact DOUBLE PRECISION,
                 in_stock BOOLEAN, planted_at TIMESTAMPTZ, planted_on DATE, notes TEXT,
                 photo BYTEA, tags TEXT[], extra JSONB, added TIMESTAMPTZ NOT NULL DEFAULT now());
             INSERT INTO plants (id, name, price, weight, exact, in_stock, planted_at, planted_on,
                                 notes, photo, tags, extra)
             OVERRIDING SYSTEM VALUE
             VALUES (7, 'fern \"quoted\" ''and'' {json}', 12.50, 0.1, 0.30000000000000004, true,
                     '2026-11-22 10:30:00.123456+00', '2026-11-22', NULL, '\\x00ff10',
                     ARRAY['a', NULL, 'c'], '{\"height\": 1.50}');",
            "SELECT p::TEXT FROM plants p WHERE id = $1",
        ),
    }
}

async fn row_text(db: &TestDb, sql: &'static str, id: i64) -> Option<String> {
    on_either_pool!(&db.pool, |pool| sqlx::query_scalar(sql)
        .bind(id)
        .fetch_optional(pool)
        .await)
    .expect("read the row")
    .flatten()
}

async fn an_owner_table_with_typed_columns_is_restored_exactly(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (schema, row) = typed_table(backend);
    db.execute(schema).await;
    let app = spawn_app_on(db, |_| {}).await;
    let before = row_text(&app.db, row, 7).await.expect("the row");

    assert_eq!(app.delete_id(7).await.status(), StatusCode::NO_CONTENT);
    assert_eq!(row_text(&app.db, row, 7).await, None);
    let id = entry_id(&list(&app, &[])[0]);
    succeeded(&deletions(&app, &["restore", &id, "--by", "ops"]));

    let after = row_text(&app.db, row, 7).await.expect("the row is back");
    assert_eq!(after, before);
}

async fn each_refusal_is_one_clear_line_and_changes_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.execute(
        "CREATE TABLE categories (id BIGINT PRIMARY KEY);
         CREATE TABLE plants (id BIGINT PRIMARY KEY, name TEXT NOT NULL,
                              category_id BIGINT REFERENCES categories (id));
         INSERT INTO categories (id) VALUES (1);
         INSERT INTO plants (id, name, category_id) VALUES (2, 'ivy', NULL), (3, 'moss', 1), (4, 'oak', NULL);",
    )
    .await;
    let app = spawn_app_on(db, |_| {}).await;
    for id in [2, 3, 4] {
        assert_eq!(app.delete_id(id).await.status(), StatusCode::NO_CONTENT);
    }
    let entry_of = |plant: i64| {
        let entries = list(&app, &["--plant", &plant.to_string()]);
        entry_id(&entries[0])
    };
    let (of_2, of_3, of_4) = (entry_of(2), entry_of(3), entry_of(4));
    let restore = |id: &str| refused(&deletions(&app, &["restore", id, "--by", "ops"]));

    assert_eq!(
        restore("999"),
        "plantstore: cannot restore deletion 999: no deletion log entry has id 999"
    );

    app.db
        .execute("INSERT INTO plants (id, name) VALUES (2, 'another ivy')")
        .await;
    assert_eq!(
        restore(&of_2),
        format!(
            "plantstore: cannot restore deletion {of_2}: a plant with id 2 exists again; delete or renumber it first"
        )
    );

    app.db.execute("DELETE FROM categories WHERE id = 1").await;
    assert_eq!(
        restore(&of_3),
        format!(
            "plantstore: cannot restore deletion {of_3}: a row the plant referred to (a foreign key) no longer exists"
        )
    );
    assert!(!app.db.plant_exists(3).await);

    app.db
        .execute("ALTER TABLE plants ADD COLUMN height INTEGER")
        .await;
    assert_eq!(
        restore(&of_4),
        format!(
            "plantstore: cannot restore deletion {of_4}: the plants table changed since the delete (no value for height)"
        )
    );
    assert!(!app.db.plant_exists(4).await);

    // An entry written before snapshots were kept (as after the migration that added them).
    app.db
        .execute(
            "INSERT INTO plantstore_deletions (plant_id, token_name, request_id, deleted_at)
             VALUES (50, 'old', 'r-old', CURRENT_TIMESTAMP)",
        )
        .await;
    let old = entry_of(50);
    assert_eq!(
        restore(&old),
        format!(
            "plantstore: cannot restore deletion {old}: it was logged before the deletion log kept snapshots, so there is nothing to put back"
        )
    );
    let table = succeeded(&deletions(&app, &["list", "--plant", "50"]));
    assert!(table.contains("(no snapshot)"), "{table}");

    for entry in list(&app, &[]) {
        assert_eq!(entry["restored_at"], Value::Null, "{entry}");
    }
}

async fn the_list_filters_and_prune_ends_replays(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[1, 2, 3]).await;
    let other = app.new_token("other").await;
    for (id, key) in [(1, "one"), (2, "two")] {
        assert_eq!(
            app.delete_keyed(id, key).await.status(),
            StatusCode::NO_CONTENT
        );
    }
    assert_eq!(
        app.delete_keyed_with(3, "three", &other).await.status(),
        StatusCode::NO_CONTENT
    );

    let plants = |entries: Vec<Value>| -> Vec<i64> {
        entries
            .iter()
            .filter_map(|e| e["plant_id"].as_i64())
            .collect()
    };
    assert_eq!(plants(list(&app, &[])), vec![3, 2, 1], "newest first");
    assert_eq!(plants(list(&app, &["--plant", "2"])), vec![2]);
    assert_eq!(plants(list(&app, &["--caller", "initial"])), vec![2, 1]);
    assert_eq!(plants(list(&app, &["--caller", "other"])), vec![3]);
    assert_eq!(plants(list(&app, &["--since", "1h"])), vec![3, 2, 1]);
    assert_eq!(plants(list(&app, &["--limit", "1"])), vec![3]);
    let table = succeeded(&deletions(&app, &["list", "--caller", "initial"]));
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two entries: {table}");
    assert!(lines[0].starts_with("ID") && lines[0].contains("IDEMPOTENCY KEY"));
    assert!(
        lines[1].contains(" two ") && lines[2].contains(" one "),
        "{table}"
    );

    let out = succeeded(&deletions(&app, &["prune", "--older-than", "1h"]));
    assert_eq!(out.trim(), "pruned 0 deletion log entries older than 1h");
    assert_eq!(
        app.delete_keyed(1, "one").await.headers()["idempotent-replayed"],
        "true"
    );
    let out = succeeded(&deletions(&app, &["prune", "--older-than", "0s"]));
    assert_eq!(out.trim(), "pruned 3 deletion log entries older than 0s");
    assert!(list(&app, &[]).is_empty());
    let gone = app.delete_keyed(1, "one").await;
    assert_eq!(
        gone.status(),
        StatusCode::NOT_FOUND,
        "a pruned key stops replaying"
    );
}

/// The row's physical place (PostgreSQL) or rowid (SQLite), and its columns as text: what
/// a rewrite of the table would change.
async fn old_entry(db: &TestDb) -> String {
    let sql = match db.pool {
        DbPool::Sqlite(_) => {
            "SELECT rowid || '|' || plant_id || '|' || token_name || '|' || request_id || '|' || deleted_at
             FROM plantstore_deletions WHERE plant_id = $1"
        }
        DbPool::Postgres(_) => {
            "SELECT ctid::TEXT || '|' || plant_id || '|' || token_name || '|' || request_id || '|' || deleted_at
             FROM plantstore_deletions WHERE plant_id = $1"
        }
    };
    row_text(db, sql, 9).await.expect("the old entry")
}

async fn an_install_from_before_snapshots_is_upgraded_in_place(backend: Backend) {
    let db = TestDb::new(backend).await;
    // The schema as the release before the deletion log left it: migrations 1 and 2.
    let folder = match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    };
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(folder);
    let mut migrator = sqlx::migrate::Migrator::new(path)
        .await
        .expect("the migrations");
    migrator.dangerous_set_table_name("plantstore_migrations");
    on_either_pool!(&db.pool, |pool| migrator.run_to(2, pool).await).expect("migrate to version 2");
    db.execute(
        "INSERT INTO plants (id, name) VALUES (1, 'fern');
         INSERT INTO plantstore_deletions (plant_id, token_name, request_id, deleted_at)
         VALUES (9, 'old', 'r-old', CURRENT_TIMESTAMP);",
    )
    .await;
    let before = old_entry(&db).await;

    let app = spawn_app_on(db, |_| {}).await;

    assert_eq!(
        old_entry(&app.db).await,
        before,
        "the old row is not rewritten"
    );
    assert_eq!(app.delete_id(1).await.status(), StatusCode::NO_CONTENT);
    let entries = list(&app, &[]);
    assert_eq!(entries.len(), 2);
    assert_eq!(
        entries[0]["snapshot"],
        json!({"id": 1, "name": "fern", "tag": null})
    );
    assert_eq!(entries[1]["plant_id"], 9);
    assert_eq!(entries[1]["snapshot"], Value::Null);
    assert_eq!(entries[1]["idempotency_key"], Value::Null);
    let old = entry_id(&entries[1]);
    let line = refused(&deletions(&app, &["restore", &old, "--by", "ops"]));
    assert!(
        line.ends_with(
            "it was logged before the deletion log kept snapshots, so there is nothing to put back"
        ),
        "{line}"
    );
}

/// SQLite keeps an infinite REAL, which JSON cannot spell: it writes 9e999.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_infinite_real_on_sqlite_is_logged_and_restored() {
    let db = TestDb::new(Backend::Sqlite).await;
    db.execute(
        "CREATE TABLE plants (id INTEGER PRIMARY KEY, name TEXT, up REAL, down REAL);
         INSERT INTO plants VALUES (1, 'a', 9e999, -9e999);",
    )
    .await;
    let app = spawn_app_on(db, |_| {}).await;
    let row = "SELECT typeof(up) || ':' || quote(up) || ' ' || typeof(down) || ':' || quote(down) FROM plants WHERE id = $1";
    let before = row_text(&app.db, row, 1).await.expect("the row");

    assert_eq!(app.delete_id(1).await.status(), StatusCode::NO_CONTENT);
    let out = succeeded(&deletions(&app, &["list", "--json"]));
    assert!(
        out.contains(r#""snapshot":{"id":1,"name":"a","up":9e999,"down":-9e999}"#),
        "{out}"
    );
    // (serde_json, and so `list` here, refuses 9e999 too.)
    let id = app
        .db
        .scalar("SELECT id FROM plantstore_deletions WHERE plant_id = $1", 1)
        .await
        .to_string();
    succeeded(&deletions(&app, &["restore", &id, "--by", "ops"]));

    assert_eq!(row_text(&app.db, row, 1).await, Some(before));
}

/// `docker compose exec plantstore plantstore deletions restore 5` has no `$USER`: the
/// restorer is the user the command runs as, by its uid.
async fn a_restore_without_by_names_the_user_running_it(backend: Backend) {
    let app = spawn_app(backend).await;
    app.add_plants(&[1]).await;
    assert_eq!(app.delete_id(1).await.status(), StatusCode::NO_CONTENT);
    let id = entry_id(&list(&app, &[])[0]);
    let whoami = Command::new("id").arg("-un").output().expect("id -un");
    let user = String::from_utf8_lossy(&whoami.stdout).trim().to_owned();
    assert!(!user.is_empty());

    let out = succeeded(&deletions(&app, &["restore", &id]));

    assert_eq!(
        out.trim(),
        format!("restored plant 1 from deletion {id}, by '{user}'")
    );
    assert_eq!(list(&app, &[])[0]["restored_by"], user.as_str());
    assert!(app.db.plant_exists(1).await);
}
