//! A fresh SQLite database file per test, in WAL mode, with the inbox and business schema.

use diesel::connection::SimpleConnection;
use diesel::{Connection, SqliteConnection};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use inbox_diesel::{InboxSchema, schema};

pub struct SqliteDb {
    _dir: tempfile::TempDir,
    url: String,
}

pub const BUSINESS_SCHEMA: &str = "
    CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL);
    CREATE TABLE credits (id INTEGER PRIMARY KEY, message TEXT NOT NULL,
                          account INTEGER NOT NULL, amount BIGINT NOT NULL);
    CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT NOT NULL);
    CREATE UNIQUE INDEX ux_users_email ON users (email);
    INSERT INTO accounts (id, balance) VALUES (1, 0), (2, 0);
";

impl SqliteDb {
    pub fn new(_test: &str) -> Self {
        Self::with(schema::OptionalColumns::default())
    }

    /// The inbox table created with `columns` (the lean design, optional columns).
    pub fn with(columns: schema::OptionalColumns) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = dir.path().join("test.sqlite").display().to_string();
        let db = Self { _dir: dir, url };
        let mut conn = db.connect();
        conn.batch_execute("PRAGMA journal_mode = WAL;").unwrap();
        conn.batch_execute(
            &schema::Backend::Sqlite.create_table_with_sql(&InboxSchema::DEFAULT, columns),
        )
        .unwrap();
        conn.batch_execute(BUSINESS_SCHEMA).unwrap();
        db
    }

    /// Adds `n` markers completed ten days ago and three stale claims.
    pub fn seed_archive(&self, n: u32) {
        self.connect()
            .batch_execute(&format!(
                "INSERT INTO inbox (message_id, consumer, received_at, processed_at) \
                 WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < {n}) \
                 SELECT randomblob(16), 'archive', datetime('now', '-10 days'), \
                 datetime('now', '-10 days') FROM seq; \
                 INSERT INTO inbox (message_id, consumer, received_at) \
                 WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < 3) \
                 SELECT randomblob(16), 'archive', datetime('now', '-10 days') FROM seq;"
            ))
            .unwrap();
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// A diesel-async connection: the sync connection on diesel-async's blocking thread.
    pub async fn connect_async(&self) -> SyncConnectionWrapper<SqliteConnection> {
        SyncConnectionWrapper::new(self.connect())
    }

    pub fn connect(&self) -> SqliteConnection {
        let mut conn = SqliteConnection::establish(&self.url).expect("open the test database");
        conn.batch_execute("PRAGMA synchronous = NORMAL;").unwrap();
        conn
    }
}

/// A fresh database whose inbox is SQLite's lean design (`WITHOUT ROWID`, keyed by the
/// pair, no `id`, no index on `processed_at`): the same suites run on it.
pub struct LeanSqliteDb(SqliteDb);

impl LeanSqliteDb {
    pub fn new(_test: &str) -> Self {
        Self(SqliteDb::with(schema::OptionalColumns {
            lean: true,
            ..schema::OptionalColumns::default()
        }))
    }
}

impl std::ops::Deref for LeanSqliteDb {
    type Target = SqliteDb;

    fn deref(&self) -> &SqliteDb {
        &self.0
    }
}
