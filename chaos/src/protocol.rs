//! What the orchestrator and its consumer processes say to each other, one line each way
//! per delivery: `D <delivery> <message> <fault>` in; `R` (ready), `A <delivery> <outcome>`
//! (acknowledged) and `N <delivery> <class>` (not: redeliver) out.

use std::fmt;
use std::str::FromStr;

/// What the body is asked to do besides its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    None,
    /// Panics after its write.
    Panic,
    /// Returns an error after its write.
    Error,
    /// Sleeps 20 ms after its write: a window for kills and cuts.
    Slow,
    /// Runs into a statement timeout (PostgreSQL; elsewhere, `Slow`).
    Timeout,
    /// Async consumers: the call is cut off by a timeout of 1–15 ms (sync ones: `Slow`).
    Cancel,
}

impl Fault {
    pub const ALL: [Fault; 6] = [
        Fault::None,
        Fault::Panic,
        Fault::Error,
        Fault::Slow,
        Fault::Timeout,
        Fault::Cancel,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Panic => "panic",
            Fault::Error => "error",
            Fault::Slow => "slow",
            Fault::Timeout => "timeout",
            Fault::Cancel => "cancel",
        }
    }
}

impl FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Fault::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("unknown fault {s:?}"))
    }
}

/// One delivery of one copy of a message.
#[derive(Debug, Clone, Copy)]
pub struct Delivery {
    pub id: u64,
    pub message: u64,
    pub fault: Fault,
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "D {} {} {}", self.id, self.message, self.fault.name())
    }
}

impl FromStr for Delivery {
    type Err = String;
    fn from_str(line: &str) -> Result<Self, String> {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["D", id, message, fault] => Ok(Delivery {
                id: id.parse().map_err(|e| format!("{line:?}: {e}"))?,
                message: message.parse().map_err(|e| format!("{line:?}: {e}"))?,
                fault: fault.parse()?,
            }),
            _ => Err(format!("not a delivery: {line:?}")),
        }
    }
}

/// A consumer's line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Ready,
    Ack { delivery: u64, outcome: String },
    Nack { delivery: u64, class: String },
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Answer::Ready => write!(f, "R"),
            Answer::Ack { delivery, outcome } => write!(f, "A {delivery} {outcome}"),
            Answer::Nack { delivery, class } => write!(f, "N {delivery} {class}"),
        }
    }
}

impl FromStr for Answer {
    type Err = String;
    fn from_str(line: &str) -> Result<Self, String> {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let id = |s: &str| s.parse::<u64>().map_err(|e| format!("{line:?}: {e}"));
        match parts.as_slice() {
            ["R"] => Ok(Answer::Ready),
            ["A", delivery, outcome] => Ok(Answer::Ack {
                delivery: id(delivery)?,
                outcome: (*outcome).to_owned(),
            }),
            ["N", delivery, class] => Ok(Answer::Nack {
                delivery: id(delivery)?,
                class: (*class).to_owned(),
            }),
            _ => Err(format!("not an answer: {line:?}")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    Mysql,
    /// MariaDB Galera: three nodes of the run's own; the consumers run the MySQL handlers.
    Galera,
    /// A private PostgreSQL primary with a streaming replica, asynchronous: the primary is
    /// crashed once and the replica promoted.
    Failover,
    /// The same with synchronous replication (`synchronous_standby_names = '*'`).
    FailoverSync,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
            Backend::Galera => "galera",
            Backend::Failover => "failover",
            Backend::FailoverSync => "failover-sync",
        }
    }
}

impl FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sqlite" => Ok(Backend::Sqlite),
            "postgres" => Ok(Backend::Postgres),
            "mysql" | "mariadb" => Ok(Backend::Mysql),
            "galera" => Ok(Backend::Galera),
            "failover" => Ok(Backend::Failover),
            "failover-sync" => Ok(Backend::FailoverSync),
            _ => Err(format!(
                "unknown backend {s:?} (sqlite, postgres, mysql, galera, failover, failover-sync)"
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Sync,
    Async,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Sync => "sync",
            Mode::Async => "async",
        }
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sync" => Ok(Mode::Sync),
            "async" => Ok(Mode::Async),
            _ => Err(format!("unknown mode {s:?} (sync, async)")),
        }
    }
}
