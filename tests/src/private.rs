//! Private database servers: a server of the test's own, in a temporary directory on a
//! port of its own, for faults the shared servers must never see (a server made read-only,
//! crashed, or joined into a cluster). Killed with the value that owns it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use diesel::Connection;

/// A port nothing listens on now, below the kernel's range of ephemeral ports (32768–60999
/// by default). A port the kernel hands out is one an outgoing connection can take before
/// the server binds it: a Galera node connecting to its peer's address, not yet listened
/// on, from that very port (a TCP self-connect) took the peer's port so, and the peer could
/// not start.
pub fn free_port() -> u16 {
    for _ in 0..1000 {
        let port = fastrand::u16(20_000..32_000);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 between 20000 and 32000")
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
#[cfg(feature = "mysql")]
pub struct PrivateMariadb {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

#[cfg(feature = "mysql")]
impl PrivateMariadb {
    /// Initialises a data directory and starts a server on it with `options` (e.g.
    /// `--read-only`) added to its command line.
    pub fn start(options: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        // The bootstrap server's tmpdir too (`TMPDIR`): not the shared /tmp.
        std::fs::create_dir_all(dir.path().join("tmp")).expect("a tmpdir");
        run(Command::new("mariadb-install-db")
            .env("TMPDIR", dir.path().join("tmp"))
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
        // A temporary directory of its own: a server starting removes the `#sql…` files it
        // finds in its tmpdir, and in the shared /tmp those are the shared server's.
        let _ = std::fs::create_dir_all(dir.join("tmp"));
        let child = Command::new("mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--tmpdir={}", dir.join("tmp").display()))
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

#[cfg(feature = "mysql")]
impl Drop for PrivateMariadb {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A private two-node MariaDB Galera cluster (Debian's `galera-4`, rsync state transfer),
/// root without a password, a database `test`. When the tests run as root the nodes run as
/// the `mysql` user: the state transfer's rsync daemon drops root and could not read root's
/// files.
#[cfg(feature = "mysql")]
pub struct PrivateGalera {
    dir: tempfile::TempDir,
    /// Each node's port and server process.
    nodes: Vec<(u16, Child)>,
}

#[cfg(feature = "mysql")]
impl PrivateGalera {
    const PROVIDER: &'static str = "/usr/lib/galera/libgalera_smm.so";

    /// Starts the first node as a new cluster, then the second, which copies its state; each
    /// synced before this returns.
    pub fn start() -> Self {
        assert!(
            Path::new(Self::PROVIDER).is_file(),
            "no Galera provider at {} (Debian: galera-4)",
            Self::PROVIDER
        );
        let dir = tempfile::tempdir().expect("a temporary directory");
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let user = if root { "--user=mysql" } else { "--user=root" };
        let ports: Vec<[u16; 4]> = (0..2)
            .map(|_| [free_port(), free_port(), free_port(), free_port()])
            .collect();
        for n in 0..2 {
            for sub in ["data", "tmp"] {
                std::fs::create_dir_all(dir.path().join(format!("node{n}/{sub}")))
                    .expect("a node's directory");
            }
        }
        if root {
            run(Command::new("chown")
                .args(["-R", "mysql:mysql"])
                .arg(dir.path()));
        }
        run(Command::new("mariadb-install-db")
            .env("TMPDIR", dir.path().join("node0/tmp"))
            .arg("--no-defaults")
            .arg(format!(
                "--datadir={}",
                dir.path().join("node0/data").display()
            ))
            .args([
                user,
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ]));
        let address = format!(
            "gcomm://127.0.0.1:{},127.0.0.1:{}",
            ports[0][1], ports[1][1]
        );
        let mut cluster = PrivateGalera {
            dir,
            nodes: Vec::new(),
        };
        for (n, [port, group, ist, sst]) in ports.into_iter().enumerate() {
            let node = cluster.dir.path().join(format!("node{n}"));
            // Its own tmpdir (made above), as the single server's.
            let mut command = Command::new("mariadbd");
            command
                .arg("--no-defaults")
                .arg(format!("--datadir={}", node.join("data").display()))
                .arg(format!("--tmpdir={}", node.join("tmp").display()))
                .arg(format!("--port={port}"))
                .arg(format!("--socket={}", node.join("sock").display()))
                .arg(format!("--pid-file={}", node.join("pid").display()))
                .arg(format!("--log-error={}", node.join("error.log").display()))
                .args([
                    user,
                    "--bind-address=127.0.0.1",
                    "--innodb-buffer-pool-size=16M",
                    "--binlog-format=ROW",
                    "--innodb-autoinc-lock-mode=2",
                    "--wsrep-on=ON",
                    "--wsrep-sst-method=rsync",
                    "--wsrep-node-address=127.0.0.1",
                    "--wsrep-cluster-name=inbox-tests",
                ])
                .arg(format!("--wsrep-provider={}", Self::PROVIDER))
                .arg(format!("--wsrep-cluster-address={address}"))
                .arg(format!("--wsrep-sst-receive-address=127.0.0.1:{sst}"))
                .arg(format!(
                    "--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{group};\
                     ist.recv_addr=127.0.0.1:{ist}"
                ))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if n == 0 {
                command.arg("--wsrep-new-cluster");
            }
            let child = command
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start mariadbd: {e}"));
            cluster.nodes.push((port, child));
            let url = format!("mysql://root@127.0.0.1:{port}/mysql");
            let log = node.join("error.log");
            let started = Instant::now();
            loop {
                if let Ok(mut conn) = diesel::MysqlConnection::establish(&url)
                    && synced(&mut conn)
                {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(180),
                    "Galera node {n} did not sync within three minutes; its log:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        let mut admin =
            diesel::MysqlConnection::establish(&cluster.url(0).replace("/test", "/mysql"))
                .expect("connect to node 0");
        diesel::connection::SimpleConnection::batch_execute(&mut admin, "CREATE DATABASE test")
            .expect("create the database test");
        cluster
    }

    /// The URL of node `n`'s database `test` as root.
    pub fn url(&self, n: usize) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.nodes[n].0)
    }
}

/// Whether the node a connection is on is synced with its cluster.
#[cfg(feature = "mysql")]
fn synced(conn: &mut diesel::MysqlConnection) -> bool {
    #[derive(diesel::QueryableByName)]
    struct Status {
        #[diesel(sql_type = diesel::sql_types::Text)]
        #[diesel(column_name = "Value")]
        value: String,
    }
    diesel::RunQueryDsl::load::<Status>(
        diesel::sql_query("SHOW STATUS LIKE 'wsrep_local_state_comment'"),
        conn,
    )
    .is_ok_and(|rows| rows.first().is_some_and(|s| s.value == "Synced"))
}

#[cfg(feature = "mysql")]
impl Drop for PrivateGalera {
    fn drop(&mut self) {
        for (_, child) in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A private PostgreSQL server (`initdb` into a temporary directory, its own port), the
/// `postgres` superuser trusted on 127.0.0.1. Initialised with a locale, as `initdb` on a
/// system installed in that language would be: its messages are in that language. Run as
/// the `postgres` user when the tests run as root (the server refuses root). Stopped
/// (`immediate`) when dropped.
pub struct PrivatePostgres {
    dir: tempfile::TempDir,
    port: u16,
    bin: PathBuf,
}

impl PrivatePostgres {
    /// `initdb --locale=<locale>`, then the server started.
    pub fn start(locale: &str) -> Self {
        Self::start_with(locale, &[])
    }

    /// As [`start`](Self::start), the server started with `settings` (`name=value`, as
    /// `postgres -c` takes them): what only a server's start sets.
    pub fn start_with(locale: &str, settings: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let server = Self {
            dir,
            port: free_port(),
            bin: postgres_bin(),
        };
        if is_root() {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(server.dir.path()));
        }
        let data = server.data();
        server.as_owner(&[
            &server.tool("initdb"),
            "-D",
            &data,
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            &format!("--locale={locale}"),
            "--no-sync",
        ]);
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            server.port,
            server.dir.path().display()
        );
        for setting in settings {
            options.push_str(&format!(" -c {setting}"));
        }
        let log = server.dir.path().join("postgres.log");
        server.as_owner(&[
            &server.tool("pg_ctl"),
            "-D",
            &data,
            "-l",
            log.to_str().expect("a UTF-8 path"),
            "-o",
            &options,
            "-w",
            "start",
        ]);
        server
    }

    /// The URL of `database` as `user` (trusted: no password).
    pub fn url(&self, user: &str, database: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{database}", self.port)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn tool(&self, name: &str) -> String {
        self.bin.join(name).display().to_string()
    }

    fn as_owner(&self, argv: &[&str]) {
        let mut command = match is_root() {
            true => {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).args(argv);
                c
            }
            false => {
                let mut c = Command::new(argv[0]);
                c.args(&argv[1..]);
                c
            }
        };
        run(&mut command);
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let data = self.data();
        let pg_ctl = self.tool("pg_ctl");
        let mut command = match is_root() {
            true => {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--", &pg_ctl]);
                c
            }
            false => Command::new(&pg_ctl),
        };
        let _ = command
            .args(["-D", &data, "-m", "immediate", "-w", "stop"])
            .output();
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// `initdb` and `pg_ctl`: on `PATH`, or Debian's newest `/usr/lib/postgresql/<version>/bin`.
fn postgres_bin() -> PathBuf {
    if let Some(dir) = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
    }) {
        return dir;
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("initdb on PATH or under /usr/lib/postgresql (install postgresql)")
        .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").is_file())
        .collect();
    versions.sort();
    versions
        .pop()
        .expect("initdb under /usr/lib/postgresql (install postgresql)")
}

/// A private PgBouncer (Debian's `pgbouncer`) in front of the server at `upstream` (host and
/// port), on a port of its own, in `mode` (`transaction`: each client transaction runs on
/// whichever server connection is free; `session`: a client keeps one for its session) with
/// a pool of `pool` server connections per database and user. Users are trusted as the
/// server trusts them. Stopped when dropped.
#[cfg(feature = "postgres")]
pub struct PrivatePgbouncer {
    dir: tempfile::TempDir,
    port: u16,
}

#[cfg(feature = "postgres")]
impl PrivatePgbouncer {
    pub fn start(
        upstream_host: &str,
        upstream_port: u16,
        users: &[&str],
        mode: &str,
        pool: u32,
    ) -> Self {
        Self::start_with(upstream_host, upstream_port, users, mode, pool, &[])
    }

    /// As [`start`](Self::start), with `settings` (`name = value` lines of its `[pgbouncer]`
    /// section) added.
    pub fn start_with(
        upstream_host: &str,
        upstream_port: u16,
        users: &[&str],
        mode: &str,
        pool: u32,
        settings: &[&str],
    ) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let port = free_port();
        let path = dir.path();
        let users: String = users.iter().map(|u| format!("\"{u}\" \"\"\n")).collect();
        std::fs::write(path.join("users.txt"), users).expect("write users.txt");
        let config = format!(
            "[databases]\n* = host={upstream_host} port={upstream_port}\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
             auth_type = trust\nauth_file = {users}\npool_mode = {mode}\n\
             default_pool_size = {pool}\nmax_client_conn = 200\nunix_socket_dir =\n\
             logfile = {log}\npidfile = {pid}\n\
             ignore_startup_parameters = extra_float_digits,options\n{settings}",
            settings = settings
                .iter()
                .map(|s| format!("{s}\n"))
                .collect::<String>(),
            users = path.join("users.txt").display(),
            log = path.join("pgbouncer.log").display(),
            pid = path.join("pgbouncer.pid").display(),
        );
        let ini = path.join("pgbouncer.ini");
        std::fs::write(&ini, config).expect("write pgbouncer.ini");
        let mut command = match is_root() {
            // PgBouncer refuses to run as root.
            true => {
                run(Command::new("chown").args(["-R", "postgres"]).arg(path));
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--", "pgbouncer", "-d"]);
                c
            }
            false => {
                let mut c = Command::new("pgbouncer");
                c.arg("-d");
                c
            }
        };
        run(command.arg(&ini));
        let log = path.join("pgbouncer.log");
        let bouncer = Self { dir, port };
        let url = bouncer.url("postgres", "postgres");
        wait_for("the private PgBouncer", &log, || {
            diesel::PgConnection::establish(&url).ok()
        });
        bouncer
    }

    /// The URL of `database` as `user`, through the pooler.
    pub fn url(&self, user: &str, database: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{database}", self.port)
    }
}

#[cfg(feature = "postgres")]
impl Drop for PrivatePgbouncer {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.path().join("pgbouncer.pid")) {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
    }
}
