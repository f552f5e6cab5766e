// Stored results (`store_result = true`) on one backend: included by each backend's suite
// into a module that names `Db`, `DbConnection` and `BACKEND`.
use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::{Error, InFlightOutcome, InboxSchema, Outcome, StoredResultProblem, idempotent};
use inbox_tests::{AppError, Credit, accounts, credits};

/// What a payment answers: what a retry of the request must get again.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Receipt {
    message: String,
    balance: i64,
}

/// Credits the account and answers with its new balance.
#[idempotent(consumer = "pay", key = msg.id, store_result = true)]
fn pay(conn: &mut DbConnection, msg: &Credit, ran: &AtomicUsize) -> Result<Receipt, AppError> {
    ran.fetch_add(1, Ordering::SeqCst);
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.id.to_string()),
            credits::account.eq(msg.account),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)?;
    diesel::update(accounts::table.find(msg.account))
        .set(accounts::balance.eq(accounts::balance + msg.amount))
        .execute(conn)?;
    let balance = accounts::table
        .find(msg.account)
        .select(accounts::balance)
        .first::<i64>(conn)?;
    Ok(Receipt {
        message: msg.id.to_string(),
        balance,
    })
}

/// The same consumer, answering with a value of `len` bytes.
#[idempotent(consumer = "pay", key = msg.id, store_result = true)]
fn pay_sized(conn: &mut DbConnection, msg: &Credit, len: usize) -> Result<String, AppError> {
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.id.to_string()),
            credits::account.eq(msg.account),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)?;
    Ok("x".repeat(len))
}

/// Claim mode: the side effect counted, its receipt stored with the stamp.
#[idempotent(consumer = "notify", key = msg.id, mode = "claim", store_result = true)]
fn notify(conn: &mut DbConnection, msg: &Credit, sent: &AtomicUsize) -> Result<u64, AppError> {
    Ok(sent.fetch_add(1, Ordering::SeqCst) as u64 + 1000)
}

/// A fresh database whose inbox has the `result` column.
fn with_result(test: &str) -> Db {
    let db = Db::new(test);
    db.connect()
        .batch_execute(&BACKEND.add_result_sql(&InboxSchema::DEFAULT))
        .unwrap();
    db
}

fn credits_of(conn: &mut DbConnection, msg: &Credit) -> i64 {
    credits::table
        .filter(credits::message.eq(msg.id.to_string()))
        .count()
        .get_result(conn)
        .unwrap()
}

fn markers(conn: &mut DbConnection) -> i64 {
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query("SELECT count(*) AS n FROM inbox")
        .get_result::<N>(conn)
        .unwrap()
        .n
}

#[test]
fn a_duplicate_gets_the_stored_result_of_the_delivery_that_processed_it() {
    let db = with_result("stored_duplicate");
    let mut conn = db.connect();
    let (msg, ran) = (Credit::new(1), AtomicUsize::new(0));
    let first = pay(&mut conn, &msg, &ran).unwrap();
    let Outcome::Processed(receipt) = first else {
        panic!("{first:?}")
    };
    assert_eq!(receipt.balance, 10);
    let again = pay(&mut conn, &msg, &ran).unwrap();
    assert!(
        matches!(&again, Outcome::Duplicate { stored: Some(r), .. } if *r == receipt),
        "{again:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(credits_of(&mut conn, &msg), 1);
    // An operator reads it as JSON.
    #[derive(QueryableByName)]
    struct Text {
        #[diesel(sql_type = diesel::sql_types::Text)]
        t: String,
    }
    let stored = diesel::sql_query(match BACKEND {
        inbox_diesel::schema::Backend::Postgres => "SELECT result->>'balance' AS t FROM inbox",
        _ => "SELECT CAST(result AS CHAR) AS t FROM inbox",
    })
    .get_result::<Text>(&mut conn)
    .unwrap()
    .t;
    assert!(stored.contains("10"), "{stored}");
}

/// Eight deliveries of one message at once, behind a barrier: one processes it, and every
/// other one answers `Duplicate` with that one's result.
#[test]
fn racing_deliveries_all_get_the_winners_result() {
    const DELIVERIES: usize = 8;
    let db = with_result("stored_race");
    let (msg, ran) = (Credit::new(7), AtomicUsize::new(0));
    let barrier = Barrier::new(DELIVERIES);
    let outcomes: Vec<Result<Outcome<Receipt>, AppError>> = std::thread::scope(|scope| {
        let deliveries: Vec<_> = (0..DELIVERIES)
            .map(|_| {
                let mut conn = db.connect();
                let (barrier, msg, ran) = (&barrier, &msg, &ran);
                scope.spawn(move || {
                    barrier.wait();
                    pay(&mut conn, msg, ran)
                })
            })
            .collect();
        deliveries.into_iter().map(|d| d.join().unwrap()).collect()
    });
    let outcomes: Vec<Outcome<Receipt>> = outcomes
        .into_iter()
        .map(|o| o.expect("no delivery fails"))
        .collect();
    let processed: Vec<&Receipt> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Processed(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(processed.len(), 1, "{outcomes:?}");
    for outcome in &outcomes {
        match outcome {
            Outcome::Processed(_) => {}
            Outcome::Duplicate { stored, .. } => assert_eq!(stored.as_ref(), Some(processed[0])),
        }
    }
    assert_eq!(credits_of(&mut db.connect(), &msg), 1);
}

#[test]
fn a_table_without_the_result_column_is_refused_before_anything_is_written() {
    let db = Db::new("stored_no_column");
    let mut conn = db.connect();
    let (msg, ran) = (Credit::new(1), AtomicUsize::new(0));
    let refused = pay(&mut conn, &msg, &ran);
    assert!(
        matches!(&refused, Err(AppError::Inbox(Error::Schema(e))) if e.to_string().contains("result")),
        "{refused:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the body did not run");
    assert_eq!(markers(&mut conn), 0);
}

/// A result over the limit is refused after the body, and its transaction rolled back:
/// nothing of the attempt is left, and a delivery with a result that fits processes it.
#[test]
fn a_result_over_the_limit_rolls_the_delivery_back() {
    let db = with_result("stored_too_large");
    let mut conn = db.connect();
    let msg = Credit::new(1);
    let limit = inbox_diesel::MAX_STORED_RESULT_BYTES;
    // The JSON string's two quotes make it one byte over.
    let refused = pay_sized(&mut conn, &msg, limit - 1);
    assert!(
        matches!(
            &refused,
            Err(AppError::Inbox(Error::StoredResult(StoredResultProblem::TooLarge { bytes, .. })))
                if *bytes == limit + 1
        ),
        "{refused:?}"
    );
    assert_eq!(credits_of(&mut conn, &msg), 0);
    assert_eq!(markers(&mut conn), 0);
    // At the limit exactly, it is stored.
    let fits = pay_sized(&mut conn, &msg, limit - 2).unwrap();
    assert!(fits.is_processed());
    let again = pay_sized(&mut conn, &msg, 3).unwrap();
    assert!(
        matches!(&again, Outcome::Duplicate { stored: Some(s), .. } if s.len() == limit - 2),
        "the duplicate got another value"
    );
}

/// A stored value that does not read as the handler's type is an error, not a `None`.
#[test]
fn a_stored_result_of_another_type_is_an_error() {
    let db = with_result("stored_other_type");
    let mut conn = db.connect();
    let (msg, ran) = (Credit::new(1), AtomicUsize::new(0));
    assert!(pay_sized(&mut conn, &msg, 4).unwrap().is_processed());
    let read = pay(&mut conn, &msg, &ran);
    assert!(
        matches!(
            &read,
            Err(AppError::Inbox(Error::StoredResult(
                StoredResultProblem::Decode(_)
            )))
        ),
        "{read:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// Claim mode: the result is written with the stamp, and a redelivery replays it.
#[test]
fn claim_mode_replays_the_stored_result() {
    let db = with_result("stored_claim");
    let mut conn = db.connect();
    let (msg, sent) = (Credit::new(1), AtomicUsize::new(0));
    assert_eq!(
        notify(&mut conn, &msg, &sent).unwrap(),
        InFlightOutcome::Processed(1000)
    );
    let again = notify(&mut conn, &msg, &sent).unwrap();
    assert!(
        matches!(
            again,
            InFlightOutcome::Duplicate {
                stored: Some(1000),
                ..
            }
        ),
        "{again:?}"
    );
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}
