//! A fresh MySQL/MariaDB database per test on the server `INBOX_TEST_MYSQL` names, dropped
//! after.

use diesel::connection::SimpleConnection;
use diesel::{Connection, MysqlConnection, RunQueryDsl};
use inbox_diesel::{InboxSchema, schema};

/// The server's URL. This suite is compiled only with the `mysql` feature, and then it must
/// run: a missing URL fails every test instead of skipping it.
pub fn server_url() -> String {
    std::env::var("INBOX_TEST_MYSQL").expect(
        "INBOX_TEST_MYSQL must name a MySQL or MariaDB server for the mysql suite, e.g. \
         INBOX_TEST_MYSQL=mysql://root@127.0.0.1:3306/test",
    )
}

pub struct MysqlDb {
    admin_url: String,
    name: String,
    url: String,
}

/// One statement each: diesel's MySQL connection sends no multi-statement strings.
pub const BUSINESS_SCHEMA: [&str; 4] = [
    "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL) ENGINE = InnoDB",
    "CREATE TABLE credits (id BIGINT AUTO_INCREMENT PRIMARY KEY, message VARCHAR(64) NOT NULL,
                           account INTEGER NOT NULL, amount BIGINT NOT NULL) ENGINE = InnoDB",
    "CREATE TABLE users (id INTEGER AUTO_INCREMENT PRIMARY KEY, email VARCHAR(200) NOT NULL,
                         UNIQUE KEY ux_users_email (email)) ENGINE = InnoDB",
    "INSERT INTO accounts (id, balance) VALUES (1, 0), (2, 0)",
];

impl MysqlDb {
    pub fn new(test: &str) -> Self {
        let admin_url = server_url();
        let name = format!(
            "inbox_{}_{}",
            test.chars().take(40).collect::<String>(),
            std::process::id()
        );
        let base = admin_url
            .split('?')
            .next()
            .and_then(|url| url.rsplit_once('/'))
            .map(|(base, _)| base.to_owned())
            .expect("INBOX_TEST_MYSQL is a mysql:// URL with a database");
        let url = format!("{base}/{name}");
        let mut admin = MysqlConnection::establish(&admin_url).unwrap_or_else(|e| {
            panic!("cannot reach MySQL/MariaDB at INBOX_TEST_MYSQL={admin_url}: {e}")
        });
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let db = Self {
            admin_url,
            name,
            url,
        };
        let mut conn = db.connect();
        conn.batch_execute(&schema::mysql::create_table_sql(&InboxSchema::DEFAULT))
            .unwrap();
        for statement in BUSINESS_SCHEMA {
            conn.batch_execute(statement).unwrap();
        }
        db
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn connect(&self) -> MysqlConnection {
        MysqlConnection::establish(&self.url).expect("connect to the test database")
    }

    pub async fn connect_async(&self) -> diesel_async::AsyncMysqlConnection {
        use diesel_async::AsyncConnection;
        diesel_async::AsyncMysqlConnection::establish(&self.url)
            .await
            .expect("connect to the test database")
    }

    /// How many statements of this database's sessions have been running for over 200 ms —
    /// in these tests, only one blocked behind a lock. (MariaDB's `innodb_trx` is a cache that
    /// can lag for seconds; its process list is current.)
    pub fn waiting_for_a_lock(&self) -> i64 {
        #[derive(diesel::QueryableByName)]
        struct Waiting {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        diesel::sql_query(
            "SELECT count(*) AS n FROM information_schema.processlist \
             WHERE db = DATABASE() AND id <> CONNECTION_ID() \
             AND command IN ('Query', 'Execute') AND time_ms > 200",
        )
        .get_result::<Waiting>(&mut self.connect())
        .unwrap()
        .n
    }
}

impl Drop for MysqlDb {
    fn drop(&mut self) {
        if let Ok(mut admin) = MysqlConnection::establish(&self.admin_url) {
            let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {}", self.name));
        }
    }
}
