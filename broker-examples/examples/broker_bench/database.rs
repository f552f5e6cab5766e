//! The effects' databases: the handler on SQLite and on PostgreSQL, where the runs keep
//! their effects, and one run's database.

use std::sync::Mutex;

use diesel::{AggregateExpressionMethods, ExpressionMethods, QueryDsl};
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::{AsyncConnection, SimpleAsyncConnection};
use inbox_broker_examples::store::Failure;
use inbox_broker_examples::without_password;
use inbox_diesel::{InboxSchema, MessageKey, Outcome, idempotent};

diesel::table! {
    /// One row per applied message: a message applied twice shows as two rows.
    effects (message) {
        message -> Text,
    }
}

/// No key: a message applied twice must be able to leave two rows.
const EFFECTS_TABLE: &str = "CREATE TABLE effects (message VARCHAR(64) NOT NULL)";

mod sqlite {
    use diesel::{ConnectionError, SqliteConnection};
    use diesel_async::RunQueryDsl;
    use diesel_async::pooled_connection::ManagerConfig;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

    use super::*;

    pub(super) type Conn = SyncConnectionWrapper<SqliteConnection>;

    /// The handler every variant calls: the effect and the marker in one transaction.
    #[idempotent(consumer = "broker-bench", key = key)]
    async fn apply(
        conn: &mut Conn,
        key: &MessageKey,
        message: &str,
    ) -> Result<(), inbox_diesel::Error> {
        diesel::insert_into(effects::table)
            .values(effects::message.eq(message))
            .execute(conn)
            .await?;
        Ok(())
    }

    pub(super) async fn handle(
        pool: &Pool<Conn>,
        key: &MessageKey,
        message: &str,
    ) -> Result<Outcome<()>, Failure> {
        let mut conn = pool.get().await.map_err(inbox_diesel::Error::checkout)?;
        Ok(apply(&mut conn, key, message).await?)
    }

    /// A new database file at `path` — WAL, the inbox and `effects` — and a pool on it.
    pub(super) async fn fresh(path: &str, connections: u32) -> Result<Pool<Conn>, String> {
        let mut conn = Conn::establish(path)
            .await
            .map_err(|e| format!("create {path}: {e}"))?;
        for statement in [
            "PRAGMA journal_mode = WAL",
            &inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT),
            EFFECTS_TABLE,
        ] {
            conn.batch_execute(statement)
                .await
                .map_err(|e| format!("set up {path}: {e}"))?;
        }
        // As the inbox's own benchmarks run SQLite: WAL with `synchronous = NORMAL`, which
        // syncs at checkpoints rather than at every commit (a per-connection setting).
        let mut config = ManagerConfig::<Conn>::default();
        config.custom_setup = Box::new(|url| {
            let url = url.to_owned();
            Box::pin(async move {
                let mut conn = Conn::establish(&url).await?;
                conn.batch_execute("PRAGMA synchronous = NORMAL")
                    .await
                    .map_err(ConnectionError::CouldntSetupConfiguration)?;
                Ok(conn)
            })
        });
        let manager = AsyncDieselConnectionManager::new_with_config(path, config);
        pool(manager, connections).await
    }

    pub(super) async fn effects(pool: &Pool<Conn>) -> Result<(i64, i64), String> {
        let mut conn = pool.get().await.map_err(|e| e.to_string())?;
        count_effects(&mut conn).await
    }

    async fn count_effects(conn: &mut Conn) -> Result<(i64, i64), String> {
        let rows = effects::table.count().get_result(conn).await;
        let distinct = effects::table
            .select(diesel::dsl::count(effects::message).aggregate_distinct())
            .get_result(conn)
            .await;
        rows.and_then(|rows| distinct.map(|distinct| (rows, distinct)))
            .map_err(|e| format!("count the effects: {e}"))
    }

    async fn pool(
        manager: AsyncDieselConnectionManager<Conn>,
        connections: u32,
    ) -> Result<Pool<Conn>, String> {
        Pool::builder()
            .max_size(connections)
            .min_idle(Some(connections))
            .test_on_check_out(false)
            .build(manager)
            .await
            .map_err(|e| format!("connect: {e}"))
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use diesel_async::RunQueryDsl;

    use super::*;

    pub(super) type Conn = diesel_async::AsyncPgConnection;

    /// The schema each run creates afresh.
    const SCHEMA: &str = "inbox_broker_bench";

    /// The handler every variant calls: the effect and the marker in one transaction.
    #[idempotent(consumer = "broker-bench", key = key)]
    async fn apply(
        conn: &mut Conn,
        key: &MessageKey,
        message: &str,
    ) -> Result<(), inbox_diesel::Error> {
        diesel::insert_into(effects::table)
            .values(effects::message.eq(message))
            .execute(conn)
            .await?;
        Ok(())
    }

    pub(super) async fn handle(
        pool: &Pool<Conn>,
        key: &MessageKey,
        message: &str,
    ) -> Result<Outcome<()>, Failure> {
        let mut conn = pool.get().await.map_err(inbox_diesel::Error::checkout)?;
        Ok(apply(&mut conn, key, message).await?)
    }

    /// The schema `inbox_broker_bench` dropped and created again with the inbox and
    /// `effects`, and a pool whose connections use it.
    pub(super) async fn fresh(url: &str, connections: u32) -> Result<Pool<Conn>, String> {
        let shown = without_password(url);
        let mut conn = Conn::establish(url)
            .await
            .map_err(|e| format!("connect to {shown}: {e}"))?;
        conn.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA};"
        ))
        .await
        .map_err(|e| format!("create the schema {SCHEMA} on {shown}: {e}"))?;
        let url = format!(
            "{url}{}options=-csearch_path%3D{SCHEMA}",
            if url.contains('?') { '&' } else { '?' }
        );
        let mut conn = Conn::establish(&url)
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
        Pool::builder()
            .max_size(connections)
            .min_idle(Some(connections))
            .test_on_check_out(false)
            .build(AsyncDieselConnectionManager::new(url))
            .await
            .map_err(|e| format!("connect to {shown}: {e}"))
    }

    pub(super) async fn effects(pool: &Pool<Conn>) -> Result<(i64, i64), String> {
        let mut conn = pool.get().await.map_err(|e| e.to_string())?;
        let rows = effects::table.count().get_result(&mut conn).await;
        let distinct = effects::table
            .select(diesel::dsl::count(effects::message).aggregate_distinct())
            .get_result(&mut conn)
            .await;
        rows.and_then(|rows| distinct.map(|distinct| (rows, distinct)))
            .map_err(|e| format!("count the effects: {e}"))
    }
}

/// Where the runs keep their effects: `DATABASE_URL`, or SQLite files in a temporary
/// directory; with `--no-database`, nowhere.
pub(crate) enum Target {
    Sqlite(tempfile::TempDir),
    #[cfg(feature = "postgres")]
    Postgres(String),
    /// The handler only notes the message's id in memory: the ceiling that the broker, its
    /// client and the adapter allow.
    Memory,
}

impl Target {
    pub(crate) fn from_env(no_database: bool) -> Result<Self, String> {
        if no_database {
            return Ok(Target::Memory);
        }
        let url = std::env::var("DATABASE_URL").unwrap_or_default();
        if url.is_empty() {
            let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
            return Ok(Target::Sqlite(dir));
        }
        #[cfg(feature = "postgres")]
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Target::Postgres(url));
        }
        Err(format!(
            "DATABASE_URL={}: the bench runs on SQLite (DATABASE_URL unset) or PostgreSQL \
             (postgres://…, built with `--features inbox-broker-examples/postgres`)",
            without_password(&url)
        ))
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Target::Sqlite(dir) => format!(
                "SQLite (bundled, WAL), a new file per run in {}",
                dir.path().display()
            ),
            #[cfg(feature = "postgres")]
            Target::Postgres(url) => format!(
                "PostgreSQL {}, schema inbox_broker_bench created afresh per run",
                without_password(url)
            ),
            Target::Memory => "no database: the handler notes the message's id in memory and \
                               answers Processed"
                .to_owned(),
        }
    }

    /// The pool size when `--connections` is not given: SQLite takes one writer at a time,
    /// so more connections would only wait on its lock.
    pub(crate) fn default_connections(&self) -> u32 {
        match self {
            Target::Sqlite(_) => 1,
            #[cfg(feature = "postgres")]
            Target::Postgres(_) => 16,
            Target::Memory => 1,
        }
    }

    /// A database of its own for run `run`: the inbox and `effects`, empty.
    pub(crate) async fn fresh(&self, run: usize, connections: u32) -> Result<Database, String> {
        match self {
            Target::Sqlite(dir) => {
                let path = dir.path().join(format!("run-{run}.sqlite"));
                let pool = sqlite::fresh(&path.display().to_string(), connections).await?;
                Ok(Database::Sqlite(pool, path))
            }
            #[cfg(feature = "postgres")]
            Target::Postgres(url) => {
                Ok(Database::Postgres(postgres::fresh(url, connections).await?))
            }
            Target::Memory => Ok(Database::Memory(Mutex::default())),
        }
    }
}

/// One run's database.
pub(crate) enum Database {
    Sqlite(Pool<sqlite::Conn>, std::path::PathBuf),
    #[cfg(feature = "postgres")]
    Postgres(Pool<postgres::Conn>),
    /// The ids of the messages handled.
    Memory(Mutex<Vec<String>>),
}

impl Database {
    pub(crate) async fn apply(
        &self,
        key: &MessageKey,
        message: &str,
    ) -> Result<Outcome<()>, Failure> {
        match self {
            Database::Sqlite(pool, _) => sqlite::handle(pool, key, message).await,
            #[cfg(feature = "postgres")]
            Database::Postgres(pool) => postgres::handle(pool, key, message).await,
            Database::Memory(handled) => {
                handled
                    .lock()
                    .expect("not poisoned")
                    .push(message.to_owned());
                Ok(Outcome::Processed(()))
            }
        }
    }

    /// The effect rows, and the messages they are for.
    pub(crate) async fn effects(&self) -> Result<(i64, i64), String> {
        match self {
            Database::Sqlite(pool, _) => sqlite::effects(pool).await,
            #[cfg(feature = "postgres")]
            Database::Postgres(pool) => postgres::effects(pool).await,
            Database::Memory(handled) => {
                let handled = handled.lock().expect("not poisoned");
                let distinct: std::collections::BTreeSet<&String> = handled.iter().collect();
                Ok((handled.len() as i64, distinct.len() as i64))
            }
        }
    }

    /// Closes the pool; an SQLite file is removed with its WAL.
    pub(crate) fn discard(self) {
        if let Database::Sqlite(pool, path) = self {
            drop(pool);
            for suffix in ["", "-wal", "-shm"] {
                let mut file = path.clone().into_os_string();
                file.push(suffix);
                let _ = std::fs::remove_file(file);
            }
        }
    }
}
