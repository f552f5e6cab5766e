//! The database of one run: an SQLite file, a private PostgreSQL server this tool starts in
//! a temporary directory on a port of its own (and crashes), or a database of its own on the
//! MariaDB/MySQL server `INBOX_TEST_MYSQL` names. Never the shared PostgreSQL server.

use std::path::{Path, PathBuf};
use std::process::Command;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::BigInt;
use inbox_diesel::{InboxSchema, schema};

use crate::protocol::Backend;

/// The name consumers give their PostgreSQL sessions, for the cuts to find them.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub const APPLICATION: &str = "inbox-chaos";

pub struct Database {
    pub backend: Backend,
    /// What consumers connect to.
    pub url: String,
    admin_url: String,
    dir: tempfile::TempDir,
    #[allow(dead_code)]
    private: Option<PrivatePostgres>,
    /// The failover runs' streaming replica, and whether it has been promoted.
    #[allow(dead_code)]
    replica: Option<PrivatePostgres>,
    failed_over: bool,
    #[allow(dead_code)]
    mysql_db: Option<String>,
    #[cfg(feature = "mysql")]
    galera: Option<crate::galera::Galera>,
    /// A Galera node killed by the last crash, started again at the next one.
    #[cfg(feature = "mysql")]
    down: Option<usize>,
}

/// The database the Galera run creates on its cluster.
#[cfg(feature = "mysql")]
const GALERA_DB: &str = "inbox_chaos";

#[derive(QueryableByName)]
struct Number {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// What the database holds at the end of a run.
#[derive(Debug, Default)]
pub struct Contents {
    /// Messages with at least one effect.
    pub messages: i64,
    /// Messages with more than one.
    pub doubled: i64,
    pub effects: i64,
    pub markers: i64,
    /// Claim-mode messages stamped complete.
    pub claims_completed: i64,
    /// Transaction-mode messages whose effect and marker disagree (one without the other),
    /// where the markers can be read back (PostgreSQL).
    pub torn: Option<u64>,
    pub applied: std::collections::HashSet<u64>,
    /// The deliveries whose effect is in the database.
    pub deliveries: std::collections::HashSet<u64>,
    /// The sum of the hot rows: one per committed transaction-mode body with `--hot`.
    pub hot: i64,
}

/// The hot rows ([`crate::consumer::HOT_ROWS`]), on every backend.
/// `w` is what the run's other writers ([`Database::other_writers`]) update.
const HOT: &str = "CREATE TABLE hot (id INTEGER PRIMARY KEY, n BIGINT NOT NULL, \
                   w BIGINT NOT NULL DEFAULT 0); \
                   INSERT INTO hot (id, n) VALUES (0, 0), (1, 0), (2, 0)";

const EFFECTS_SQLITE: &str = "CREATE TABLE effects (id INTEGER PRIMARY KEY, message BIGINT NOT NULL, \
                              delivery BIGINT NOT NULL, consumer TEXT NOT NULL)";
#[cfg(feature = "postgres")]
const EFFECTS_POSTGRES: &str = "CREATE TABLE effects (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
                                message BIGINT NOT NULL, delivery BIGINT NOT NULL, consumer TEXT NOT NULL)";
#[cfg(feature = "mysql")]
const EFFECTS_MYSQL: &str = "CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
                             message BIGINT NOT NULL, delivery BIGINT NOT NULL, consumer VARCHAR(64) NOT NULL)";

impl Database {
    fn new(backend: Backend, url: String, admin_url: String, dir: tempfile::TempDir) -> Self {
        Database {
            backend,
            url,
            admin_url,
            dir,
            private: None,
            replica: None,
            failed_over: false,
            mysql_db: None,
            #[cfg(feature = "mysql")]
            galera: None,
            #[cfg(feature = "mysql")]
            down: None,
        }
    }

    #[cfg(feature = "postgres")]
    fn with_private(mut self, server: PrivatePostgres) -> Self {
        self.private = Some(server);
        self
    }

    #[cfg(feature = "postgres")]
    fn with_replica(mut self, server: PrivatePostgres) -> Self {
        self.replica = Some(server);
        self
    }

    #[cfg(feature = "mysql")]
    fn with_mysql_db(mut self, name: String) -> Self {
        self.mysql_db = Some(name);
        self
    }

    #[cfg(feature = "mysql")]
    fn with_galera(mut self, galera: crate::galera::Galera) -> Self {
        self.galera = Some(galera);
        self
    }

    /// A fresh database with the inbox table and `effects`.
    pub fn create(backend: Backend, seed: u64) -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("inbox-chaos-")
            .tempdir()
            .map_err(|e| format!("a temporary directory: {e}"))?;
        match backend {
            Backend::Sqlite => {
                let url = dir.path().join("chaos.sqlite").display().to_string();
                let mut conn = SqliteConnection::establish(&url).map_err(|e| e.to_string())?;
                conn.batch_execute("PRAGMA journal_mode = WAL")
                    .and_then(|()| {
                        conn.batch_execute(&schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))
                    })
                    .and_then(|()| conn.batch_execute(EFFECTS_SQLITE))
                    .and_then(|()| conn.batch_execute(HOT))
                    .map_err(|e| e.to_string())?;
                Ok(Database::new(backend, url.clone(), url, dir))
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres => {
                let private = PrivatePostgres::start(dir.path())?;
                let admin_url = private.url();
                let mut conn = PgConnection::establish(&admin_url).map_err(|e| e.to_string())?;
                conn.batch_execute(&schema::postgres::create_table_sql(&InboxSchema::DEFAULT))
                    .and_then(|()| conn.batch_execute(EFFECTS_POSTGRES))
                    .and_then(|()| conn.batch_execute(HOT))
                    .map_err(|e| e.to_string())?;
                let url = format!("{admin_url}?application_name={APPLICATION}");
                Ok(Database::new(backend, url, admin_url, dir).with_private(private))
            }
            #[cfg(feature = "postgres")]
            Backend::Failover | Backend::FailoverSync => {
                let primary = PrivatePostgres::start_with(&dir.path().join("primary"), "")?;
                let admin_url = primary.url();
                let mut conn = PgConnection::establish(&admin_url).map_err(|e| e.to_string())?;
                conn.batch_execute(&schema::postgres::create_table_sql(&InboxSchema::DEFAULT))
                    .and_then(|()| conn.batch_execute(EFFECTS_POSTGRES))
                    .and_then(|()| conn.batch_execute(HOT))
                    .map_err(|e| e.to_string())?;
                let replica = primary.replica(&dir.path().join("replica"))?;
                if backend == Backend::FailoverSync {
                    // Once the replica streams: a commit returns when the replica has it.
                    conn.batch_execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                        .and_then(|()| conn.batch_execute("SELECT pg_reload_conf()"))
                        .map_err(|e| e.to_string())?;
                }
                // libpq tries the hosts in turn and keeps the one that takes writes.
                let url = format!(
                    "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?\
                     target_session_attrs=read-write&connect_timeout=2&application_name={APPLICATION}",
                    primary.port, replica.port
                );
                Ok(Database::new(backend, url, admin_url, dir)
                    .with_private(primary)
                    .with_replica(replica))
            }
            #[cfg(feature = "mysql")]
            Backend::Mysql => {
                let server = std::env::var("INBOX_TEST_MYSQL")
                    .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
                let name = format!("inbox_chaos_{seed}");
                let mut root = MysqlConnection::establish(&server)
                    .map_err(|e| format!("MariaDB at {server}: {e}"))?;
                root.batch_execute(&format!(
                    "DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}"
                ))
                .map_err(|e| e.to_string())?;
                let base = server.rsplit_once('/').map_or(server.as_str(), |(b, _)| b);
                let url = format!("{base}/{name}");
                let mut conn = MysqlConnection::establish(&url).map_err(|e| e.to_string())?;
                conn.batch_execute(&schema::mysql::create_table_sql(&InboxSchema::DEFAULT))
                    .and_then(|()| conn.batch_execute(EFFECTS_MYSQL))
                    .and_then(|()| conn.batch_execute(HOT))
                    .map_err(|e| e.to_string())?;
                Ok(Database::new(backend, url.clone(), url, dir).with_mysql_db(name))
            }
            #[cfg(feature = "mysql")]
            Backend::Galera => {
                let galera = crate::galera::Galera::start(dir.path())?;
                let mut root = MysqlConnection::establish(&galera.url(0, "mysql"))
                    .map_err(|e| e.to_string())?;
                root.batch_execute(&format!("CREATE DATABASE {GALERA_DB}"))
                    .map_err(|e| e.to_string())?;
                let admin_url = galera.url(0, GALERA_DB);
                let mut conn = MysqlConnection::establish(&admin_url).map_err(|e| e.to_string())?;
                conn.batch_execute(&schema::mysql::create_table_sql(&InboxSchema::DEFAULT))
                    .and_then(|()| conn.batch_execute(EFFECTS_MYSQL))
                    .and_then(|()| conn.batch_execute(HOT))
                    .map_err(|e| e.to_string())?;
                Ok(
                    Database::new(backend, galera.urls(0, GALERA_DB), admin_url, dir)
                        .with_mysql_db(GALERA_DB.to_owned())
                        .with_galera(galera),
                )
            }
            #[allow(unreachable_patterns)]
            backend => {
                let _ = seed;
                Err(format!(
                    "this build has no {} backend: build with its feature",
                    backend.name()
                ))
            }
        }
    }

    /// Where the consumers' ack logs go.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Which faults of the server this backend has: connection cuts, crashes.
    pub fn can_cut(&self) -> bool {
        self.backend != Backend::Sqlite
    }

    pub fn can_crash(&self) -> bool {
        match self.backend {
            Backend::Postgres | Backend::Galera => true,
            // One failover per run.
            Backend::Failover | Backend::FailoverSync => !self.failed_over,
            _ => false,
        }
    }

    /// Whether the run lost commits on purpose: an asynchronous replica promoted.
    pub fn may_lose_commits(&self) -> bool {
        self.backend == Backend::Failover
    }

    /// With `--hot` on Galera: the URLs of the application's other writers, one per node,
    /// which update the hot rows in transactions of their own while the consumers run — as
    /// other services write to the same accounts. Their commits on one node abort the
    /// consumers' transactions on the others.
    pub fn other_writers(&self) -> Vec<String> {
        #[cfg(feature = "mysql")]
        if let Some(galera) = &self.galera {
            return (0..galera.len())
                .map(|n| galera.url(n, GALERA_DB))
                .collect();
        }
        Vec::new()
    }

    /// What consumer `slot` connects to: on Galera, every node, starting from its own, so
    /// that the consumers are spread over the nodes and move on while one is down.
    pub fn url_for(&self, slot: usize) -> String {
        #[cfg(feature = "mysql")]
        if let Some(galera) = &self.galera {
            return galera.urls(slot % galera.len(), GALERA_DB);
        }
        let _ = slot;
        self.url.clone()
    }

    /// Ends about half the consumers' sessions from the server's side
    /// (`pg_terminate_backend`, `KILL`). Returns how many.
    pub fn cut(&self) -> Result<usize, String> {
        match self.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres | Backend::Failover | Backend::FailoverSync => {
                let mut conn =
                    PgConnection::establish(&self.admin_url).map_err(|e| e.to_string())?;
                let cut: Vec<Number> = diesel::sql_query(format!(
                    "SELECT count(*) AS n FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE application_name = '{APPLICATION}' AND random() < 0.5) t"
                ))
                .load(&mut conn)
                .map_err(|e| e.to_string())?;
                Ok(cut.first().map_or(0, |n| n.n as usize))
            }
            #[cfg(feature = "mysql")]
            Backend::Mysql | Backend::Galera => {
                let url = match &self.galera {
                    Some(galera) => {
                        let up: Vec<usize> = (0..galera.len())
                            .filter(|n| Some(*n) != self.down)
                            .collect();
                        galera.url(up[fastrand::usize(0..up.len())], GALERA_DB)
                    }
                    None => self.admin_url.clone(),
                };
                let mut conn = MysqlConnection::establish(&url).map_err(|e| e.to_string())?;
                let name = self.mysql_db.as_deref().unwrap_or_default();
                let sessions: Vec<Number> = diesel::sql_query(format!(
                    "SELECT CAST(id AS SIGNED) AS n FROM information_schema.processlist \
                     WHERE db = '{name}' AND id <> CONNECTION_ID() AND RAND() < 0.5"
                ))
                .load(&mut conn)
                .map_err(|e| e.to_string())?;
                let mut cut = 0;
                for session in sessions {
                    // Gone already (ended on its own) is no error here.
                    if conn.batch_execute(&format!("KILL {}", session.n)).is_ok() {
                        cut += 1;
                    }
                }
                Ok(cut)
            }
            _ => Ok(0),
        }
    }

    /// Crashes the private server (`pg_ctl stop -m immediate`: no checkpoint, as a power
    /// cut) and starts it again.
    /// On Galera: starts again the node the last crash killed, if any, and kills another
    /// (SIGKILL), which stays down until the next crash.
    pub fn crash(&mut self) -> Result<(), String> {
        #[cfg(feature = "mysql")]
        if let Some(galera) = &mut self.galera {
            if let Some(n) = self.down.take() {
                galera.rejoin(n)?;
            }
            let n = fastrand::usize(0..galera.len());
            galera.kill(n);
            self.down = Some(n);
            return Ok(());
        }
        #[cfg(feature = "postgres")]
        if let (Some(primary), Some(replica)) = (&self.private, &self.replica) {
            // The primary stops sending for a moment (its WAL sender paused, as by a network
            // partition) while it goes on committing; then it loses power (SIGKILL, all its
            // processes) and the replica is promoted without what it was not sent. With
            // synchronous replication the primary's commits wait for the replica instead.
            let sender = primary.pid("SELECT pid::int8 AS n FROM pg_stat_replication")?;
            run(Command::new("kill").args(["-STOP", &sender.to_string()]))?;
            std::thread::sleep(std::time::Duration::from_millis(300));
            primary.power_cut()?;
            replica.promote()?;
            self.admin_url = replica.url();
            self.failed_over = true;
            return Ok(());
        }
        match &self.private {
            Some(private) => private.crash_and_restart(),
            None => Err("no private server to crash".to_owned()),
        }
    }

    /// On Galera, the purge and the relay run on every node at once ([`crate::cluster`]);
    /// elsewhere, nothing.
    pub fn cluster_checks(&self) -> Option<(Vec<String>, Vec<String>)> {
        #[cfg(feature = "mysql")]
        if let Some(galera) = &self.galera {
            let found = crate::cluster::check(galera, GALERA_DB);
            return Some((found.lines, found.violations));
        }
        None
    }

    /// Brings back what a crash left down (a Galera node), before the end of the run.
    pub fn recover(&mut self) -> Result<(), String> {
        #[cfg(feature = "mysql")]
        if let (Some(galera), Some(n)) = (&mut self.galera, self.down.take()) {
            galera.rejoin(n)?;
        }
        Ok(())
    }

    /// What the tables hold.
    pub fn contents(&self) -> Result<Contents, String> {
        macro_rules! read {
            ($conn:expr) => {{
                let conn = $conn;
                let one = |conn: &mut _, sql: &str| -> Result<i64, String> {
                    let rows: Vec<Number> = diesel::sql_query(sql)
                        .load(conn)
                        .map_err(|e| format!("{sql}: {e}"))?;
                    Ok(rows.first().map_or(0, |r| r.n))
                };
                let column = |conn: &mut _, sql: &str| -> Result<Vec<i64>, String> {
                    let rows: Vec<Number> = diesel::sql_query(sql)
                        .load(conn)
                        .map_err(|e| format!("{sql}: {e}"))?;
                    Ok(rows.into_iter().map(|r| r.n).collect())
                };
                let applied = column(conn, "SELECT DISTINCT message AS n FROM effects")?;
                let deliveries = column(conn, "SELECT delivery AS n FROM effects")?;
                let hot = column(conn, "SELECT n FROM hot")?;
                Contents {
                    messages: one(conn, "SELECT count(DISTINCT message) AS n FROM effects")?,
                    doubled: one(
                        conn,
                        "SELECT count(*) AS n FROM (SELECT message FROM effects GROUP BY message \
                         HAVING count(*) > 1) d",
                    )?,
                    effects: one(conn, "SELECT count(*) AS n FROM effects")?,
                    markers: one(
                        conn,
                        "SELECT count(*) AS n FROM inbox WHERE consumer = 'chaos'",
                    )?,
                    claims_completed: one(
                        conn,
                        "SELECT count(*) AS n FROM inbox WHERE consumer = 'chaos-claim' \
                         AND processed_at IS NOT NULL",
                    )?,
                    applied: applied.into_iter().map(|n| n as u64).collect(),
                    deliveries: deliveries.into_iter().map(|n| n as u64).collect(),
                    hot: hot.into_iter().sum(),
                    torn: None,
                }
            }};
        }
        Ok(match self.backend {
            Backend::Sqlite => {
                read!(&mut SqliteConnection::establish(&self.admin_url).map_err(|e| e.to_string())?)
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres | Backend::Failover | Backend::FailoverSync => {
                let mut conn =
                    PgConnection::establish(&self.admin_url).map_err(|e| e.to_string())?;
                let mut contents = read!(&mut conn);
                contents.torn = Some(torn(&mut conn, &contents.applied)?);
                contents
            }
            #[cfg(feature = "mysql")]
            Backend::Mysql | Backend::Galera => {
                read!(&mut MysqlConnection::establish(&self.admin_url).map_err(|e| e.to_string())?)
            }
            #[allow(unreachable_patterns)]
            _ => unreachable!("created above"),
        })
    }
}

impl Drop for Database {
    /// The servers stop before their directory (a field dropped after this) is removed.
    fn drop(&mut self) {
        #[cfg(feature = "mysql")]
        {
            match self.galera.take() {
                Some(galera) => drop(galera),
                None => {
                    if let Some(name) = &self.mysql_db
                        && let Ok(mut conn) = MysqlConnection::establish(&self.admin_url)
                    {
                        let _ = conn.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"));
                    }
                }
            }
        }
        drop(self.private.take());
        drop(self.replica.take());
    }
}

#[derive(QueryableByName)]
#[cfg(feature = "postgres")]
struct Marker {
    #[diesel(sql_type = diesel::sql_types::Text)]
    id: String,
}

/// Transaction-mode messages (even) with an effect but no marker, and markers with no
/// effect: the two are committed together or not at all, a failover included.
#[cfg(feature = "postgres")]
fn torn(conn: &mut PgConnection, applied: &std::collections::HashSet<u64>) -> Result<u64, String> {
    let markers: std::collections::HashSet<String> =
        diesel::sql_query("SELECT message_id::text AS id FROM inbox WHERE consumer = 'chaos'")
            .load::<Marker>(conn)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|m| m.id)
            .collect();
    let with_effect: std::collections::HashSet<String> = applied
        .iter()
        .filter(|m| *m % 2 == 0)
        .map(|m| inbox_diesel::MessageKey::from(*m).stored_id().to_string())
        .collect();
    Ok((markers.symmetric_difference(&with_effect).count()) as u64)
}

/// A PostgreSQL server of this run's own: `initdb` into the run's directory, its own port,
/// as the `postgres` user when this runs as root (the server refuses root).
pub struct PrivatePostgres {
    /// Server options of this run (`-c name=value …`).
    options: String,
    data: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    port: u16,
    bin: PathBuf,
}

#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
impl PrivatePostgres {
    fn start(dir: &Path) -> Result<Self, String> {
        Self::start_with(dir, "")
    }

    fn start_with(dir: &Path, options: &str) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let bin = postgres_bin()?;
        let port = free_port()?;
        let server = PrivatePostgres {
            options: options.to_owned(),
            data: dir.join("pgdata"),
            socket: dir.to_path_buf(),
            log: dir.join("postgres.log"),
            port,
            bin,
        };
        if is_root() {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir))?;
        }
        server.as_owner(&[
            server.bin.join("initdb").to_str().unwrap_or("initdb"),
            "-D",
            server.data.to_str().unwrap_or_default(),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ])?;
        server.start_server()?;
        Ok(server)
    }

    /// A streaming replica of this server in `dir` (`pg_basebackup -R`), started.
    fn replica(&self, dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        if is_root() {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir))?;
        }
        let replica = PrivatePostgres {
            options: String::new(),
            data: dir.join("pgdata"),
            socket: dir.to_path_buf(),
            log: dir.join("postgres.log"),
            port: free_port()?,
            bin: self.bin.clone(),
        };
        let port = self.port.to_string();
        replica.as_owner(&[
            self.bin
                .join("pg_basebackup")
                .to_str()
                .unwrap_or("pg_basebackup"),
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "postgres",
            "-D",
            replica.data.to_str().unwrap_or_default(),
            "-R",
            "-X",
            "stream",
            "--no-sync",
        ])?;
        replica.start_server()?;
        Ok(replica)
    }

    /// The process `query` names (`SELECT pid::int8 AS n FROM …`).
    #[cfg(feature = "postgres")]
    fn pid(&self, query: &str) -> Result<i64, String> {
        let mut conn = PgConnection::establish(&self.url()).map_err(|e| e.to_string())?;
        let rows: Vec<Number> = diesel::sql_query(query)
            .load(&mut conn)
            .map_err(|e| e.to_string())?;
        rows.first()
            .map(|r| r.n)
            .ok_or_else(|| format!("no process for {query}"))
    }

    /// SIGKILL to the server and all its processes at once: nothing is flushed or sent.
    fn power_cut(&self) -> Result<(), String> {
        let pid_file = std::fs::read_to_string(self.data.join("postmaster.pid"))
            .map_err(|e| format!("the server's pid file: {e}"))?;
        let postmaster = pid_file
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        let _ = Command::new("pkill")
            .args(["-9", "-P", &postmaster])
            .status();
        run(Command::new("kill").args(["-9", &postmaster]))
    }

    fn promote(&self) -> Result<(), String> {
        self.as_owner(&[
            self.bin.join("pg_ctl").to_str().unwrap_or("pg_ctl"),
            "-D",
            self.data.to_str().unwrap_or_default(),
            "-w",
            "promote",
        ])
    }

    fn start_server(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 {}",
            self.port,
            self.socket.display(),
            self.options
        );
        self.as_owner(&[
            self.bin.join("pg_ctl").to_str().unwrap_or("pg_ctl"),
            "-D",
            self.data.to_str().unwrap_or_default(),
            "-l",
            self.log.to_str().unwrap_or_default(),
            "-o",
            &options,
            "-w",
            "start",
        ])
    }

    fn stop(&self, mode: &str) -> Result<(), String> {
        self.as_owner(&[
            self.bin.join("pg_ctl").to_str().unwrap_or("pg_ctl"),
            "-D",
            self.data.to_str().unwrap_or_default(),
            "-m",
            mode,
            "-w",
            "stop",
        ])
    }

    fn crash_and_restart(&self) -> Result<(), String> {
        self.stop("immediate")?;
        self.start_server()
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn as_owner(&self, argv: &[&str]) -> Result<(), String> {
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
        run(&mut command)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self.stop("immediate");
    }
}

pub(crate) fn run(command: &mut Command) -> Result<(), String> {
    let output = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    match output.status.success() {
        true => Ok(()),
        false => Err(format!(
            "{command:?}: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )),
    }
}

pub(crate) fn is_root() -> bool {
    std::env::var("USER").is_ok_and(|u| u == "root")
        || Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// `initdb`, `pg_ctl` and `pg_basebackup`: on `PATH`, or Debian's
/// `/usr/lib/postgresql/<version>/bin`.
fn postgres_bin() -> Result<PathBuf, String> {
    if let Ok(path) = std::env::var("PATH") {
        for dir in std::env::split_paths(&path) {
            if ["initdb", "pg_ctl", "pg_basebackup"]
                .iter()
                .all(|tool| dir.join(tool).is_file())
            {
                return Ok(dir);
            }
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| format!("no initdb on PATH, and /usr/lib/postgresql: {e}"))?
        .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").is_file() && bin.join("pg_basebackup").is_file())
        .collect();
    versions.sort();
    versions
        .pop()
        .ok_or_else(|| "no initdb found (install postgresql)".to_owned())
}

/// A port nothing listens on now, below the kernel's range of ephemeral ports: one from that
/// range can be taken by an outgoing connection before the private server binds it (after a
/// crash, its restart on the same port).
pub(crate) fn free_port() -> Result<u16, String> {
    for _ in 0..1000 {
        let port = fastrand::u16(20_000..32_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free port on 127.0.0.1 between 20000 and 32000".into())
}
