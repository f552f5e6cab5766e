//! A three-node MariaDB Galera cluster of the run's own: private data directories and ports,
//! Debian's `galera-4` provider, rsync state transfer. The nodes run as the `mysql` user when
//! this runs as root (rsync's state-transfer daemon drops root and could not read root's
//! files). Node 1 starts the cluster (`--wsrep-new-cluster`); the others join it by its
//! `gcomm://` address and copy its state. A node killed with SIGKILL joins again when it is
//! started again, and catches up by incremental or full state transfer.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;

const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

struct Node {
    dir: PathBuf,
    port: u16,
    group_port: u16,
    ist_port: u16,
    sst_port: u16,
    child: Option<Child>,
}

pub struct Galera {
    nodes: Vec<Node>,
    root: bool,
}

impl Galera {
    /// Starts the cluster's three nodes in `dir`, one after the other, each ready (synced)
    /// before the next.
    pub fn start(dir: &Path) -> Result<Self, String> {
        if !Path::new(PROVIDER).is_file() {
            return Err(format!(
                "no Galera provider at {PROVIDER} (Debian: galera-4)"
            ));
        }
        let root = crate::server::is_root();
        let mut nodes = Vec::new();
        for n in 1..=3 {
            let dir = dir.join(format!("node{n}"));
            std::fs::create_dir_all(dir.join("data")).map_err(|e| e.to_string())?;
            // A tmpdir of its own: a server starting removes the `#sql…` files in its tmpdir,
            // and in the shared /tmp those may be the shared server's, in use.
            std::fs::create_dir_all(dir.join("tmp")).map_err(|e| e.to_string())?;
            nodes.push(Node {
                dir,
                port: crate::server::free_port()?,
                group_port: crate::server::free_port()?,
                ist_port: crate::server::free_port()?,
                sst_port: crate::server::free_port()?,
                child: None,
            });
        }
        if root {
            crate::server::run(Command::new("chown").args(["-R", "mysql:mysql"]).arg(dir))?;
        }
        let user = if root { "--user=mysql" } else { "--user=root" };
        crate::server::run(
            Command::new("mariadb-install-db")
                .env("TMPDIR", nodes[0].dir.join("tmp"))
                .arg("--no-defaults")
                .arg(format!("--datadir={}", nodes[0].dir.join("data").display()))
                .args([
                    user,
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ]),
        )?;
        let mut galera = Galera { nodes, root };
        for n in 0..3 {
            galera.spawn(n, n == 0)?;
        }
        Ok(galera)
    }

    fn cluster_address(&self) -> String {
        let peers: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.group_port))
            .collect();
        format!("gcomm://{}", peers.join(","))
    }

    /// Starts node `n` and waits until it is synced with the cluster. A joiner that neither
    /// syncs nor exits within its time (a state transfer stalled on a loaded machine) is
    /// killed and started once more before the start fails with its log.
    fn spawn(&mut self, n: usize, new_cluster: bool) -> Result<(), String> {
        match self.spawn_once(n, new_cluster) {
            Err(first) if !new_cluster => {
                eprintln!("{first}\nstarting Galera node {} once more", n + 1);
                self.kill(n);
                self.spawn_once(n, false)
            }
            other => other,
        }
    }

    fn spawn_once(&mut self, n: usize, new_cluster: bool) -> Result<(), String> {
        let address = self.cluster_address();
        let user = if self.root {
            "--user=mysql"
        } else {
            "--user=root"
        };
        let node = &mut self.nodes[n];
        let mut command = Command::new("mariadbd");
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", node.dir.join("data").display()))
            .arg(format!("--tmpdir={}", node.dir.join("tmp").display()))
            .arg(format!("--port={}", node.port))
            .arg(format!("--socket={}", node.dir.join("sock").display()))
            .arg(format!("--pid-file={}", node.dir.join("pid").display()))
            .arg(format!("--log-error={}", node.dir.join("error.log").display()))
            .args([
                user,
                "--bind-address=127.0.0.1",
                "--innodb-buffer-pool-size=32M",
                "--binlog-format=ROW",
                "--default-storage-engine=InnoDB",
                "--innodb-autoinc-lock-mode=2",
                "--wsrep-on=ON",
                "--wsrep-sst-method=rsync",
                "--wsrep-node-address=127.0.0.1",
                "--wsrep-cluster-name=inbox-chaos",
            ])
            // Causal reads: a node waits until it has applied what the cluster committed
            // before it reads (RELIABILITY.md). `INBOX_CHAOS_WSREP_SYNC_WAIT=0` runs the
            // nodes with the server's default instead.
            .arg(format!(
                "--wsrep-sync-wait={}",
                std::env::var("INBOX_CHAOS_WSREP_SYNC_WAIT").unwrap_or_else(|_| "1".into())
            ))
            .arg(format!("--wsrep-provider={PROVIDER}"))
            .arg(format!("--wsrep-cluster-address={address}"))
            .arg(format!("--wsrep-node-name=node{}", n + 1))
            .arg(format!("--wsrep-sst-receive-address=127.0.0.1:{}", node.sst_port))
            .arg(format!(
                "--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{};ist.recv_addr=127.0.0.1:{}",
                node.group_port, node.ist_port
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if new_cluster {
            command.arg("--wsrep-new-cluster");
        }
        node.child = Some(
            command
                .spawn()
                .map_err(|e| format!("start mariadbd: {e}"))?,
        );
        let url = self.url(n, "mysql");
        let log = self.nodes[n].dir.join("error.log");
        let started = Instant::now();
        loop {
            if let Ok(mut conn) = MysqlConnection::establish(&url)
                && synced(&mut conn)
            {
                return Ok(());
            }
            let exited = self.nodes[n]
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if exited.is_some() || started.elapsed() > Duration::from_secs(180) {
                return Err(format!(
                    "Galera node {} {}; its log:\n{}",
                    n + 1,
                    match exited {
                        Some(status) => format!("exited ({status}) before it synced"),
                        None => "did not sync within three minutes".into(),
                    },
                    std::fs::read_to_string(&log).unwrap_or_default()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGKILLs node `n`, as a crash would.
    pub fn kill(&mut self, n: usize) {
        if let Some(mut child) = self.nodes[n].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `n` again: it joins the cluster and catches up.
    pub fn rejoin(&mut self, n: usize) -> Result<(), String> {
        self.spawn(n, false)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Node `n`'s database `db` as root.
    pub fn url(&self, n: usize, db: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{db}", self.nodes[n].port)
    }

    /// Every node's URL, separated by spaces, starting at node `first`: what a consumer
    /// connects to, moving on to the next node while one is down.
    pub fn urls(&self, first: usize, db: &str) -> String {
        (0..self.nodes.len())
            .map(|k| self.url((first + k) % self.nodes.len(), db))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl Drop for Galera {
    fn drop(&mut self) {
        for n in 0..self.nodes.len() {
            self.kill(n);
        }
    }
}

#[derive(QueryableByName)]
struct Status {
    #[diesel(sql_type = diesel::sql_types::Text)]
    #[diesel(column_name = Value)]
    value: String,
}

/// Whether the node's state is synced with the cluster's (`wsrep_local_state_comment`).
fn synced(conn: &mut MysqlConnection) -> bool {
    diesel::sql_query("SHOW STATUS LIKE 'wsrep_local_state_comment'")
        .load::<Status>(conn)
        .ok()
        .and_then(|rows| rows.into_iter().next())
        .is_some_and(|row| row.value == "Synced")
        && conn.batch_execute("SELECT 1").is_ok()
}
