// `transaction = "caller"` on diesel-async: the job runner of `joined.rs`, async, included by
// each backend's async suite into a module that names `Db`, `AsyncConnection` and
// `TAKE_JOB`.
use diesel::{ExpressionMethods, OptionalExtension, QueryableByName};
use diesel_async::{AsyncConnection as _, RunQueryDsl, SimpleAsyncConnection};
use inbox_diesel::testing::{self, Crash};
use inbox_diesel::{Action, Outcome, idempotent};
use inbox_tests::{AppError, Credit, credits};

#[idempotent(consumer = "jobs", key = msg.id, transaction = "caller")]
async fn notify(conn: &mut AsyncConnection, msg: &Credit, stall: bool) -> Result<(), AppError> {
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.id.to_string()),
            credits::account.eq(msg.account),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)
        .await?;
    inbox_diesel::crash_point("in-the-body");
    if stall {
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    }
    Ok(())
}

#[derive(QueryableByName)]
struct Job {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    message: i64,
}

async fn work(conn: &mut AsyncConnection) -> Result<Option<Outcome<()>>, AppError> {
    let outcome = conn
        .transaction::<_, AppError, _>(async |conn| {
            let Some(job) = diesel::sql_query(TAKE_JOB)
                .get_result::<Job>(conn)
                .await
                .optional()?
            else {
                return Ok(None);
            };
            inbox_diesel::crash_point("job-taken");
            let outcome = notify(conn, &Credit::new(job.message as u128), false).await?;
            inbox_diesel::crash_point("effect-written");
            conn.batch_execute(&format!("DELETE FROM jobs WHERE id = {}", job.id))
                .await?;
            inbox_diesel::crash_point("job-deleted");
            Ok(Some(outcome))
        })
        .await?;
    inbox_diesel::crash_point("committed");
    Ok(outcome)
}

async fn drain(conn: &mut AsyncConnection) -> Vec<Outcome<()>> {
    let mut outcomes = Vec::new();
    loop {
        match work(conn).await {
            Ok(Some(outcome)) => outcomes.push(outcome),
            Ok(None) => return outcomes,
            Err(AppError::Db(e))
                if inbox_diesel::classify(&e, &inbox_diesel::InboxSchema::DEFAULT).action()
                    == Action::RetryLater => {}
            Err(AppError::Inbox(e)) if e.action() == Action::RetryLater => {}
            Err(e) => panic!("the runner failed: {e:?}"),
        }
    }
}

fn credits_of(message: u128) -> String {
    format!(
        "SELECT count(*) FROM credits WHERE message = '{}'",
        Credit::new(message).id
    )
}

/// The async runner dies in each window of a job, and runs again: each message applied
/// once, each job gone; a second job of one message is a duplicate; no transaction open is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_job_runner_applies_each_message_once_whatever_window_it_dies_in() {
    let db = Db::new("joined_async");
    let mut check = db.connect_async().await;
    check
        .batch_execute("CREATE TABLE jobs (id BIGINT PRIMARY KEY, message BIGINT NOT NULL)")
        .await
        .unwrap();
    let points = inbox_tests::JOB_WINDOWS;
    for (n, point) in points.into_iter().enumerate() {
        let message = n as u128 + 1;
        check
            .batch_execute(&format!("INSERT INTO jobs VALUES ({message}, {message})"))
            .await
            .unwrap();
        testing::crash_async(db.connect_async().await, point, async |conn| {
            work(conn).await
        })
        .await;
        let committed = point == Crash::At("committed");
        assert_eq!(
            testing::count_async(&mut check, &credits_of(message)).await,
            i64::from(committed),
            "{point:?}"
        );
        // The dead runner's lock on its job goes when its server session ends, which may
        // be a moment after the crash: until then `SKIP LOCKED` passes the job over, and a
        // runner polls again.
        let mut outcomes = drain(&mut db.connect_async().await).await;
        for _ in 0..200 {
            if !outcomes.is_empty() || committed {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            outcomes = drain(&mut db.connect_async().await).await;
        }
        assert_eq!(outcomes.len(), usize::from(!committed), "{point:?}");
        assert!(outcomes.iter().all(Outcome::is_processed), "{point:?}");
        testing::assert_once_async(&mut check, &credits_of(message)).await;
    }
    check
        .batch_execute("INSERT INTO jobs VALUES (10, 1), (11, 9)")
        .await
        .unwrap();
    let outcomes = drain(&mut db.connect_async().await).await;
    let processed: Vec<bool> = outcomes.iter().map(Outcome::is_processed).collect();
    assert_eq!(processed, [false, true]);
    testing::assert_once_async(&mut check, &credits_of(1)).await;
    assert_eq!(
        testing::count_async(&mut check, "SELECT count(*) FROM jobs").await,
        0
    );
    let refused = notify(&mut db.connect_async().await, &Credit::new(20), false).await;
    assert!(
        matches!(
            refused,
            Err(AppError::Inbox(inbox_diesel::Error::NoTransactionToJoin))
        ),
        "{refused:?}"
    );
}

/// The joining handler's future dropped mid-body (a timeout) inside the caller's
/// transaction, which goes on: its commit is refused — diesel-async's manager would have
/// counted the handler's savepoint as the caller's transaction, released it and answered
/// `Ok` with nothing committed — and nothing of the transaction stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_joining_handler_fails_its_callers_commit() {
    let db = Db::new("joined_async_cancelled");
    let mut check = db.connect_async().await;
    check
        .batch_execute("CREATE TABLE jobs (id BIGINT PRIMARY KEY, message BIGINT NOT NULL)")
        .await
        .unwrap();
    let mut conn = db.connect_async().await;
    let committed = conn
        .transaction::<_, AppError, _>(async |conn| {
            conn.batch_execute("INSERT INTO jobs VALUES (1, 1)").await?;
            let cancelled = tokio::time::timeout(
                std::time::Duration::from_millis(300),
                notify(conn, &Credit::new(1), true),
            )
            .await;
            assert!(cancelled.is_err(), "the handler was cancelled");
            conn.batch_execute("INSERT INTO jobs VALUES (2, 2)").await?;
            Ok(())
        })
        .await;
    assert!(
        matches!(
            committed,
            Err(AppError::Db(
                diesel::result::Error::BrokenTransactionManager
            ))
        ),
        "{committed:?}"
    );
    drop(conn);
    assert_eq!(
        testing::count_async(&mut check, "SELECT count(*) FROM jobs").await,
        0
    );
    assert_eq!(testing::count_async(&mut check, &credits_of(1)).await, 0);
}

#[idempotent(consumer = "jobs", key = msg.id, transaction = "caller_or_own")]
async fn apply(conn: &mut AsyncConnection, msg: &Credit) -> Result<(), AppError> {
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.id.to_string()),
            credits::account.eq(msg.account),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

/// `transaction = "caller_or_own"` on diesel-async: joins the caller's transaction where one
/// is open, runs its own where none is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_handler_joins_a_callers_transaction_or_runs_its_own() {
    let db = Db::new("joined_or_own_async");
    let mut conn = db.connect_async().await;
    let mut check = db.connect_async().await;
    let rolled = conn
        .transaction::<(), AppError, _>(async |conn| {
            assert!(apply(conn, &Credit::new(1)).await?.is_processed());
            Err(AppError::Rejected)
        })
        .await;
    assert!(matches!(rolled, Err(AppError::Rejected)));
    assert_eq!(testing::count_async(&mut check, &credits_of(1)).await, 0);
    assert!(
        apply(&mut conn, &Credit::new(1))
            .await
            .unwrap()
            .is_processed()
    );
    assert_eq!(testing::count_async(&mut check, &credits_of(1)).await, 1);
    conn.transaction::<(), AppError, _>(async |conn| {
        assert!(apply(conn, &Credit::new(1)).await?.is_duplicate());
        assert!(apply(conn, &Credit::new(2)).await?.is_processed());
        Ok(())
    })
    .await
    .unwrap();
    assert!(
        apply(&mut conn, &Credit::new(2))
            .await
            .unwrap()
            .is_duplicate()
    );
    testing::assert_once_async(&mut check, &credits_of(1)).await;
    testing::assert_once_async(&mut check, &credits_of(2)).await;
}
