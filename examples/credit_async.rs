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

/// The handler and the demonstration, for one diesel-async connection type.
macro_rules! demo {
    ($conn:ty) => {
        type Db = $conn;

        #[idempotent(consumer = "credit", key = msg.message_id)]
        async fn on_credit(conn: &mut Db, msg: &CreditRequested, slow: Duration) -> diesel::QueryResult<()> {
            diesel::insert_into(credits::table)
                .values((
                    credits::message.eq(msg.message_id.to_string()),
                    credits::amount.eq(msg.amount),
                ))
                .execute(conn)
                .await?;
            diesel::update(accounts::table.find(msg.account))
                .set(accounts::balance.eq(accounts::balance + msg.amount))
                .execute(conn)
                .await?;
            // Work that takes a while: an external lookup, a large computation.
            tokio::time::sleep(slow).await;
            Ok(())
        }

        async fn count(conn: &mut Db, table: &str) -> i64 {
            #[derive(diesel::QueryableByName)]
            struct Count {
                #[diesel(sql_type = diesel::sql_types::BigInt)]
                n: i64,
            }
            diesel::sql_query(format!("SELECT count(*) AS n FROM {table}"))
                .get_result::<Count>(conn)
                .await
                .map(|c| c.n)
                .unwrap_or_else(|e| panic!("count {table}: {e}"))
        }

        /// Creates the tables on the database at `url` and runs the demonstration on a pool
        /// of two connections to it.
        async fn serve(url: &str, inbox_sql: &str) {
            let mut conn = Db::establish(url).await.unwrap_or_else(|e| panic!("connect to {url}: {e}"));
            conn.batch_execute(inbox_sql).await.expect("create the inbox");
            conn.batch_execute(BUSINESS_SCHEMA).await.expect("create the business tables");
            println!("database: {url}\n");
            let manager = AsyncDieselConnectionManager::<Db>::new(url);
            run_demo(Pool::builder().max_size(2).build(manager).await.expect("a pool")).await;
        }

        async fn run_demo(pool: Pool<Db>) {
            let barrier = Arc::new(Barrier::new(2));
            let instances: Vec<_> = (0..2)
                .map(|_| {
                    let (pool, barrier) = (pool.clone(), barrier.clone());
                    tokio::spawn(async move {
                        let (mut processed, mut duplicates) = (0, 0);
                        for n in 1..=MESSAGES {
                            let msg = CreditRequested { message_id: Uuid::from_u128(n), account: 1, amount: 10 };
                            let mut conn = pool.get().await.expect("a pooled connection");
                            barrier.wait().await;
                            match on_credit(&mut conn, &msg, Duration::ZERO).await {
                                Ok(Outcome::Processed(())) => processed += 1,
                                Ok(Outcome::Duplicate { .. }) => duplicates += 1,
                                Err(e) => panic!("message {n}: {e}"),
                            }
                        }
                        (processed, duplicates)
                    })
                })
                .collect();
            let (mut processed, mut duplicates) = (0, 0);
            for instance in instances {
                let (p, d) = instance.await.expect("instance panicked");
                processed += p;
                duplicates += d;
            }
            let mut conn = pool.get().await.expect("a pooled connection");
            println!("{MESSAGES} messages, each delivered to two instances at the same moment:");
            println!(
                "  {processed} processed, {duplicates} duplicates; {} credits and {} markers in the database\n",
                count(&mut conn, "credits").await,
                count(&mut conn, "inbox").await,
            );
            drop(conn);

            let late = CreditRequested { message_id: Uuid::from_u128(1_000), account: 1, amount: 10 };
            let mut conn = pool.get().await.expect("a pooled connection");
            let cancelled = tokio::time::timeout(
                Duration::from_millis(50),
                on_credit(&mut conn, &late, Duration::from_secs(60)),
            )
            .await;
            drop(conn);
            let mut conn = pool.get().await.expect("a pooled connection");
            let credits: i64 = credits::table
                .filter(credits::message.eq(late.message_id.to_string()))
                .count()
                .get_result(&mut conn)
                .await
                .expect("count credits");
            println!("A handler cancelled by a timeout in the middle of its body:");
            println!(
                "  timed out: {}; its credit rows afterwards: {credits}; redelivered: {:?}",
                cancelled.is_err(),
                on_credit(&mut conn, &late, Duration::ZERO).await.expect("the redelivery"),
            );
        }
    };
}

mod sqlite {
    use diesel::SqliteConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

    use super::*;
    demo!(SyncConnectionWrapper<SqliteConnection>);

    pub async fn main() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("credit.sqlite").display().to_string();
        let mut conn = Db::establish(&path)
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
    demo!(AsyncPgConnection);

    pub async fn main(url: &str) {
        let mut conn = Db::establish(url)
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
