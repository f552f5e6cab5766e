//! The credit service on diesel-async: two instances (tokio tasks, each with a connection
//! from a bb8 pool) receive the same messages at the same moment.
//!
//! ```text
//! cargo run --example credit_async                # SQLite in a temporary file
//! DATABASE_URL=postgres://postgres@127.0.0.1/test \
//!     cargo run --example credit_async --features inbox-examples/postgres
//! ```
//!
//! It also shows what cancellation leaves behind: a handler dropped in the middle of its body
//! (a timeout firing, a shutdown) commits nothing. Its connection is still inside the
//! abandoned transaction; bb8 sees that when the connection comes back and closes it, which
//! ends the transaction and releases its locks at once.

use std::sync::Arc;
use std::time::Duration;

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use inbox_diesel::{InboxSchema, Outcome, Uuid, idempotent};
use tokio::sync::Barrier;

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

const MESSAGES: u128 = 50;
const BUSINESS_SCHEMA: &str = "
    CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL);
    CREATE TABLE credits (message TEXT NOT NULL, amount BIGINT NOT NULL);
    INSERT INTO accounts (id, balance) VALUES (1, 0);
";

struct CreditRequested {
    message_id: Uuid,
    account: i32,
    amount: i64,
}

mod sqlite {
    use diesel::SqliteConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

    use super::*;
    type Conn = SyncConnectionWrapper<SqliteConnection>;
    include!("demo.rs");

    pub async fn main() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("credit.sqlite").display().to_string();
        let mut conn = Conn::establish(&path)
            .await
            .expect("create the SQLite database");
        conn.batch_execute("PRAGMA journal_mode = WAL;")
            .await
            .expect("WAL mode");
        serve(
            &path,
            &inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT),
        )
        .await;
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use diesel_async::AsyncPgConnection;

    use super::*;
    type Conn = AsyncPgConnection;
    include!("demo.rs");

    pub async fn main(url: &str) {
        let mut conn = Conn::establish(url)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
        conn.batch_execute(
            "DROP SCHEMA IF EXISTS inbox_example_async CASCADE; CREATE SCHEMA inbox_example_async;",
        )
        .await
        .expect("create the schema inbox_example_async");
        let url = format!(
            "{url}{}options=-csearch_path%3Dinbox_example_async",
            if url.contains('?') { '&' } else { '?' }
        );
        serve(
            &url,
            &inbox_diesel::schema::postgres::create_table_sql(&InboxSchema::DEFAULT),
        )
        .await;
    }
}

#[tokio::main]
async fn main() {
    match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres") => {
            #[cfg(feature = "postgres")]
            postgres::main(&url).await;
            #[cfg(not(feature = "postgres"))]
            {
                eprintln!(
                    "DATABASE_URL is a PostgreSQL URL: run with `--features inbox-examples/postgres`"
                );
                std::process::exit(2);
            }
        }
        Ok(url) if !url.is_empty() => {
            eprintln!(
                "DATABASE_URL={url}: this example runs on SQLite (unset) or PostgreSQL (postgres://…)"
            );
            std::process::exit(2);
        }
        _ => sqlite::main().await,
    }
}
