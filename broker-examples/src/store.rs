//! The database the consumers write their effects to: an SQLite file in a temporary
//! directory, or the PostgreSQL or MySQL/MariaDB server `DATABASE_URL` names. Each holds the
//! inbox and `effects`, one row per applied message, which the orchestrator counts; a
//! service that publishes also holds an outbox ([`Store::prepare_service`]).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use inbox_diesel::outbox::relay::{Relay, Report as RelayReport, Sink};
use inbox_diesel::outbox::{Message, Outbox};
use inbox_diesel::schema::Backend;
use inbox_diesel::{InboxSchema, MessageKey, Outcome, Settle, Settlement, idempotent};

use crate::events::Event;

diesel::table! {
    /// One row per applied message: a message applied twice shows as two rows.
    effects (message) {
        message -> Text,
        /// The consumer process that applied it.
        consumer -> Text,
    }
}

/// One statement, in SQL every backend takes.
const EFFECTS_TABLE: &str =
    "CREATE TABLE effects (message VARCHAR(64) NOT NULL, consumer VARCHAR(16) NOT NULL)";

/// The PostgreSQL schema or MySQL database the example creates afresh on each run; with
/// `_<service>` after it, the database of each service of an example with several.
const EXAMPLE_DATABASE: &str = "inbox_broker_example";

mod sqlite {
    use diesel::{ConnectionError, SqliteConnection};
    use diesel_async::pooled_connection::ManagerConfig;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

    use super::*;
    pub(super) type Conn = SyncConnectionWrapper<SqliteConnection>;
    include!("store/effects.rs");
    include!("store/outbox.rs");

    /// Connections that wait up to 5 s for another process's lock instead of failing at
    /// once: the orchestrator reads `effects` while the consumers write, and the first
    /// connection after a killed writer may have to recover the WAL index. (Handlers set
    /// their own `busy_timeout`; a handler that waits past it answers a retry.)
    fn manager(url: &str) -> AsyncDieselConnectionManager<Conn> {
        let mut config = ManagerConfig::<Conn>::default();
        config.custom_setup = Box::new(|url| {
            let url = url.to_owned();
            Box::pin(async move {
                let mut conn = Conn::establish(&url).await?;
                conn.batch_execute("PRAGMA busy_timeout = 5000")
                    .await
                    .map_err(ConnectionError::CouldntSetupConfiguration)?;
                Ok(conn)
            })
        });
        AsyncDieselConnectionManager::new_with_config(url, config)
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    pub(super) type Conn = diesel_async::AsyncPgConnection;
    include!("store/effects.rs");
    include!("store/outbox.rs");

    fn manager(url: &str) -> AsyncDieselConnectionManager<Conn> {
        AsyncDieselConnectionManager::new(url)
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    pub(super) type Conn = diesel_async::AsyncMysqlConnection;
    include!("store/effects.rs");
    include!("store/outbox.rs");

    fn manager(url: &str) -> AsyncDieselConnectionManager<Conn> {
        AsyncDieselConnectionManager::new(url)
    }
}

/// Why a handler failed: the inbox's answer — among them no connection from the pool to run
/// it on ([`inbox_diesel::Error::checkout`]).
#[derive(Debug)]
pub enum Failure {
    /// The inbox's error (nothing was committed).
    Inbox(inbox_diesel::Error),
}

impl From<inbox_diesel::Error> for Failure {
    fn from(e: inbox_diesel::Error) -> Self {
        Failure::Inbox(e)
    }
}

/// The inbox's error settles by its class; a pool without a connection is the database's
/// outage (`Reconnect`): the pump pauses and lets one delivery try alone, the others waiting
/// in hand without spending their deliveries.
impl Settle for Failure {
    fn settlement(&self) -> Settlement {
        match self {
            Failure::Inbox(e) => e.settlement(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Inbox(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Failure {}

/// Where a handler publishes: into `outbox`, to `destination`, under `ordering_key` (`""`:
/// none).
#[derive(Debug, Clone, Copy)]
pub struct Publish<'a> {
    pub outbox: &'a Outbox,
    pub destination: &'a str,
    pub ordering_key: &'a str,
}

/// A pool of connections to the example's database, on the backend its URL names.
pub struct Database {
    pool: Pools,
}

enum Pools {
    Sqlite(Pool<sqlite::Conn>),
    #[cfg(feature = "postgres")]
    Postgres(Pool<postgres::Conn>),
    #[cfg(feature = "mysql")]
    Mysql(Pool<mysql::Conn>),
}

impl Database {
    /// A pool of `connections` to the database at `url` (as [`Store::url`] gives it).
    ///
    /// # Errors
    /// The database cannot be reached, or its backend's feature is not enabled.
    pub async fn connect(url: &str, connections: u32) -> Result<Self, String> {
        let pool = match Backend::from_database_url(url) {
            #[cfg(feature = "postgres")]
            Backend::Postgres => Pools::Postgres(postgres::pool(url, connections).await?),
            #[cfg(feature = "mysql")]
            Backend::Mysql => Pools::Mysql(mysql::pool(url, connections).await?),
            Backend::Sqlite => Pools::Sqlite(sqlite::pool(url, connections).await?),
            #[allow(unreachable_patterns)]
            other => return Err(without_feature(other)),
        };
        Ok(Self { pool })
    }

    /// Applies message `message` once, whatever the deliveries: the effect row and the inbox
    /// marker for `key` in one transaction, `pause` before it commits. Prints
    /// [`Event::Handling`] once the row is written.
    ///
    /// # Errors
    /// The inbox's error ([`Failure::Inbox`]), among them no connection from the pool
    /// ([`inbox_diesel::Error::checkout`]).
    pub async fn apply(
        &self,
        key: &MessageKey,
        message: &str,
        consumer: &str,
        pause: Duration,
    ) -> Result<Outcome<()>, Failure> {
        match &self.pool {
            Pools::Sqlite(pool) => sqlite::handle(pool, key, message, consumer, pause).await,
            #[cfg(feature = "postgres")]
            Pools::Postgres(pool) => postgres::handle(pool, key, message, consumer, pause).await,
            #[cfg(feature = "mysql")]
            Pools::Mysql(pool) => mysql::handle(pool, key, message, consumer, pause).await,
        }
    }

    /// Applies message `message` once, as [`apply`](Self::apply) does, and publishes it:
    /// the effect row and a message as `to` says (its payload `message`) are
    /// written in the transaction of the inbox marker, and committed with it after `pause`.
    /// Prints [`Event::Handling`] once both are written.
    ///
    /// # Errors
    /// As [`apply`](Self::apply); and [`Failure::Inbox`] with `Error::Outbox` when the
    /// outbox refuses the message.
    pub async fn apply_and_publish(
        &self,
        key: &MessageKey,
        message: &str,
        consumer: &str,
        pause: Duration,
        to: Publish<'_>,
    ) -> Result<Outcome<()>, Failure> {
        match &self.pool {
            Pools::Sqlite(pool) => {
                sqlite::handle_and_publish(pool, key, message, consumer, pause, to).await
            }
            #[cfg(feature = "postgres")]
            Pools::Postgres(pool) => {
                postgres::handle_and_publish(pool, key, message, consumer, pause, to).await
            }
            #[cfg(feature = "mysql")]
            Pools::Mysql(pool) => {
                mysql::handle_and_publish(pool, key, message, consumer, pause, to).await
            }
        }
    }

    /// Runs `relay` through `sink` on a connection of the pool until `shutdown` completes.
    ///
    /// # Errors
    /// No connection, or a database error in a round (the connection may be broken: run the
    /// relay again; the rows that round claimed are claimed again when their lease ends).
    pub async fn relay<S: Sink>(
        &self,
        relay: &Relay,
        sink: &mut S,
        shutdown: impl Future<Output = ()>,
    ) -> Result<RelayReport, String> {
        match &self.pool {
            Pools::Sqlite(pool) => sqlite::run_relay(pool, relay, sink, shutdown).await,
            #[cfg(feature = "postgres")]
            Pools::Postgres(pool) => postgres::run_relay(pool, relay, sink, shutdown).await,
            #[cfg(feature = "mysql")]
            Pools::Mysql(pool) => mysql::run_relay(pool, relay, sink, shutdown).await,
        }
    }

    /// Updates the planner's statistics of `outbox`'s table (`ANALYZE`), as the server's
    /// own maintenance does once a table has grown: for a bench that fills a fresh table and
    /// reads it at once.
    ///
    /// # Errors
    /// The statement failed.
    pub async fn analyze(&self, outbox: &Outbox) -> Result<(), String> {
        let table = outbox.table();
        match &self.pool {
            Pools::Sqlite(pool) => sqlite::execute(pool, &format!("ANALYZE {table}")).await,
            #[cfg(feature = "postgres")]
            Pools::Postgres(pool) => postgres::execute(pool, &format!("ANALYZE {table}")).await,
            #[cfg(feature = "mysql")]
            Pools::Mysql(pool) => mysql::execute(pool, &format!("ANALYZE TABLE {table}")).await,
        }
    }

    /// The rows of `outbox`, by state.
    ///
    /// # Errors
    /// The query failed.
    pub async fn outbox(&self, outbox: &Outbox) -> Result<OutboxRows, String> {
        let rows = match &self.pool {
            Pools::Sqlite(pool) => sqlite::outbox_rows(pool, outbox).await?,
            #[cfg(feature = "postgres")]
            Pools::Postgres(pool) => postgres::outbox_rows(pool, outbox).await?,
            #[cfg(feature = "mysql")]
            Pools::Mysql(pool) => mysql::outbox_rows(pool, outbox).await?,
        };
        Ok(OutboxRows { rows })
    }

    /// The effect rows written so far.
    ///
    /// # Errors
    /// The query failed.
    pub async fn effects(&self) -> Result<Effects, String> {
        let rows = match &self.pool {
            Pools::Sqlite(pool) => sqlite::applied(pool).await?,
            #[cfg(feature = "postgres")]
            Pools::Postgres(pool) => postgres::applied(pool).await?,
            #[cfg(feature = "mysql")]
            Pools::Mysql(pool) => mysql::applied(pool).await?,
        };
        Ok(Effects { rows })
    }
}

/// The message for a URL whose backend was left out of the build.
fn without_feature(backend: Backend) -> String {
    let (name, feature) = match backend {
        Backend::Postgres => ("PostgreSQL", "postgres"),
        _ => ("MySQL/MariaDB", "mysql"),
    };
    format!(
        "DATABASE_URL is a {name} URL, and this example was built without {name}: \
         run it with `--features inbox-broker-examples/{feature}`"
    )
}

/// Effect rows, by message and consumer.
#[derive(Debug, Clone, Default)]
pub struct Effects {
    rows: Vec<(String, String, i64)>,
}

impl Effects {
    /// How many rows each message has.
    pub fn per_message(&self) -> BTreeMap<&str, i64> {
        let mut counts = BTreeMap::new();
        for (message, _, n) in &self.rows {
            *counts.entry(message.as_str()).or_default() += n;
        }
        counts
    }

    /// How many rows each consumer wrote.
    pub fn per_consumer(&self) -> BTreeMap<&str, i64> {
        let mut counts = BTreeMap::new();
        for (_, consumer, n) in &self.rows {
            *counts.entry(consumer.as_str()).or_default() += n;
        }
        counts
    }
}

/// Where an outbox row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxState {
    /// Not sent yet (or sent, and not marked: a relay stopped between the two).
    Waiting,
    /// Sent, and marked sent.
    Sent,
    /// Refused by the broker `max_attempts` times: waits for an operator.
    Parked,
}

/// One outbox row: the message it carries (its payload) and its state.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    /// The payload, as text.
    pub message: String,
    /// Its state.
    pub state: OutboxState,
}

/// An outbox's rows.
#[derive(Debug, Clone, Default)]
pub struct OutboxRows {
    rows: Vec<OutboxRow>,
}

impl OutboxRows {
    /// How many rows carry each message.
    pub fn per_message(&self) -> BTreeMap<&str, u64> {
        let mut counts = BTreeMap::new();
        for row in &self.rows {
            *counts.entry(row.message.as_str()).or_default() += 1;
        }
        counts
    }

    /// How many rows are in `state`.
    pub fn count(&self, state: OutboxState) -> u64 {
        self.rows.iter().filter(|row| row.state == state).count() as u64
    }

    /// How many rows there are.
    pub fn len(&self) -> u64 {
        self.rows.len() as u64
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// The example's database, created afresh: the inbox and `effects`, and an outbox for a
/// service that publishes.
pub struct Store {
    database: Database,
    url: String,
    shown: String,
    /// The SQLite file's directory, removed with the store.
    _dir: Option<tempfile::TempDir>,
}

impl Store {
    /// The database `DATABASE_URL` names — an SQLite file in a temporary directory when it
    /// is unset — with the inbox and `effects` created afresh: on PostgreSQL in the schema
    /// `inbox_broker_example`, on MySQL/MariaDB in the database `inbox_broker_example`
    /// (both dropped first if an earlier run left them).
    ///
    /// # Errors
    /// The database cannot be reached or set up; the URL names a backend this build has no
    /// feature for.
    pub async fn prepare() -> Result<Self, String> {
        Self::prepare_as("effects", EXAMPLE_DATABASE, None, false).await
    }

    /// The database of `service`, for an example with one database per service: as
    /// [`prepare`](Self::prepare) gives it, with `outbox`'s table too when it is given, in
    /// the SQLite file `<service>.sqlite` in a temporary directory of its own, or the
    /// database `inbox_broker_example_<service>` on the PostgreSQL or MySQL/MariaDB server
    /// of `DATABASE_URL` (dropped first if an earlier run left it). On PostgreSQL a database
    /// and not a schema: the inbox refuses tables named `inbox` in two schemas of one
    /// database, where the `search_path` decides which one a handler uses.
    ///
    /// # Errors
    /// As [`prepare`](Self::prepare).
    pub async fn prepare_service(service: &str, outbox: Option<&Outbox>) -> Result<Self, String> {
        let database = format!("{EXAMPLE_DATABASE}_{service}");
        Self::prepare_as(service, &database, outbox, true).await
    }

    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    async fn prepare_as(
        file: &str,
        database: &str,
        outbox: Option<&Outbox>,
        own_database: bool,
    ) -> Result<Self, String> {
        let url = std::env::var("DATABASE_URL").unwrap_or_default();
        if url.is_empty() {
            return Self::sqlite(file, outbox).await;
        }
        match Backend::from_database_url(&url) {
            #[cfg(feature = "postgres")]
            Backend::Postgres => Self::postgres(&url, database, outbox, own_database).await,
            #[cfg(feature = "mysql")]
            Backend::Mysql => Self::mysql(&url, database, outbox).await,
            Backend::Sqlite => Err(format!(
                "DATABASE_URL={url}: the example runs on SQLite (DATABASE_URL unset), \
                 PostgreSQL (postgres://…) or MySQL/MariaDB (mysql://…)"
            )),
            #[allow(unreachable_patterns)]
            other => Err(without_feature(other)),
        }
    }

    async fn sqlite(file: &str, outbox: Option<&Outbox>) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
        let path = dir
            .path()
            .join(format!("{file}.sqlite"))
            .display()
            .to_string();
        let mut conn = sqlite::Conn::establish(&path)
            .await
            .map_err(|e| format!("create {path}: {e}"))?;
        // Two processes write the file: WAL lets the orchestrator read while they do. The
        // handlers wait for each other's write lock (the inbox sets `busy_timeout`); one
        // that waits too long answers a retry, and the message is redelivered.
        for statement in [
            "PRAGMA journal_mode = WAL",
            &inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT),
            EFFECTS_TABLE,
        ]
        .into_iter()
        .map(str::to_owned)
        .chain(outbox.map(|outbox| outbox.create_table_sql(Backend::Sqlite)))
        {
            conn.batch_execute(&statement)
                .await
                .map_err(|e| format!("set up {path}: {e}"))?;
        }
        Ok(Self {
            database: Database::connect(&path, 1).await?,
            shown: format!("SQLite {path}"),
            url: path,
            _dir: Some(dir),
        })
    }

    #[cfg(feature = "postgres")]
    /// The schema `name` in the database of `url`, or with `own_database` the database
    /// `name` on its server.
    async fn postgres(
        url: &str,
        name: &str,
        outbox: Option<&Outbox>,
        own_database: bool,
    ) -> Result<Self, String> {
        let shown = crate::without_password(url);
        let mut conn = postgres::Conn::establish(url)
            .await
            .map_err(|e| format!("connect to {shown}: {e}"))?;
        let (url, shown) = if own_database {
            // One statement per call: PostgreSQL runs neither in a transaction block.
            for statement in [
                format!("DROP DATABASE IF EXISTS {name}"),
                format!("CREATE DATABASE {name}"),
            ] {
                conn.batch_execute(&statement)
                    .await
                    .map_err(|e| format!("{statement} on {shown}: {e}"))?;
            }
            let url = with_database(url, name);
            let shown = crate::without_password(&url);
            (url, shown)
        } else {
            conn.batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name};"
            ))
            .await
            .map_err(|e| format!("create the schema {name} on {shown}: {e}"))?;
            let url = format!(
                "{url}{}options=-csearch_path%3D{name}",
                if url.contains('?') { '&' } else { '?' }
            );
            (url, format!("{shown}, schema {name}"))
        };
        let mut conn = postgres::Conn::establish(&url)
            .await
            .map_err(|e| format!("connect to {shown}: {e}"))?;
        for statement in [
            inbox_diesel::schema::postgres::create_table_sql(&InboxSchema::DEFAULT),
            EFFECTS_TABLE.to_owned(),
        ]
        .into_iter()
        .chain(outbox.map(|outbox| outbox.create_table_sql(Backend::Postgres)))
        {
            conn.batch_execute(&statement)
                .await
                .map_err(|e| format!("set up {shown}: {e}"))?;
        }
        Ok(Self {
            database: Database::connect(&url, 1).await?,
            shown: format!("PostgreSQL {shown}"),
            url,
            _dir: None,
        })
    }

    #[cfg(feature = "mysql")]
    async fn mysql(url: &str, database: &str, outbox: Option<&Outbox>) -> Result<Self, String> {
        let shown = crate::without_password(url);
        let mut conn = mysql::Conn::establish(url)
            .await
            .map_err(|e| format!("connect to {shown}: {e}"))?;
        for statement in [
            format!("DROP DATABASE IF EXISTS {database}"),
            format!("CREATE DATABASE {database}"),
        ] {
            conn.batch_execute(&statement)
                .await
                .map_err(|e| format!("{statement} on {shown}: {e}"))?;
        }
        let url = with_database(url, database);
        let mut conn = mysql::Conn::establish(&url)
            .await
            .map_err(|e| format!("connect to {}: {e}", crate::without_password(&url)))?;
        // One statement per call: MySQL runs no multi-statement strings here.
        for statement in [
            inbox_diesel::schema::mysql::create_table_sql(&InboxSchema::DEFAULT),
            EFFECTS_TABLE.to_owned(),
        ]
        .into_iter()
        .chain(outbox.map(|outbox| outbox.create_table_sql(Backend::Mysql)))
        {
            conn.batch_execute(&statement)
                .await
                .map_err(|e| format!("set up {shown}: {e}"))?;
        }
        Ok(Self {
            database: Database::connect(&url, 1).await?,
            shown: format!("MySQL/MariaDB {}", crate::without_password(&url)),
            url,
            _dir: None,
        })
    }

    /// Where the consumers connect: pass it to [`Database::connect`].
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database, for people (no password).
    pub fn describe(&self) -> &str {
        &self.shown
    }

    /// The effect rows written so far.
    ///
    /// # Errors
    /// The query failed.
    pub async fn effects(&self) -> Result<Effects, String> {
        self.database.effects().await
    }

    /// The rows of `outbox` (given to [`prepare_service`](Self::prepare_service)).
    ///
    /// # Errors
    /// The query failed.
    pub async fn outbox(&self, outbox: &Outbox) -> Result<OutboxRows, String> {
        self.database.outbox(outbox).await
    }
}

/// `url` with its database replaced by `database`, its query kept.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn with_database(url: &str, database: &str) -> String {
    let (path, query) = match url.split_once('?') {
        Some((path, query)) => (path, format!("?{query}")),
        None => (url, String::new()),
    };
    let server = match path.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('/') {
            Some((host, _)) => format!("{scheme}://{host}"),
            None => path.to_owned(),
        },
        None => path.to_owned(),
    };
    format!("{server}/{database}{query}")
}
