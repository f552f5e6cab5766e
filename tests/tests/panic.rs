//! A body that panics leaves no open transaction behind: the runtime rolls back before the
//! panic goes on. On SQLite a transaction left open
//! holds the database's write lock, so a redelivery on another connection — another instance
//! — cannot even claim its marker: each test below delivers the message again on another
//! connection right after the panic and asserts on the rows it committed.

use std::panic::{AssertUnwindSafe, catch_unwind};

use diesel::prelude::*;
use diesel::r2d2::ConnectionManager;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use inbox_diesel::{InFlightOutcome, Outcome, idempotent};
use inbox_tests::sqlite::SqliteDb;
use inbox_tests::{Credit, credits};

type AsyncSqlite = SyncConnectionWrapper<SqliteConnection>;

/// Writes the credit, then panics when asked to.
#[idempotent(consumer = "credit", key = msg.id, busy_timeout_ms = 200, retries = 0)]
fn credit(conn: &mut SqliteConnection, msg: &Credit, panic: bool) -> QueryResult<()> {
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.id.to_string()),
            credits::account.eq(msg.account),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)?;
    if panic {
        panic!("the body panics after its write");
    }
    Ok(())
}

#[idempotent(consumer = "credit", key = msg.id, busy_timeout_ms = 200, retries = 0)]
async fn credit_async(conn: &mut AsyncSqlite, msg: &Credit, panic: bool) -> QueryResult<()> {
    diesel_async::RunQueryDsl::execute(
        diesel::insert_into(credits::table).values((
            credits::message.eq(msg.id.to_string()),
            credits::account.eq(msg.account),
            credits::amount.eq(msg.amount),
        )),
        conn,
    )
    .await?;
    if panic {
        panic!("the body panics after its write");
    }
    Ok(())
}

/// A side effect outside the database that panics.
#[idempotent(consumer = "mail", key = msg.id, mode = "claim", lease_ms = 600_000)]
fn send_mail(conn: &mut SqliteConnection, msg: &Credit, panic: bool) -> QueryResult<()> {
    if panic {
        panic!("the mailer panics");
    }
    Ok(())
}

fn credit_rows(conn: &mut SqliteConnection) -> i64 {
    credits::table.count().get_result(conn).unwrap()
}

fn markers(conn: &mut SqliteConnection, consumer: &str) -> i64 {
    diesel::sql_query(format!(
        "SELECT COUNT(*) AS n FROM inbox WHERE consumer = '{consumer}' AND processed_at IS NOT NULL"
    ))
    .get_result::<Count>(conn)
    .unwrap()
    .n
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// The panic reaches the caller, and the same connection takes the next message; the
/// redelivery on another connection processes at once, and only its write is committed.
#[test]
fn a_panicking_body_leaves_the_connection_usable_and_the_message_free() {
    let db = SqliteDb::new("panic_sync");
    let mut first = db.connect();
    let msg = Credit::new(1);

    let panicked = catch_unwind(AssertUnwindSafe(|| credit(&mut first, &msg, true)));
    assert!(panicked.is_err(), "the body's panic reaches the caller");

    // The same connection: no transaction left open on it.
    assert_eq!(
        credit(&mut first, &Credit::new(2), false).unwrap(),
        Outcome::Processed(())
    );
    // Another instance's redelivery of the panicked message: its marker is free.
    let mut other = db.connect();
    assert_eq!(
        credit(&mut other, &msg, false).unwrap(),
        Outcome::Processed(())
    );

    let mut check = db.connect();
    assert_eq!(
        credit_rows(&mut check),
        2,
        "message 2 and the redelivery of 1"
    );
    assert_eq!(markers(&mut check, "credit"), 2);
}

/// The same through an r2d2 pool of one connection: the connection the pool hands out next
/// works, and the redelivery processes. (r2d2 itself closes a connection returned while its
/// thread panics; this keeps the two from getting in each other's way.)
#[test]
fn a_panicking_body_on_an_r2d2_connection_leaves_nothing_open() {
    let db = SqliteDb::new("panic_r2d2");
    let pool = diesel::r2d2::Pool::builder()
        .max_size(1)
        .build(ConnectionManager::<SqliteConnection>::new(db.url()))
        .unwrap();
    let msg = Credit::new(1);

    let panicked = catch_unwind(AssertUnwindSafe(|| {
        let mut conn = pool.get().unwrap();
        credit(&mut conn, &msg, true)
    }));
    assert!(panicked.is_err());

    let mut other = db.connect();
    assert_eq!(
        credit(&mut other, &msg, false).unwrap(),
        Outcome::Processed(())
    );
    let mut conn = pool.get().unwrap();
    assert_eq!(
        credit(&mut conn, &Credit::new(2), false).unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(credit_rows(&mut db.connect()), 2);
}

/// Claim mode: no transaction is open while the body runs, and a panic leaves the side
/// effect's outcome unknown, as a crash does: the claim stays, and the redelivery is told the
/// message is in flight rather than running the side effect again. The connection is usable.
#[test]
fn a_panicking_claim_mode_body_is_left_as_a_crash() {
    let db = SqliteDb::new("panic_claim");
    let msg = Credit::new(1);
    let mut first = db.connect();

    let panicked = catch_unwind(AssertUnwindSafe(|| send_mail(&mut first, &msg, true)));
    assert!(panicked.is_err());

    let mut other = db.connect();
    assert!(send_mail(&mut other, &msg, false).unwrap().is_in_flight());
    assert_eq!(
        send_mail(&mut first, &Credit::new(2), false).unwrap(),
        InFlightOutcome::Processed(())
    );
    assert_eq!(markers(&mut db.connect(), "mail"), 1);
}

/// Async, in spawned tasks: the panicking delivery runs on a deadpool or bb8 connection and
/// its task ends in a panic; a redelivery on another pool (another instance) processes at
/// once, and the pool that lent the connection still works.
#[test]
fn a_panicking_async_body_on_deadpool_and_bb8_leaves_nothing_open() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // deadpool
        let db = SqliteDb::new("panic_deadpool");
        let manager = || AsyncDieselConnectionManager::<AsyncSqlite>::new(db.url());
        let lender = diesel_async::pooled_connection::deadpool::Pool::builder(manager())
            .max_size(1)
            .build()
            .unwrap();
        let other = diesel_async::pooled_connection::deadpool::Pool::builder(manager())
            .max_size(1)
            .build()
            .unwrap();
        let msg = Credit::new(1);
        let task = tokio::spawn({
            let (lender, msg) = (lender.clone(), msg.clone());
            async move {
                let mut conn = lender.get().await.unwrap();
                credit_async(&mut conn, &msg, true).await
            }
        });
        assert!(task.await.unwrap_err().is_panic());
        let mut conn = other.get().await.unwrap();
        assert_eq!(
            credit_async(&mut conn, &msg, false).await.unwrap(),
            Outcome::Processed(())
        );
        let mut conn = lender.get().await.unwrap();
        assert_eq!(
            credit_async(&mut conn, &Credit::new(2), false)
                .await
                .unwrap(),
            Outcome::Processed(())
        );
        assert_eq!(credit_rows(&mut db.connect()), 2);

        // bb8
        let db = SqliteDb::new("panic_bb8");
        let manager = || AsyncDieselConnectionManager::<AsyncSqlite>::new(db.url());
        let lender = diesel_async::pooled_connection::bb8::Pool::builder()
            .max_size(1)
            .build(manager())
            .await
            .unwrap();
        let other = diesel_async::pooled_connection::bb8::Pool::builder()
            .max_size(1)
            .build(manager())
            .await
            .unwrap();
        let task = tokio::spawn({
            let (lender, msg) = (lender.clone(), msg.clone());
            async move {
                let mut conn = lender.get().await.unwrap();
                credit_async(&mut conn, &msg, true).await
            }
        });
        assert!(task.await.unwrap_err().is_panic());
        let mut conn = other.get().await.unwrap();
        assert_eq!(
            credit_async(&mut conn, &msg, false).await.unwrap(),
            Outcome::Processed(())
        );
        let mut conn = lender.get().await.unwrap();
        assert_eq!(
            credit_async(&mut conn, &Credit::new(2), false)
                .await
                .unwrap(),
            Outcome::Processed(())
        );
        assert_eq!(credit_rows(&mut db.connect()), 2);
    });
}
