//! Test harness: a fresh database per test, the real app served on a free port, and the
//! checks every error response must pass.

use std::{
    future::{self, Future},
    time::Duration,
};

pub use plantstore::config::AdminListen;
use plantstore::{config::Config, startup::Application};
use reqwest::{Response, StatusCode, header};
use serde_json::Value;
use sqlx::{Connection, Executor, PgConnection, PgPool, SqlitePool};
use tokio::task::JoinHandle;

use crate::fixtures::pg_server;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Runs each named `async fn name(backend: Backend)` once per backend, as the tests
/// `name::sqlite` and `name::postgres`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name($crate::helpers::Backend::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name($crate::helpers::Backend::Postgres).await
            }
        }
    )*};
}

/// Polls `check` every 50 ms until it gives a value, and returns it; fails the test
/// naming `what` when `within` passes first. Tests wait for the state they expect this way.
pub async fn eventually<T, F: Future<Output = Option<T>>>(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The one fixed wait a test may make: the window in which it shows that something does
/// not happen (no repeat arrives, nothing goes to a disabled endpoint, a held request stays
/// unanswered), named as such.
pub async fn nothing_happens_within(window: Duration) {
    tokio::time::sleep(window).await;
}

/// How long a fault the test causes lasts (a server down or read-only, connections
/// refused, a load running around it): its length, which the service must ride out, not a
/// wait for a state.
pub async fn fault_lasts(length: Duration) {
    tokio::time::sleep(length).await;
}

/// `$body` with `$pool` bound to the test database's pool, whichever backend holds it: the
/// one place the two pool types are told apart for a query both backends run.
#[macro_export]
macro_rules! on_either_pool {
    ($db_pool:expr, |$pool:ident| $body:expr) => {
        match $db_pool {
            $crate::helpers::DbPool::Sqlite($pool) => $body,
            $crate::helpers::DbPool::Postgres($pool) => $body,
        }
    };
}

/// A database made for one test, and a pool of the test's own to set it up and inspect it.
pub struct TestDb {
    pub url: String,
    pub pool: DbPool,
    /// Keeps the SQLite file's folder alive as long as the test.
    _dir: Option<tempfile::TempDir>,
    /// The PostgreSQL database to drop when the test ends.
    postgres_name: Option<String>,
    /// PostgreSQL: the admin URL of the server holding the test's database.
    admin_url: String,
}

pub enum DbPool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

impl TestDb {
    pub async fn new(backend: Backend) -> Self {
        match backend {
            Backend::Sqlite => Self::sqlite_in(tempfile::tempdir().expect("temp dir")).await,
            Backend::Postgres => Self::postgres_on(pg_server::admin_url().await).await,
        }
    }

    /// A fresh database on the PostgreSQL server behind `admin`.
    pub async fn postgres_on(admin: String) -> Self {
        let mut conn = PgConnection::connect(&admin)
            .await
            .unwrap_or_else(|err| panic!("the PostgreSQL tests' server at {admin}: {err}"));
        let name = format!("plantstore_test_{}", uuid::Uuid::new_v4().simple());
        conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .expect("create the test database");
        let url = with_database(&admin, &name);
        let pool = PgPool::connect(&url)
            .await
            .expect("connect to the test database");
        Self {
            url,
            pool: DbPool::Postgres(pool),
            _dir: None,
            postgres_name: Some(name),
            admin_url: admin,
        }
    }

    /// A fresh SQLite file in `dir`, which lives as long as the test database.
    pub async fn sqlite_in(dir: tempfile::TempDir) -> Self {
        let url = format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("plantstore.db").display()
        );
        let pool = SqlitePool::connect(&url)
            .await
            .expect("open the test SQLite file");
        Self {
            url,
            pool: DbPool::Sqlite(pool),
            _dir: Some(dir),
            postgres_name: None,
            admin_url: String::new(),
        }
    }

    /// The PostgreSQL database made for this test.
    pub fn postgres_name(&self) -> &str {
        self.postgres_name.as_deref().expect("a PostgreSQL test")
    }

    /// Runs SQL as the server's admin, outside this test's database (for `ALTER DATABASE`
    /// and for ending the service's sessions).
    pub async fn admin(&self, sql: String) {
        let mut conn = PgConnection::connect(&self.admin_url)
            .await
            .expect("an admin connection");
        conn.execute(sqlx::AssertSqlSafe(sql.clone()))
            .await
            .unwrap_or_else(|err| panic!("admin SQL failed: {err}\n{sql}"));
    }

    /// Ends every session the service holds on this test's database.
    pub async fn terminate_service_sessions(&self) {
        self.admin(format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = '{}' AND application_name = 'plantstore'",
            self.postgres_name()
        ))
        .await;
    }

    /// Runs setup SQL (one or more statements).
    pub async fn execute(&self, sql: &'static str) {
        on_either_pool!(&self.pool, |pool| sqlx::raw_sql(sql)
            .execute(pool)
            .await
            .map(drop))
        .unwrap_or_else(|err| panic!("setup SQL failed: {err}\n{sql}"));
    }

    /// A count-like query with one `$1` argument.
    pub async fn scalar(&self, sql: &'static str, arg: i64) -> i64 {
        on_either_pool!(&self.pool, |pool| sqlx::query_scalar(sql)
            .bind(arg)
            .fetch_one(pool)
            .await)
        .unwrap_or_else(|err| panic!("query failed: {err}\n{sql}"))
    }

    pub async fn plant_exists(&self, id: i64) -> bool {
        self.scalar("SELECT COUNT(*) FROM plants WHERE id = $1", id)
            .await
            == 1
    }

    /// (token name, request id) of each audit row for a plant.
    pub async fn deletions(&self, plant_id: i64) -> Vec<(String, String)> {
        let sql = "SELECT token_name, request_id FROM plantstore_deletions WHERE plant_id = $1";
        on_either_pool!(&self.pool, |pool| sqlx::query_as(sql)
            .bind(plant_id)
            .fetch_all(pool)
            .await)
        .expect("read the audit table")
    }

    /// (plant id, caller, idempotency key) of every audit row, oldest first.
    pub async fn audit_log(&self) -> Vec<(i64, String, Option<String>)> {
        let sql =
            "SELECT plant_id, token_name, idempotency_key FROM plantstore_deletions ORDER BY id";
        on_either_pool!(&self.pool, |pool| sqlx::query_as(sql).fetch_all(pool).await)
            .expect("read the audit table")
    }

    /// The id of every deletion log entry, lowest first.
    pub async fn deletion_ids(&self) -> Vec<i64> {
        let sql = "SELECT id FROM plantstore_deletions ORDER BY id";
        on_either_pool!(&self.pool, |pool| sqlx::query_scalar(sql)
            .fetch_all(pool)
            .await)
        .expect("read the deletion log")
    }

    /// The same database reached through another host and port (a proxy).
    pub fn url_via(&self, host_port: &str) -> String {
        let (scheme_user, rest) = self
            .url
            .split_once('@')
            .expect("a PostgreSQL URL with a user");
        let (_, path) = rest
            .split_once('/')
            .expect("a PostgreSQL URL with a database");
        format!("{scheme_user}@{host_port}/{path}")
    }
}

impl Drop for TestDb {
    /// Drops the test's PostgreSQL database (the app may still hold connections, hence
    /// FORCE). Runs on its own thread and runtime because `Drop` cannot await.
    fn drop(&mut self) {
        let Some(name) = self.postgres_name.take() else {
            return;
        };
        let admin = std::mem::take(&mut self.admin_url);
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let mut conn = PgConnection::connect(&admin).await.ok()?;
                let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                conn.execute(sqlx::AssertSqlSafe(sql)).await.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(_))) {
            eprintln!(
                "could not drop a test database; on a server you named, `.ci/run` drops leftovers"
            );
        }
    }
}

/// The admin URL with its database swapped for `name`, keeping any query string.
fn with_database(admin: &str, name: &str) -> String {
    let (base, query) = admin
        .split_once('?')
        .map_or((admin, None), |(b, q)| (b, Some(q)));
    let (server, _) = base
        .rsplit_once('/')
        .expect("a PostgreSQL URL ending in /DATABASE");
    match query {
        Some(query) => format!("{server}/{name}?{query}"),
        None => format!("{server}/{name}"),
    }
}

/// Settings as a user would have them, but on a free port and with short waits.
pub fn test_config(database_url: &str) -> Config {
    let mut config = Config::defaults();
    config.database_url = database_url.to_owned().into();
    // A short wait for a connection, and few of them: many tests run at once.
    config.db_acquire_timeout = Duration::from_millis(1500);
    config.db_max_connections = 5;
    config.serve.listen = "127.0.0.1:0".parse().expect("address");
    config.serve.shutdown_grace = Duration::from_secs(1);
    config.serve.request_timeout = Duration::from_secs(10);
    config
}

/// The real app, served on a free port in this test's runtime.
pub struct TestApp {
    pub address: String,
    /// `http://` and the admin listener's address, when the settings name one.
    pub admin_address: Option<String>,
    pub client: reqwest::Client,
    /// The `initial` token the first start printed.
    pub token: String,
    pub db: TestDb,
}

pub async fn spawn_app(backend: Backend) -> TestApp {
    spawn_app_on(TestDb::new(backend).await, |_| {}).await
}

/// Serves the app on `db` with settings changed by `tweak`.
pub async fn spawn_app_on(db: TestDb, tweak: impl FnOnce(&mut Config)) -> TestApp {
    spawn_app_until(db, tweak, future::pending()).await.0
}

/// Serves the app on `db` until `stop` resolves, then stops it as SIGTERM would; the
/// handle ends with what `run_until_stopped` returned.
pub async fn spawn_app_until(
    db: TestDb,
    tweak: impl FnOnce(&mut Config),
    stop: impl Future<Output = ()> + Send + 'static,
) -> (TestApp, JoinHandle<std::io::Result<()>>) {
    let mut config = test_config(&db.url);
    tweak(&mut config);
    let app = Application::build(&config).await.expect("the app starts");
    let token = app
        .initial_token()
        .expect("a fresh database gets an initial token")
        .to_owned();
    let address = format!("http://{}", app.address());
    let admin_address = app.admin_address().map(|admin| format!("http://{admin}"));
    let serving = tokio::spawn(app.run_until_stopped(stop));
    let app = TestApp {
        address,
        admin_address,
        client: http_client(),
        token,
        db,
    };
    (app, serving)
}

/// Serves one more instance with `config` (another on the same database); its address.
pub async fn serve_another(config: &Config) -> String {
    serve_another_until(config, future::pending()).await.0
}

/// Serves one more instance with `config` until `stop` resolves, then stops it as SIGTERM
/// would; its address, and the handle that ends with what `run_until_stopped` returned.
pub async fn serve_another_until(
    config: &Config,
    stop: impl Future<Output = ()> + Send + 'static,
) -> (String, JoinHandle<std::io::Result<()>>) {
    let other = Application::build(config)
        .await
        .expect("another instance starts");
    let address = format!("http://{}", other.address());
    (address, tokio::spawn(other.run_until_stopped(stop)))
}

/// A client that gives up rather than letting a test hang on a request that never ends.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client")
}

impl TestApp {
    /// Inserts plants straight into the table, as the owner's own software would.
    pub async fn add_plants(&self, ids: &[i64]) {
        for &id in ids {
            let sql = "INSERT INTO plants (id, name) VALUES ($1, 'fern')";
            on_either_pool!(&self.db.pool, |pool| sqlx::query(sql)
                .bind(id)
                .execute(pool)
                .await
                .map(drop))
            .expect("insert a plant");
        }
    }

    /// `DELETE /plants/{raw_id}` with the app's token.
    pub async fn delete(&self, raw_id: &str) -> Response {
        self.delete_with(raw_id, Some(&self.token)).await
    }

    /// `DELETE /plants/{id}` with the app's token.
    pub async fn delete_id(&self, id: i64) -> Response {
        self.delete(&id.to_string()).await
    }

    /// Waits until `count` deletes wait in the group commit's queue (`/metrics`), so a
    /// held commit's followers are all queued before it is let go.
    pub async fn wait_until_queued(&self, count: usize) {
        let (within, series) = (Duration::from_secs(10), "plantstore_delete_queue_waiting");
        crate::metrics::wait_for_series(self, within, series, |queued| queued >= count as f64)
            .await;
    }

    /// `DELETE /plants/{raw_id}`, to send with whatever headers a test needs.
    pub fn delete_request(&self, raw_id: &str) -> reqwest::RequestBuilder {
        self.delete_request_at(&self.address, raw_id)
    }

    /// `DELETE /plants/{raw_id}` on the instance at `address` (another one serving the
    /// same database), with this app's client.
    pub fn delete_request_at(&self, address: &str, raw_id: &str) -> reqwest::RequestBuilder {
        self.client.delete(format!("{address}/plants/{raw_id}"))
    }

    /// A new token named `name`, made as `plantstore token create` makes it.
    pub async fn new_token(&self, name: &str) -> String {
        let store = plantstore::database::open(&test_config(&self.db.url), None)
            .await
            .expect("the store opens");
        let token = plantstore::auth::tokens::create(store.as_ref(), name, None)
            .await
            .expect("a token");
        store.close().await;
        token
    }

    pub async fn delete_with(&self, raw_id: &str, token: Option<&str>) -> Response {
        let mut request = self.delete_request(raw_id);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send().await.expect("the server answers")
    }

    /// `DELETE /plants/{id}` with `token` and `Idempotency-Key: {key}` (sent as it is).
    pub async fn delete_keyed_with(&self, id: i64, key: &str, token: &str) -> Response {
        self.delete_request(&id.to_string())
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .send()
            .await
            .expect("the server answers")
    }

    /// `DELETE /plants/{id}` with the app's token and `Idempotency-Key: {key}`.
    pub async fn delete_keyed(&self, id: i64, key: &str) -> Response {
        self.delete_keyed_with(id, key, &self.token).await
    }

    pub async fn get(&self, path: &str) -> Response {
        self.client
            .get(format!("{}{path}", self.address))
            .send()
            .await
            .expect("the server answers")
    }
}

/// Checks what every error must look like and returns its body.
pub async fn assert_error(response: Response, status: StatusCode) -> Value {
    assert_eq!(response.status(), status);
    assert_eq!(
        response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().ok()),
        Some(Some("application/json")),
        "errors are application/json"
    );
    assert_request_id(&response);
    let body: Value = response.json().await.expect("a JSON body");
    let fields = body.as_object().expect("a JSON object");
    assert_eq!(fields.len(), 2, "exactly error and message: {body}");
    assert_eq!(body["error"], i64::from(status.as_u16()), "{body}");
    let message = body["message"].as_str().expect("message is a string");
    assert!(
        message.ends_with('.') && message.len() > 10,
        "a plain sentence: {message}"
    );
    body
}

pub fn assert_request_id(response: &Response) -> String {
    let id = response
        .headers()
        .get("x-request-id")
        .expect("every response has x-request-id");
    let id = id.to_str().expect("visible ASCII").to_owned();
    assert!(!id.is_empty());
    id
}

/// Another session that keeps the service's commits waiting, so the requests sent
/// meanwhile queue up and go out together in the next batch. SQLite: the write lock.
/// PostgreSQL: the audit table, which every delete writes to.
pub enum WriteHold {
    Sqlite(sqlx::pool::PoolConnection<sqlx::Sqlite>),
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
}

impl TestDb {
    pub async fn hold_writes(&self) -> WriteHold {
        match &self.pool {
            DbPool::Sqlite(pool) => {
                let mut conn = pool.acquire().await.expect("a connection");
                conn.execute("BEGIN IMMEDIATE")
                    .await
                    .expect("take the write lock");
                WriteHold::Sqlite(conn)
            }
            DbPool::Postgres(pool) => {
                let mut tx = pool.begin().await.expect("a transaction");
                tx.execute("LOCK TABLE plantstore_deletions IN EXCLUSIVE MODE")
                    .await
                    .expect("lock the audit table");
                WriteHold::Postgres(tx)
            }
        }
    }

    /// Waits until the service has a commit waiting on a hold. PostgreSQL shows it in
    /// `pg_stat_activity`; SQLite's busy wait shows nowhere, so that case only waits a
    /// moment for the request to reach the writer.
    pub async fn wait_for_blocked_commits(&self, count: i64) {
        let DbPool::Postgres(pool) = &self.pool else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            return;
        };
        let what = "the service's commits to wait on the hold";
        eventually(Duration::from_secs(5), what, || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'plantstore'
                   AND wait_event_type = 'Lock'",
            )
            .fetch_one(pool)
            .await
            .expect("activity");
            (waiting >= count).then_some(())
        })
        .await;
    }

    /// How many distinct commit times the audit rows of these plants have: 1 when they
    /// were deleted by one transaction (the time is stamped once per commit).
    pub async fn distinct_commit_times(&self, plant_ids: &[i64]) -> i64 {
        let list = plant_ids
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let sql = format!(
            "SELECT COUNT(DISTINCT deleted_at) FROM plantstore_deletions WHERE plant_id IN ({list})"
        );
        on_either_pool!(&self.pool, |pool| {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(pool)
                .await
        })
        .expect("read the audit table")
    }
}

impl TestDb {
    /// PostgreSQL: another session's transaction holding one plant's row (`FOR UPDATE`);
    /// rolling it back lets the row go.
    pub async fn hold_row(&self, id: i64) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let DbPool::Postgres(pool) = &self.pool else {
            panic!("row locks are a PostgreSQL test")
        };
        let mut holder = pool.begin().await.expect("a transaction");
        sqlx::query("SELECT id FROM plants WHERE id = $1 FOR UPDATE")
            .bind(id)
            .execute(&mut *holder)
            .await
            .expect("lock the row");
        holder
    }
}

impl WriteHold {
    pub async fn release(self) {
        match self {
            WriteHold::Sqlite(mut conn) => conn.execute("ROLLBACK").await.map(drop),
            WriteHold::Postgres(tx) => tx.rollback().await,
        }
        .expect("release the hold");
    }
}

/// `plantstore <args>` on `database_url`, in a clean environment, as a user runs it.
pub fn plantstore_on(database_url: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_plantstore"))
        .env_clear()
        .env("DATABASE_URL", database_url)
        .args(args)
        .output()
        .expect("run plantstore")
}

/// What a command that must succeed printed.
pub fn succeeded(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The one line a refused command ends with.
pub fn refused(output: &std::process::Output) -> String {
    assert!(!output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.lines().last().unwrap_or_default().to_owned();
    assert!(last.starts_with("plantstore: "), "{stderr}");
    last
}

/// `plantstore serve` as its own process, killed (SIGKILL) on `kill` or when the test ends,
/// however it ends.
pub struct ServeProcess(std::process::Child);

impl ServeProcess {
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `plantstore serve` as its own process on `port`, so that it can be killed with SIGKILL.
pub fn serve_process(db_url: &str, port: u16) -> ServeProcess {
    serve_process_with(db_url, port, &[], std::process::Stdio::inherit())
}

/// `serve_process` with more of the environment, and its log (stderr) where `log` says.
pub fn serve_process_with(
    db_url: &str,
    port: u16,
    env: &[(&str, &str)],
    log: std::process::Stdio,
) -> ServeProcess {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_plantstore"))
        .env_clear()
        .env("DATABASE_URL", db_url)
        .env("PLANTSTORE_LISTEN", format!("127.0.0.1:{port}"))
        .env("PLANTSTORE_WEBHOOK_TIMEOUT", "1s")
        .env("PLANTSTORE_WEBHOOK_RETRY_MIN", "50ms")
        .env("PLANTSTORE_WEBHOOK_RETRY_MAX", "500ms")
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("plantstore serve runs");
    ServeProcess(child)
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// Deletes each of `plants` from the service on `port` with `token`, expecting 204s.
pub async fn delete_on(port: u16, token: &str, plants: impl IntoIterator<Item = i64>) {
    let client = reqwest::Client::new();
    let deletes = plants.into_iter().map(|id| {
        client
            .delete(format!("http://127.0.0.1:{port}/plants/{id}"))
            .bearer_auth(token)
            .send()
    });
    for answer in futures::future::join_all(deletes).await {
        assert_eq!(answer.expect("an answer").status(), 204);
    }
}

/// Waits until the service on `port` answers `/healthz`.
pub async fn wait_until_serving(port: u16) {
    eventually(Duration::from_secs(20), "the service answering", || async {
        reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
            .await
            .ok()
            .filter(|answer| answer.status().is_success())
    })
    .await;
}

/// A token made with the command, as an operator makes one.
pub fn new_token(db_url: &str, name: &str) -> String {
    let created = succeeded(&plantstore_on(db_url, &["token", "create", "--name", name]));
    created.lines().last().expect("a token line").to_owned()
}
