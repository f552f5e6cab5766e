//! The database the consumers write their effects to: an SQLite file in a temporary
//! directory, or the PostgreSQL or MySQL/MariaDB server `DATABASE_URL` names. Each holds the
//! inbox and `effects`, one row per applied message, which the orchestrator counts.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use inbox_diesel::schema::Backend;
use inbox_diesel::{Action, InboxSchema, MessageKey, Outcome, Settle, Settlement, idempotent};

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

/// The PostgreSQL schema or MySQL database the example creates afresh on each run.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const EXAMPLE_DATABASE: &str = "inbox_broker_example";

mod sqlite {
    use diesel::{ConnectionError, SqliteConnection};
    use diesel_async::pooled_connection::ManagerConfig;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

    use super::*;
    pub(super) type Conn = SyncConnectionWrapper<SqliteConnection>;
    include!("store/effects.rs");

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

    fn manager(url: &str) -> AsyncDieselConnectionManager<Conn> {
        AsyncDieselConnectionManager::new(url)
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    pub(super) type Conn = diesel_async::AsyncMysqlConnection;
    include!("store/effects.rs");

    fn manager(url: &str) -> AsyncDieselConnectionManager<Conn> {
        AsyncDieselConnectionManager::new(url)
    }
}

/// Why a handler failed: the inbox's answer, or no connection to run it on.
#[derive(Debug)]
pub enum Failure {
    /// The inbox's error (nothing was committed).
    Inbox(inbox_diesel::Error),
    /// The pool gave no connection in time.
    Pool(String),
}

impl From<inbox_diesel::Error> for Failure {
    fn from(e: inbox_diesel::Error) -> Self {
        Failure::Inbox(e)
    }
}

/// The inbox's error settles by its class; a pool without a connection is retried later.
impl Settle for Failure {
    fn settlement(&self) -> Settlement {
        match self {
            Failure::Inbox(e) => e.settlement(),
            Failure::Pool(_) => Action::RetryLater.settlement(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Inbox(e) => write!(f, "{e}"),
            Failure::Pool(e) => write!(f, "no database connection: {e}"),
        }
    }
}

impl std::error::Error for Failure {}

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
    /// The inbox's error ([`Failure::Inbox`]), or no connection ([`Failure::Pool`]).
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

/// The example's database, created afresh: the inbox and `effects`, nothing else.
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
        let url = std::env::var("DATABASE_URL").unwrap_or_default();
        if url.is_empty() {
            return Self::sqlite().await;
        }
        match Backend::from_database_url(&url) {
            #[cfg(feature = "postgres")]
            Backend::Postgres => Self::postgres(&url).await,
            #[cfg(feature = "mysql")]
            Backend::Mysql => Self::mysql(&url).await,
            Backend::Sqlite => Err(format!(
                "DATABASE_URL={url}: the example runs on SQLite (DATABASE_URL unset), \
                 PostgreSQL (postgres://…) or MySQL/MariaDB (mysql://…)"
            )),
            #[allow(unreachable_patterns)]
            other => Err(without_feature(other)),
        }
    }

    async fn sqlite() -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
        let path = dir.path().join("effects.sqlite").display().to_string();
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
        ] {
            conn.batch_execute(statement)
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
    async fn postgres(url: &str) -> Result<Self, String> {
        let shown = crate::without_password(url);
        let mut conn = postgres::Conn::establish(url)
            .await
            .map_err(|e| format!("connect to {shown}: {e}"))?;
        conn.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {EXAMPLE_DATABASE} CASCADE; CREATE SCHEMA {EXAMPLE_DATABASE};"
        ))
        .await
        .map_err(|e| format!("create the schema {EXAMPLE_DATABASE} on {shown}: {e}"))?;
        let url = format!(
            "{url}{}options=-csearch_path%3D{EXAMPLE_DATABASE}",
            if url.contains('?') { '&' } else { '?' }
        );
        let mut conn = postgres::Conn::establish(&url)
            .await
            .map_err(|e| format!("connect to {shown}: {e}"))?;
        for statement in [
            &inbox_diesel::schema::postgres::create_table_sql(&InboxSchema::DEFAULT),
            EFFECTS_TABLE,
        ] {
            conn.batch_execute(statement)
                .await
                .map_err(|e| format!("set up {shown}: {e}"))?;
        }
        Ok(Self {
            database: Database::connect(&url, 1).await?,
            shown: format!("PostgreSQL {shown}, schema {EXAMPLE_DATABASE}"),
            url,
            _dir: None,
        })
    }

    #[cfg(feature = "mysql")]
    async fn mysql(url: &str) -> Result<Self, String> {
        let shown = crate::without_password(url);
        let mut conn = mysql::Conn::establish(url)
            .await
            .map_err(|e| format!("connect to {shown}: {e}"))?;
        for statement in [
            format!("DROP DATABASE IF EXISTS {EXAMPLE_DATABASE}"),
            format!("CREATE DATABASE {EXAMPLE_DATABASE}"),
        ] {
            conn.batch_execute(&statement)
                .await
                .map_err(|e| format!("{statement} on {shown}: {e}"))?;
        }
        let url = with_database(url, EXAMPLE_DATABASE);
        let mut conn = mysql::Conn::establish(&url)
            .await
            .map_err(|e| format!("connect to {}: {e}", crate::without_password(&url)))?;
        // One statement per call: MySQL runs no multi-statement strings here.
        for statement in [
            &inbox_diesel::schema::mysql::create_table_sql(&InboxSchema::DEFAULT),
            EFFECTS_TABLE,
        ] {
            conn.batch_execute(statement)
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
}

/// `url` with its database replaced by `database`, its query kept.
#[cfg(feature = "mysql")]
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
