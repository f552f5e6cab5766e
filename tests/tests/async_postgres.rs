//! The async suite on PostgreSQL through diesel-async's `AsyncPgConnection`, plus what only
//! PostgreSQL does. Needs `INBOX_TEST_PG`.

type Db = inbox_tests::postgres::PgDb;
type AsyncConnection = diesel_async::AsyncPgConnection;

include!("behaviour/transaction_async.rs");
/// The batch form.
mod async_batch_form {
    type Db = inbox_tests::postgres::PgDb;

    include!("behaviour/batch_async.rs");
}
/// Get-or-create, async.
mod async_get_or_create {
    type Db = inbox_tests::postgres::PgDb;
    type AsyncConnection = diesel_async::AsyncPgConnection;
    const TABLES: &str = inbox_tests::unique::POSTGRES_TABLES;
    const SETUP: &str = "SELECT 1";
    const PK: &str = "signups_pkey";

    include!("behaviour/unique_async.rs");
}
include!("behaviour/server_async.rs");
/// `transaction = "caller"`, async: a job runner's transaction joined.
mod joined_async {
    type Db = inbox_tests::postgres::PgDb;
    type AsyncConnection = diesel_async::AsyncPgConnection;
    /// The next job, skipping those another worker holds (where the backend can).
    const TAKE_JOB: &str =
        "SELECT id, message FROM jobs ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED";

    include!("behaviour/joined_async.rs");
}
/// `inbox_diesel::testing`'s async helpers.
mod async_testing_kit {
    type Db = inbox_tests::postgres::PgDb;
    type AsyncConnection = diesel_async::AsyncPgConnection;

    include!("behaviour/testing_async.rs");
}
/// Stored results and fingerprints, async.
mod async_stored {
    type Db = inbox_tests::postgres::PgDb;
    type AsyncConnection = diesel_async::AsyncPgConnection;
    const BACKEND: inbox_diesel::schema::Backend = inbox_diesel::schema::Backend::Postgres;

    include!("behaviour/stored_async.rs");
}
/// Claim mode, async.
mod async_claim_mode {
    use inbox_diesel::schema::postgres::inbox;

    type Db = inbox_tests::postgres::PgDb;
    type AsyncConnection = diesel_async::AsyncPgConnection;

    include!("behaviour/claim_async.rs");
}

use inbox_diesel::Error as InboxError;
use inbox_tests::postgres::PgDb;

/// The body swallows a failed statement and returns `Ok`: the handler reports the aborted
/// transaction, and neither marker nor credit is committed.
#[tokio::test(flavor = "multi_thread")]
async fn async_swallowed_error_is_reported_never_processed() {
    let db = PgDb::new("async_swallowed_error");
    let mut conn = db.connect_async().await;
    let msg = Credit::new(1);
    let swallow = Hook {
        swallow_an_error: true,
        ..Hook::default()
    };
    let result = credit(&mut conn, &msg, &swallow).await;
    assert!(
        matches!(
            result,
            Err(AppError::Inbox(InboxError::TransactionAborted { .. }))
        ),
        "{result:?}"
    );
    assert_eq!(count_markers(&mut conn).await, 0);
    assert_eq!(count_credits(&mut conn, &msg).await, 0);
    assert_eq!(
        credit(&mut conn, &msg, &Hook::default()).await.unwrap(),
        Outcome::Processed(())
    );
}

#[idempotent(consumer = "credit", key = msg.id, isolation = "serializable")]
async fn credit_serializable(
    conn: &mut AsyncConnection,
    msg: &Credit,
    hook: &Hook,
) -> Result<(), AppError> {
    apply_credit(conn, msg).await?;
    if let Some(runs) = &hook.runs {
        runs.fetch_add(1, Ordering::SeqCst);
    }
    if let Some((holding, go)) = &hook.hold {
        holding.notify_one();
        go.notified().await;
    }
    Ok(())
}

/// Two SERIALIZABLE handlers credit one account: B's update waits for A's row lock and fails
/// with a serialization failure when A commits; B is retried in a fresh transaction.
#[tokio::test(flavor = "multi_thread")]
async fn async_serialization_failure_in_the_body_is_retried() {
    let db = PgDb::new("async_serialization_failure");
    let b_runs = Arc::new(AtomicUsize::new(0));
    let b_hook = Hook {
        runs: Some(b_runs.clone()),
        ..Hook::default()
    };
    let (a, b) = a_holds_b_waits(
        &db,
        async |conn, hook| credit_serializable(conn, &Credit::new(1), &hook).await,
        async |conn| credit_serializable(conn, &Credit::new(2), &b_hook).await,
    )
    .await;
    assert_eq!(a.unwrap(), Outcome::Processed(()));
    assert_eq!(b.unwrap(), Outcome::Processed(()));
    // B's first attempt failed in its UPDATE, before the hook: the hook ran once, in the retry.
    assert_eq!(AtomicUsize::load(&b_runs, Ordering::SeqCst), 1);
    let mut conn = db.connect_async().await;
    assert_eq!(count_markers(&mut conn).await, 2);
    assert_eq!(balance(&mut conn, 1).await, 20);
}

/// The race through a pool: handlers declared on `&mut AsyncPgConnection`, called with
/// pooled connections; `checkout` takes one from the pool.
async fn race_through_a_pool<F, Fut, O>(db: &PgDb, checkout: F)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = O> + Send,
    O: std::ops::DerefMut<Target = AsyncConnection> + Send,
{
    const TASKS: usize = 8;
    const MESSAGES: u128 = 50;
    let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (checkout, barrier) = (checkout.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let mut processed = 0;
            for n in 0..MESSAGES {
                barrier.wait().await;
                let mut pooled = checkout().await;
                let outcome = credit(&mut pooled, &Credit::new(n), &Hook::default()).await;
                processed += usize::from(outcome.unwrap().is_processed());
            }
            processed
        }));
    }
    let mut processed = 0;
    for task in tasks {
        processed += task.await.unwrap();
    }
    assert_eq!(processed, MESSAGES as usize);
    let mut conn = db.connect_async().await;
    for n in 0..MESSAGES {
        assert_eq!(
            count_credits(&mut conn, &Credit::new(n)).await,
            1,
            "message {n}"
        );
    }
    assert_eq!(count_markers(&mut conn).await, MESSAGES as i64);
    assert_eq!(balance(&mut conn, 1).await, 10 * MESSAGES as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn async_race_through_a_deadpool() {
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::pooled_connection::deadpool::Pool;
    let db = PgDb::new("async_race_deadpool");
    let manager = AsyncDieselConnectionManager::<AsyncConnection>::new(db.url());
    let pool = Pool::builder(manager).max_size(8).build().unwrap();
    race_through_a_pool(&db, move || {
        let pool = pool.clone();
        async move { pool.get().await.unwrap() }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn async_race_through_a_bb8_pool() {
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::pooled_connection::bb8::Pool;
    let db = PgDb::new("async_race_bb8");
    let manager = AsyncDieselConnectionManager::<AsyncConnection>::new(db.url());
    let pool = Pool::builder().max_size(8).build(manager).await.unwrap();
    race_through_a_pool(&db, move || {
        let pool = pool.clone();
        async move { pool.get_owned().await.unwrap() }
    })
    .await;
}
