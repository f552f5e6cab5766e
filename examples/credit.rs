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

#[path = "support.rs"]
mod support;

use std::sync::Barrier;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::{InboxSchema, Outcome, Uuid, classify, idempotent};
use support::{Target, run_each};

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

/// The handlers and scenarios, for one connection type.
macro_rules! demo {
    ($conn:ty) => {
        fn apply_credit(conn: &mut $conn, msg: &CreditRequested) -> QueryResult<()> {
            diesel::insert_into(credits::table)
                .values((
                    credits::message.eq(msg.message_id.to_string()),
                    credits::amount.eq(msg.amount),
                ))
                .execute(conn)?;
            let updated = diesel::update(accounts::table.find(msg.account))
                .set(accounts::balance.eq(accounts::balance + msg.amount))
                .execute(conn)?;
            if updated == 0 {
                // The write after the marker and after the credit row fails.
                return Err(diesel::result::Error::NotFound);
            }
            Ok(())
        }

        /// What most handlers look like first: check, work, then mark. Each statement
        /// commits on its own, and both instances can pass the check before either marks.
        fn naive_credit(
            conn: &mut $conn,
            msg: &CreditRequested,
            window: &Barrier,
        ) -> QueryResult<bool> {
            let seen: i64 = naive_inbox::table
                .filter(naive_inbox::message_id.eq(msg.message_id.to_string()))
                .count()
                .get_result(conn)?;
            // The window between check and mark: the handler's whole run time in production,
            // made certain here so that every run shows it.
            window.wait();
            if seen > 0 {
                return Ok(false);
            }
            apply_credit(conn, msg)?;
            diesel::insert_into(naive_inbox::table)
                .values((
                    naive_inbox::message_id.eq(msg.message_id.to_string()),
                    naive_inbox::consumer.eq("credit"),
                ))
                .execute(conn)?;
            Ok(true)
        }

        #[idempotent(consumer = "credit", key = msg.message_id)]
        fn on_credit(conn: &mut $conn, msg: &CreditRequested) -> QueryResult<()> {
            apply_credit(conn, msg)
        }

        // A write on any other connection would commit on its own, outside the inbox
        // transaction. The macro refuses it at compile time:
        //
        //     #[idempotent(consumer = "credit", key = msg.message_id)]
        //     fn on_credit(conn: &mut PgConnection, msg: &CreditRequested) -> Result<(), AppError> {
        //         diesel::update(accounts::table.find(msg.account))
        //             .set(accounts::balance.eq(accounts::balance + msg.amount))
        //             .execute(&mut pool.get()?)?;
        //         Ok(())
        //     }
        //
        //     error: `.execute(…)` runs this statement on a connection other than `conn`, the
        //            handler's transaction connection, so it would commit on its own, outside
        //            the inbox transaction: a redelivered message would be recognised as a
        //            duplicate and this write would still happen again; run it on the
        //            handler's connection (`conn`, or `&mut *conn`) so that it commits or rolls
        //            back with the inbox marker, or, if it must commit on its own, mark the
        //            statement `#[inbox::outside_transaction("why")]`
        //       |
        //       |             .execute(&mut pool.get()?)?;
        //       |                      ^^^^^^^^^^^^^^^^

        #[idempotent(consumer = "payment", key = msg.message_id)]
        fn on_payment(conn: &mut $conn, msg: &CreditRequested) -> QueryResult<()> {
            diesel::insert_into(payments::table)
                .values(payments::reference.eq(&msg.reference))
                .execute(conn)?;
            Ok(())
        }

        fn count(conn: &mut $conn, table: &str) -> i64 {
            #[derive(QueryableByName)]
            struct Count {
                #[diesel(sql_type = diesel::sql_types::BigInt)]
                n: i64,
            }
            diesel::sql_query(format!("SELECT count(*) AS n FROM {table}"))
                .get_result::<Count>(conn)
                .map(|c| c.n)
                .unwrap_or_else(|e| panic!("count {table}: {e}"))
        }

        fn reset(conn: &mut $conn) {
            run_each(conn, &RESET);
        }

        fn messages() -> Vec<CreditRequested> {
            (1..=MESSAGES)
                .map(|n| CreditRequested {
                    message_id: Uuid::from_u128(n),
                    account: 1,
                    amount: 10,
                    reference: format!("ref-{n}"),
                })
                .collect()
        }

        /// Two instances, their own connections, each receiving every message; a barrier
        /// releases both deliveries of a message together.
        fn two_instances<R: Send>(
            connect: &(dyn Fn() -> $conn + Sync),
            deliver: &(dyn Fn(&mut $conn, &CreditRequested, &Barrier) -> R + Sync),
        ) -> Vec<R> {
            let (start, window) = (Barrier::new(2), Barrier::new(2));
            let msgs = messages();
            std::thread::scope(|scope| {
                let instances: Vec<_> = (0..2)
                    .map(|_| {
                        let mut conn = connect();
                        let (start, window, msgs) = (&start, &window, &msgs);
                        scope.spawn(move || {
                            msgs.iter()
                                .map(|msg| {
                                    start.wait();
                                    deliver(&mut conn, msg, window)
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                instances
                    .into_iter()
                    .flat_map(|i| i.join().expect("instance panicked"))
                    .collect()
            })
        }

        fn run_demo(connect: &(dyn Fn() -> $conn + Sync)) -> Vec<Row> {
            let mut conn = connect();
            let mut rows = Vec::new();
            let per_message = |n: i64| n as f64 / MESSAGES as f64;

            reset(&mut conn);
            let results = two_instances(connect, &|c, msg, window| naive_credit(c, msg, window));
            let processed = results.iter().filter(|r| matches!(r, Ok(true))).count();
            rows.push(Row {
                scenario: "naive check-then-insert",
                credits_per_message: per_message(count(&mut conn, "credits")),
                markers_per_message: per_message(count(&mut conn, "naive_inbox")),
                outcome: format!("{processed} of {} deliveries applied", results.len()),
            });

            reset(&mut conn);
            let results = two_instances(connect, &|c, msg, _| on_credit(c, msg));
            let processed = results
                .iter()
                .filter(|r| matches!(r, Ok(Outcome::Processed(()))))
                .count();
            let duplicates = results
                .iter()
                .filter(|r| matches!(r, Ok(Outcome::Duplicate { .. })))
                .count();
            rows.push(Row {
                scenario: "#[idempotent]",
                credits_per_message: per_message(count(&mut conn, "credits")),
                markers_per_message: per_message(count(&mut conn, "inbox")),
                outcome: format!("{processed} processed, {duplicates} duplicates"),
            });

            reset(&mut conn);
            let failing: Vec<_> = messages()
                .into_iter()
                .map(|msg| CreditRequested {
                    account: 404,
                    ..msg
                })
                .collect();
            let errors = failing
                .iter()
                .filter(|msg| on_credit(&mut conn, msg).is_err())
                .count();
            rows.push(Row {
                scenario: "write after the marker fails",
                credits_per_message: per_message(count(&mut conn, "credits")),
                markers_per_message: per_message(count(&mut conn, "inbox")),
                outcome: format!("{errors} errors, all rolled back"),
            });

            reset(&mut conn);
            let first = CreditRequested {
                reference: "ref-dup".into(),
                ..messages()[0].clone()
            };
            let second = CreditRequested {
                message_id: Uuid::from_u128(999),
                ..first.clone()
            };
            assert!(
                on_payment(&mut conn, &first)
                    .expect("the first payment")
                    .is_processed()
            );
            let outcome = match on_payment(&mut conn, &second) {
                Err(e) => format!("error: {}", classify(&e, &InboxSchema::DEFAULT)),
                Ok(o) => format!("{o:?} (wrong!)"),
            };
            rows.push(Row {
                scenario: "business unique violation",
                credits_per_message: 0.0,
                markers_per_message: count(&mut conn, "inbox") as f64,
                outcome,
            });
            rows
        }
    };
}

mod sqlite {
    use super::*;
    demo!(SqliteConnection);

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
    demo!(PgConnection);

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
    demo!(MysqlConnection);

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
