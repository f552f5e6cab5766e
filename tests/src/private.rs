//! Private database servers: a server of the test's own, in a temporary directory on a
//! port of its own, for faults the shared servers must never see (a server made read-only,
//! crashed, or joined into a cluster). Killed with the value that owns it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use diesel::Connection;

/// A port nothing listens on now (the kernel's choice of a free one).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port on 127.0.0.1")
}

/// Runs a set-up command to completion, panicking with its output when it fails.
fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Waits until `connect` succeeds, at most a minute.
fn wait_for<C>(what: &str, log: &Path, mut connect: impl FnMut() -> Option<C>) -> C {
    let start = Instant::now();
    loop {
        if let Some(conn) = connect() {
            return conn;
        }
        if start.elapsed() > Duration::from_secs(60) {
            panic!(
                "{what} did not accept connections within a minute; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A private MariaDB server (`mariadbd`), root without a password, a database `test`.
pub struct PrivateMariadb {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

impl PrivateMariadb {
    /// Initialises a data directory and starts a server on it with `options` (e.g.
    /// `--read-only`) added to its command line.
    pub fn start(options: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        run(Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.path().join("data").display()))
            .args(["--user=root", "--auth-root-authentication-method=normal"])
            .arg("--skip-test-db"));
        let mut server = Self {
            dir,
            port: free_port(),
            child: None,
        };
        let mut admin = server.spawn(options);
        diesel::connection::SimpleConnection::batch_execute(
            &mut admin,
            "CREATE DATABASE IF NOT EXISTS test",
        )
        .expect("create the database test");
        server
    }

    /// Starts `mariadbd` on the data directory (again, after [`kill`](Self::kill)); returns
    /// a root connection without a default database.
    pub fn spawn(&mut self, options: &[&str]) -> diesel::MysqlConnection {
        assert!(self.child.is_none(), "the server is running");
        let dir = self.dir.path();
        let child = Command::new("mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--port={}", self.port))
            .arg(format!("--socket={}", dir.join("sock").display()))
            .arg(format!("--pid-file={}", dir.join("pid").display()))
            .arg(format!("--log-error={}", self.log().display()))
            .args([
                "--user=root",
                "--bind-address=127.0.0.1",
                "--innodb-buffer-pool-size=16M",
            ])
            .args(options)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start mariadbd: {e}"));
        self.child = Some(child);
        let url = format!("mysql://root@127.0.0.1:{}/mysql", self.port);
        wait_for("the private MariaDB", &self.log(), || {
            diesel::MysqlConnection::establish(&url).ok()
        })
    }

    /// Kills the server with SIGKILL, as a crash would, and waits for it to end.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The server's error log.
    pub fn log(&self) -> PathBuf {
        self.dir.path().join("error.log")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of the database `test` as `user` (no password).
    pub fn url(&self, user: &str) -> String {
        format!("mysql://{user}@127.0.0.1:{}/test", self.port)
    }

    /// A connection as root.
    pub fn admin(&self) -> diesel::MysqlConnection {
        diesel::MysqlConnection::establish(&self.url("root"))
            .unwrap_or_else(|e| panic!("connect to the private MariaDB as root: {e}"))
    }
}

impl Drop for PrivateMariadb {
    fn drop(&mut self) {
        self.kill();
    }
}
