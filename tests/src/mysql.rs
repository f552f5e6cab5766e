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

    /// Rows from a cross join of digits: portable across MySQL and MariaDB versions.
    fn archive(n: u32) -> Vec<String> {
        vec![
            "CREATE TABLE digits (d INTEGER NOT NULL)".into(),
            "INSERT INTO digits VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9)".into(),
            format!(
                "INSERT INTO inbox (message_id, consumer, received_at, processed_at) \
                 SELECT UNHEX(MD5(i)), 'archive', UTC_TIMESTAMP(6) - INTERVAL 10 DAY, UTC_TIMESTAMP(6) - INTERVAL 10 DAY \
                 FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 100000 * g.d AS i \
                       FROM digits a, digits b, digits c, digits e, digits f, digits g) AS seq \
                 WHERE i < {n}"
            ),
            "INSERT INTO inbox (message_id, consumer, received_at) \
             SELECT UNHEX(MD5(CONCAT('stale', d))), 'archive', UTC_TIMESTAMP(6) - INTERVAL 10 DAY \
             FROM digits WHERE d < 3"
                .into(),
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
