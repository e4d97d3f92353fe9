//! The PostgreSQL server the tests run on: the one `PLANTSTORE_TEST_POSTGRES_URL` names,
//! else the machine's own on 5432 when it answers, else a throwaway server started from the
//! machine's PostgreSQL programs for this test binary. The crash tests start servers of
//! their own the same way, for the faults the shared one must not suffer.

use std::{
    ffi::OsStr,
    fs::{File, Permissions},
    net::TcpListener,
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{ChildStdin, Command, Stdio},
    sync::OnceLock,
    time::Duration,
};

use sqlx::{Connection, PgConnection};
use tokio::sync::OnceCell;

const POSTGRES_URL_VAR: &str = "PLANTSTORE_TEST_POSTGRES_URL";
const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
const PG_BIN_VAR: &str = "PLANTSTORE_TEST_PG_BIN";
/// Each server's folder in the temporary directory starts with this, so that a later run
/// can find the folders of a run that was killed.
const FOLDER_PREFIX: &str = "plantstore-test-pg-";

/// The admin URL (`…/postgres`) of the server the PostgreSQL tests share. Decided once per
/// test binary; when no server can be had, every PostgreSQL test fails with the same line.
pub async fn admin_url() -> String {
    static CHOSEN: OnceCell<Result<String, String>> = OnceCell::const_new();
    let chosen = CHOSEN.get_or_init(choose_server).await;
    chosen.clone().unwrap_or_else(|why| panic!("{why}"))
}

async fn choose_server() -> Result<String, String> {
    if let Ok(url) = std::env::var(POSTGRES_URL_VAR) {
        return Ok(url);
    }
    let connect = PgConnection::connect(DEFAULT_POSTGRES_URL);
    let unanswered = match tokio::time::timeout(Duration::from_secs(5), connect).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            return Ok(DEFAULT_POSTGRES_URL.to_owned());
        }
        Ok(Err(err)) => err.to_string(),
        Err(_) => "no answer within 5 s".to_owned(),
    };
    let started = tokio::task::spawn_blocking(|| {
        static SHARED: OnceLock<PgServer> = OnceLock::new();
        let server = PgServer::try_start()?;
        Ok::<_, String>(SHARED.get_or_init(|| server).admin_url())
    });
    match started.await {
        Ok(Ok(url)) => Ok(url),
        Ok(Err(why)) => Err(format!(
            "the PostgreSQL tests need a server: nothing answered on {DEFAULT_POSTGRES_URL} \
             ({unanswered}), and none could be started: {why}"
        )),
        Err(panicked) => Err(format!("starting a PostgreSQL server panicked: {panicked}")),
    }
}

/// A cluster made with the machine's own `initdb` in a temporary folder, on a free port,
/// with trust auth. Stopped and deleted when dropped, or when the test binary ends, however
/// it ends.
pub struct PgServer {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    /// Held for as long as the server is ours: a folder whose lock is free was left behind
    /// by a run that is gone.
    _lock: File,
    /// Its write end; when this process ends, the pipe closes and the watchdog on the other
    /// end stops the server and deletes its folder.
    _watchdog: ChildStdin,
}

impl PgServer {
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|why| panic!("{why}"))
    }

    fn try_start() -> Result<Self, String> {
        // Once per test binary, and before any of its own folders exists: so a folder
        // being made here is never taken for an abandoned one.
        static PROGRAMS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
        let bin = PROGRAMS
            .get_or_init(|| {
                let bin = bin_dir()?;
                remove_abandoned_servers(&bin);
                Ok(bin)
            })
            .clone()?;
        let dir = tempfile::Builder::new()
            .prefix(FOLDER_PREFIX)
            .tempdir()
            .map_err(|err| format!("no folder for a test PostgreSQL server: {err}"))?;
        let lock = File::create(dir.path().join("lock"))
            .and_then(|lock| lock.try_lock().map(|()| lock).map_err(Into::into))
            .map_err(|err| format!("cannot lock the test server's folder: {err}"))?;
        if as_root() {
            // PostgreSQL refuses to run as root; its files belong to `postgres`.
            run(Command::new("chown").arg("postgres:").arg(dir.path()))?;
        }
        let watchdog = watchdog(&bin, dir.path())?;
        let server = Self {
            bin,
            dir,
            port: free_port(),
            _lock: lock,
            _watchdog: watchdog,
        };
        server.pg(
            "initdb",
            &["-N", "-A", "trust", "-U", "postgres", "-D", &server.data()],
        )?;
        // TLS with a certificate of its own, as Debian's packaged server has, for the
        // tests of `sslmode=require`.
        let (key, cert) = ("data/server.key", "data/server.crt");
        let mut openssl = as_owner(
            "openssl",
            &["req", "-x509", "-nodes", "-days", "2"],
            server.dir.path(),
        );
        openssl.args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]);
        run(openssl.args(["-subj", "/CN=127.0.0.1", "-keyout", key, "-out", cert]))?;
        std::fs::set_permissions(server.dir.path().join(key), Permissions::from_mode(0o600))
            .map_err(|err| format!("cannot make the test server's key private: {err}"))?;
        server.try_start_again()?;
        Ok(server)
    }

    /// `postgres://…/postgres` on this server, for `TestDb::postgres_on`.
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Kills the server without a shutdown checkpoint (as a crash or `kill -9` of the
    /// postmaster would); the next start replays the WAL. fsync is off, so this proves
    /// what survives a killed process, not a power cut.
    pub fn stop_immediately(&self) {
        run(&mut stop_command(&self.bin, self.dir.path())).unwrap_or_else(|why| panic!("{why}"));
    }

    pub fn start_again(&self) {
        self.try_start_again().unwrap_or_else(|why| panic!("{why}"));
    }

    fn try_start_again(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c ssl=on -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log").display().to_string();
        let data = self.data();
        let start = ["start", "-w", "-D", &data, "-l", &log, "-o", &options];
        self.pg("pg_ctl", &start)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn pg(&self, program: &str, args: &[&str]) -> Result<(), String> {
        run(&mut pg_command(&self.bin, program, args, self.dir.path()))
    }
}

impl Drop for PgServer {
    /// Stops the server before its folder goes; a failure here cannot fail the test.
    fn drop(&mut self) {
        let _ = stop_command(&self.bin, self.dir.path()).output();
    }
}

/// A process of its own (out of the test binary's process group, so Ctrl-C spares it)
/// that waits for its stdin to close, then stops the server in `dir` and deletes `dir`.
fn watchdog(bin: &Path, dir: &Path) -> Result<ChildStdin, String> {
    let stop = stop_command(bin, dir);
    let mut child = Command::new("sh")
        .args([
            "-c",
            r#"cat >/dev/null; dir=$1; shift; "$@"; rm -rf "$dir""#,
            "sh",
        ])
        .arg(dir)
        .arg(stop.get_program())
        .args(stop.get_args())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|err| format!("cannot start sh to stop the test server later: {err}"))?;
    child
        .stdin
        .take()
        .ok_or_else(|| "the watchdog has no stdin".to_owned())
}

/// Stops and deletes every test server whose run ended without its watchdog (the machine
/// went down, or the watchdog was killed too): its folder's lock is free.
fn remove_abandoned_servers(bin: &Path) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for dir in entries.filter_map(|entry| Some(entry.ok()?.path())) {
        let ours = dir
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with(FOLDER_PREFIX));
        // A minute old at least: a younger one may be another run's, not yet locked.
        let settled = || {
            dir.metadata()
                .and_then(|meta| meta.modified())
                .is_ok_and(|made| made.elapsed().is_ok_and(|age| age.as_secs() >= 60))
        };
        let abandoned = ours
            && settled()
            && File::open(dir.join("lock")).is_ok_and(|lock| lock.try_lock().is_ok());
        if abandoned {
            let _ = stop_command(bin, &dir).output();
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Where `initdb` and `pg_ctl` are: `PLANTSTORE_TEST_PG_BIN` when set (and then only
/// there), else `pg_config --bindir`, else the newest `/usr/lib/postgresql/N/bin` (Debian).
fn bin_dir() -> Result<PathBuf, String> {
    let has_initdb = |dir: &Path| dir.join("initdb").is_file();
    if let Some(dir) = std::env::var_os(PG_BIN_VAR) {
        let dir = PathBuf::from(dir);
        return if has_initdb(&dir) {
            Ok(dir)
        } else {
            Err(no_programs(&format!(
                "{PG_BIN_VAR}={} has no initdb",
                dir.display()
            )))
        };
    }
    let pg_config = match Command::new("pg_config").arg("--bindir").output() {
        Ok(out) if out.status.success() => {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if has_initdb(&dir) {
                return Ok(dir);
            }
            format!("pg_config --bindir: {} has no initdb", dir.display())
        }
        Ok(out) => format!("pg_config --bindir: {}", out.status),
        Err(_) => "no pg_config on PATH".to_owned(),
    };
    let debian = Path::new("/usr/lib/postgresql");
    let newest = std::fs::read_dir(debian)
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|version| has_initdb(&debian.join(version.to_string()).join("bin")))
        .max()
        .map(|version| debian.join(version.to_string()).join("bin"));
    newest.ok_or_else(|| no_programs(&format!("{pg_config}; no /usr/lib/postgresql/*/bin/initdb")))
}

fn no_programs(tried: &str) -> String {
    format!(
        "no PostgreSQL programs to run one ({tried}). Install them (Debian: apt install \
         postgresql; macOS: brew install postgresql@15, then set {PG_BIN_VAR} to its bin \
         folder), or set {POSTGRES_URL_VAR} to a server"
    )
}

/// `pg_ctl stop -m immediate` for the server in `dir`: no shutdown checkpoint, as a crash
/// or `kill -9` of the postmaster would leave it.
fn stop_command(bin: &Path, dir: &Path) -> Command {
    let data = dir.join("data").display().to_string();
    pg_command(
        bin,
        "pg_ctl",
        &["stop", "-w", "-m", "immediate", "-D", &data],
        dir,
    )
}

/// `program` from `bin`, run as `postgres` when this is root.
fn pg_command(bin: &Path, program: &str, args: &[&str], dir: &Path) -> Command {
    as_owner(bin.join(program), args, dir)
}

/// `program` in `dir`, run as `postgres` when this is root, so what it writes is the
/// server's.
fn as_owner(program: impl AsRef<OsStr>, args: &[&str], dir: &Path) -> Command {
    let mut command = if as_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    };
    command.args(args).current_dir(dir);
    command
}

fn as_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
    })
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command
        .output()
        .map_err(|err| format!("{command:?} did not run: {err}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}
