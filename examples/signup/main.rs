//! Sixteen requests register the same e-mail address at the same moment.
//!
//! ```text
//! cargo run --example signup                      # embedded SQLite in a temporary file
//! DATABASE_URL=postgres://postgres@127.0.0.1/test \
//!     cargo run --example signup --features inbox-examples/postgres
//! DATABASE_URL=mysql://root@127.0.0.1:3306/test \
//!     cargo run --example signup --features inbox-examples/mysql
//! ```
//!
//! First the handler everybody writes ("is the address taken? no — insert"), alone and in a
//! transaction; then each fix in `inbox_diesel::unique`; then a creation in several
//! statements ("the tenant, then its settings") without and with the key lock. Every
//! scenario starts its sixteen threads at a barrier; the naive ones also wait at a second
//! barrier between their check and their insert, which makes the gap that load opens now and
//! then open every time.

use std::sync::{Barrier, Mutex};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::unique::{self, UniqueError, UniqueKey};
use inbox_examples::support::{self, Target, run_each};

diesel::table! {
    users (id) {
        id -> BigInt,
        email -> Text,
    }
}

diesel::table! {
    /// No unique index on the name: nothing but the key lock keeps a tenant single.
    tenants (id) {
        id -> BigInt,
        name -> Text,
    }
}

diesel::table! {
    tenant_settings (tenant) {
        tenant -> BigInt,
        plan -> Text,
    }
}

const USERS_EMAIL: UniqueKey = UniqueKey::new("users", "ux_users_email", &["email"]);
const REQUESTS: usize = 16;

/// What one scenario left behind.
struct Row {
    scenario: &'static str,
    ok: usize,
    errors: Vec<String>,
    rows: i64,
    ids: usize,
}

mod sqlite {
    use super::*;
    type Conn = SqliteConnection;
    include!("demo.rs");

    pub fn main() -> Vec<Row> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("signup.sqlite").display().to_string();
        let mut conn = SqliteConnection::establish(&path).expect("create the SQLite database");
        conn.batch_execute("PRAGMA journal_mode = WAL;")
            .expect("WAL mode");
        run_each(
            &mut conn,
            &[
                "CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT NOT NULL)",
                "CREATE UNIQUE INDEX ux_users_email ON users (email)",
                "CREATE TABLE tenants (id INTEGER PRIMARY KEY, name TEXT NOT NULL)",
                "CREATE TABLE tenant_settings (tenant INTEGER NOT NULL, plan TEXT NOT NULL)",
            ],
        );
        println!("SQLite database: {path}\n");
        run_demo(&|| {
            let mut conn = SqliteConnection::establish(&path).expect("open the SQLite database");
            conn.batch_execute("PRAGMA busy_timeout = 10000;")
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
        let connect = support::postgres_schema(url, "signup_example");
        run_each(
            &mut connect(),
            &[
                "CREATE TABLE users (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
                 email TEXT NOT NULL)",
                "CREATE UNIQUE INDEX ux_users_email ON users (email)",
                "CREATE TABLE tenants (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
                 name TEXT NOT NULL)",
                "CREATE TABLE tenant_settings (tenant BIGINT NOT NULL, plan TEXT NOT NULL)",
            ],
        );
        println!("PostgreSQL: {url} (schema signup_example)\n");
        run_demo(&connect)
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    type Conn = MysqlConnection;
    include!("demo.rs");

    pub fn main(url: &str) -> Vec<Row> {
        run_each(
            &mut MysqlConnection::establish(url)
                .unwrap_or_else(|e| panic!("connect to {url}: {e}")),
            &[
                "DROP DATABASE IF EXISTS signup_example",
                "CREATE DATABASE signup_example",
            ],
        );
        let example_url = support::with_database(url, "signup_example");
        let connect = || {
            MysqlConnection::establish(&example_url)
                .unwrap_or_else(|e| panic!("connect to {example_url}: {e}"))
        };
        run_each(
            &mut connect(),
            &[
                "CREATE TABLE users (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
                 email VARCHAR(200) NOT NULL, UNIQUE KEY ux_users_email (email))",
                "CREATE TABLE tenants (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
                 name VARCHAR(200) NOT NULL)",
                "CREATE TABLE tenant_settings (tenant BIGINT NOT NULL, plan VARCHAR(200) NOT NULL)",
            ],
        );
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
        "{REQUESTS} requests at the same moment, one e-mail address (or one tenant) each \
         scenario; answers: the distinct ids returned (insert_if_absent: inserted or not)\n"
    );
    println!(
        "{:<38} {:>9} {:>7} {:>5} {:>8}",
        "approach", "succeeded", "failed", "rows", "answers"
    );
    let mut fixes_held = true;
    for row in &rows {
        println!(
            "{:<38} {:>9} {:>7} {:>5} {:>8}",
            row.scenario,
            row.ok,
            row.errors.len(),
            row.rows,
            row.ids
        );
        if row.scenario.starts_with("unique::") {
            // `insert_if_absent` answers whether it inserted, not an id.
            let ids = if row.scenario.ends_with("insert_if_absent") {
                2
            } else {
                1
            };
            fixes_held &= row.errors.is_empty() && row.rows == 1 && row.ids <= ids;
        }
    }
    for row in &rows {
        if let Some(first) = row.errors.first() {
            println!(
                "\n{}: {} errors, the first: {first}",
                row.scenario,
                row.errors.len()
            );
        }
    }
    if !fixes_held {
        eprintln!("\na fix did not hold: one row and {REQUESTS} successes expected");
        std::process::exit(1);
    }
}
