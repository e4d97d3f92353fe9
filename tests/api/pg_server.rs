//! A PostgreSQL server of the test's own, in a temporary folder on a free port, for the
//! faults the shared server must not suffer: being stopped and started again.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::Command,
};

/// A private cluster made with the machine's own `initdb`; stopped and deleted on drop.
pub struct PgServer {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
}

impl PgServer {
    pub fn start() -> Self {
        let bin = bin_dir();
        let dir = tempfile::Builder::new()
            .prefix("plantstore-pg-")
            .tempdir()
            .expect("a folder for the test's PostgreSQL");
        if as_root() {
            // PostgreSQL refuses to run as root; its files belong to `postgres`.
            run(Command::new("chown").arg("postgres:").arg(dir.path()));
        }
        let port = free_port();
        let server = Self { bin, dir, port };
        server.pg(
            "initdb",
            &["-N", "-A", "trust", "-U", "postgres", "-D", &server.data()],
        );
        server.start_again();
        server
    }

    /// `postgres://…/postgres` on this server, for `TestDb::postgres_on`.
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Kills the server without a shutdown checkpoint (as a crash or `kill -9` of the
    /// postmaster would); the next start replays the WAL. fsync is off, so this proves
    /// what survives a killed process, not a power cut.
    pub fn stop_immediately(&self) {
        self.pg(
            "pg_ctl",
            &["stop", "-w", "-m", "immediate", "-D", &self.data()],
        );
    }

    pub fn start_again(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log");
        self.pg(
            "pg_ctl",
            &[
                "start",
                "-w",
                "-D",
                &self.data(),
                "-l",
                &log.display().to_string(),
                "-o",
                &options,
            ],
        );
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn pg(&self, program: &str, args: &[&str]) {
        run(&mut self.command(program, args));
    }

    fn command(&self, program: &str, args: &[&str]) -> Command {
        let path = self.bin.join(program);
        let mut command = if as_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(path);
            command
        } else {
            Command::new(path)
        };
        command.args(args).current_dir(self.dir.path());
        command
    }
}

impl Drop for PgServer {
    /// Stops the server before its folder goes; a failure here cannot fail the test.
    fn drop(&mut self) {
        let stop = ["stop", "-w", "-m", "immediate", "-D", &self.data()].map(str::to_owned);
        let args: Vec<&str> = stop.iter().map(String::as_str).collect();
        let _ = self.command("pg_ctl", &args).output();
    }
}

/// The newest `/usr/lib/postgresql/N/bin` (Debian's layout), or `PLANTSTORE_TEST_PG_BIN`.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PLANTSTORE_TEST_PG_BIN") {
        return dir.into();
    }
    let root = Path::new("/usr/lib/postgresql");
    let newest = std::fs::read_dir(root)
        .expect("PostgreSQL's server programs under /usr/lib/postgresql")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .max()
        .expect("a PostgreSQL version under /usr/lib/postgresql");
    root.join(newest.to_string()).join("bin")
}

fn as_root() -> bool {
    let output = Command::new("id").arg("-u").output().expect("run id -u");
    output.stdout.trim_ascii() == b"0"
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

fn run(command: &mut Command) {
    let output = command.output().expect("run a PostgreSQL program");
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
