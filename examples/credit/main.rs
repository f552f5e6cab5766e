//! Two instances of a service receive the same credit messages at the same moment.
//!
//! ```text
//! cargo run --example credit                      # embedded SQLite in a temporary file
//! DATABASE_URL=postgres://postgres@127.0.0.1/test \
//!     cargo run --example credit --features inbox-examples/postgres
//! DATABASE_URL=mysql://root@127.0.0.1:3306/test \
//!     cargo run --example credit --features inbox-examples/mysql
//! ```
//!
//! It prints, side by side, what the handler everybody writes first does (check for a marker,
//! do the work, insert the marker) and what `#[idempotent]` does, then two failure cases: a
//! write after the marker that fails, and a business unique violation.

use std::sync::Barrier;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::{InboxSchema, Outcome, Uuid, classify, idempotent};
use inbox_examples::support::{self, Target, run_each};

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

diesel::table! {
    /// One row per applied credit: a message applied twice shows as two rows.
    credits (message) {
        message -> Text,
        amount -> BigInt,
    }
}

diesel::table! {
    /// The naive handler's marker table: no unique index, as in most first attempts.
    naive_inbox (message_id) {
        message_id -> Text,
        consumer -> Text,
    }
}

diesel::table! {
    payments (reference) {
        reference -> Text,
    }
}

const MESSAGES: u128 = 50;
/// One statement each, in SQL every backend takes (MySQL runs no multi-statement strings).
const BUSINESS_SCHEMA: [&str; 5] = [
    "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL)",
    "CREATE TABLE credits (message TEXT NOT NULL, amount BIGINT NOT NULL)",
    "CREATE TABLE naive_inbox (message_id TEXT NOT NULL, consumer TEXT NOT NULL)",
    "CREATE TABLE payments (reference VARCHAR(100) NOT NULL,
                            CONSTRAINT ux_payments_reference UNIQUE (reference))",
    "INSERT INTO accounts (id, balance) VALUES (1, 0)",
];

const RESET: [&str; 5] = [
    "DELETE FROM credits",
    "DELETE FROM naive_inbox",
    "DELETE FROM inbox",
    "DELETE FROM payments",
    "UPDATE accounts SET balance = 0",
];

/// Runs statements one by one.

#[derive(Clone)]
struct CreditRequested {
    message_id: Uuid,
    account: i32,
    amount: i64,
    reference: String,
}

/// The report line of one scenario.
struct Row {
    scenario: &'static str,
    credits_per_message: f64,
    markers_per_message: f64,
    outcome: String,
}

mod sqlite {
    use super::*;
    type Conn = SqliteConnection;
    include!("demo.rs");

    pub fn main() -> Vec<Row> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("credit.sqlite").display().to_string();
        let mut conn = SqliteConnection::establish(&path).expect("create the SQLite database");
        conn.batch_execute("PRAGMA journal_mode = WAL;")
            .expect("WAL mode");
        conn.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(
            &InboxSchema::DEFAULT,
        ))
        .expect("create the inbox");
        run_each(&mut conn, &BUSINESS_SCHEMA);
        println!("SQLite database: {path}\n");
        run_demo(&|| {
            let mut conn = SqliteConnection::establish(&path).expect("open the SQLite database");
            // The naive handler's statements wait for each other instead of failing.
            conn.batch_execute("PRAGMA busy_timeout = 5000;")
                .expect("busy timeout");
            conn
        })
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    type Conn = PgConnection;
    include!("demo.rs");

    pub fn main(url: &str) -> Vec<Row> {
        let connect = support::postgres_schema(url, "inbox_example");
        let mut conn = connect();
        conn.batch_execute(&inbox_diesel::schema::postgres::create_table_sql(
            &InboxSchema::DEFAULT,
        ))
        .expect("create the inbox");
        run_each(&mut conn, &BUSINESS_SCHEMA);
        println!("PostgreSQL: {url} (schema inbox_example)\n");
        run_demo(&connect)
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    type Conn = MysqlConnection;
    include!("demo.rs");

    pub fn main(url: &str) -> Vec<Row> {
        let mut conn =
            MysqlConnection::establish(url).unwrap_or_else(|e| panic!("connect to {url}: {e}"));
        run_each(
            &mut conn,
            &[
                "DROP DATABASE IF EXISTS inbox_example",
                "CREATE DATABASE inbox_example",
            ],
        );
        let example_url = support::with_database(url, "inbox_example");
        let connect = || {
            MysqlConnection::establish(&example_url)
                .unwrap_or_else(|e| panic!("connect to {example_url}: {e}"))
        };
        let mut conn = connect();
        conn.batch_execute(&inbox_diesel::schema::mysql::create_table_sql(
            &InboxSchema::DEFAULT,
        ))
        .expect("create the inbox");
        run_each(&mut conn, &BUSINESS_SCHEMA);
        println!("MySQL/MariaDB: {example_url}\n");
        run_demo(&connect)
    }
}

fn main() {
    let rows = match support::target() {
        Target::Sqlite => sqlite::main(),
        #[cfg(feature = "postgres")]
        Target::Postgres(url) => postgres::main(&url),
        #[cfg(feature = "mysql")]
        Target::Mysql(url) => mysql::main(&url),
    };
    println!(
        "{} messages, each delivered to two instances at the same moment\n",
        MESSAGES
    );
    println!(
        "{:<30} {:>19} {:>19}  outcome",
        "handler", "credits per message", "markers per message"
    );
    for row in rows {
        println!(
            "{:<30} {:>19.2} {:>19.2}  {}",
            row.scenario, row.credits_per_message, row.markers_per_message, row.outcome
        );
    }
}
