//! The MySQL/MariaDB fixture: a fresh database per test on the server `INBOX_TEST_MYSQL`
//! names.

use diesel::MysqlConnection;
use inbox_diesel::{InboxSchema, schema};

use crate::server::{Server, ServerDb, count};

pub struct Mysql;

pub type MysqlDb = ServerDb<Mysql>;

impl Server for Mysql {
    type Conn = MysqlConnection;
    const ENV: &'static str = "INBOX_TEST_MYSQL";
    const EXAMPLE: &'static str = "mysql://root@127.0.0.1:3306/test";

    fn schema() -> Vec<String> {
        vec![
            schema::mysql::create_table_sql(&InboxSchema::DEFAULT),
            "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL)".into(),
            "CREATE TABLE credits (id BIGINT AUTO_INCREMENT PRIMARY KEY, message VARCHAR(64) NOT NULL,
                 account INTEGER NOT NULL, amount BIGINT NOT NULL)"
                .into(),
            "CREATE TABLE users (id INTEGER AUTO_INCREMENT PRIMARY KEY, email VARCHAR(200) NOT NULL,
                 UNIQUE KEY ux_users_email (email))"
                .into(),
            "INSERT INTO accounts (id, balance) VALUES (1, 0), (2, 0)".into(),
        ]
    }
}

impl MysqlDb {
    pub async fn connect_async(&self) -> diesel_async::AsyncMysqlConnection {
        use diesel_async::AsyncConnection;
        diesel_async::AsyncMysqlConnection::establish(self.url())
            .await
            .expect("connect to the test database")
    }

    /// How many statements of this database's sessions have been running for over 200 ms —
    /// in these tests, only one blocked behind a lock. (MariaDB's `innodb_trx` is a cache that
    /// can lag for seconds; its process list is current.)
    pub fn waiting_for_a_lock(&self) -> i64 {
        count(
            &mut self.connect(),
            "SELECT count(*) AS n FROM information_schema.processlist \
             WHERE db = DATABASE() AND id <> CONNECTION_ID() \
             AND command IN ('Query', 'Execute') AND time_ms > 200",
        )
    }
}
