// `inbox_diesel::testing`'s async helpers on one backend: included by each backend's async
// suite into a module that names `Db` (the fixture) and `AsyncConnection` (what
// `Db::connect_async` returns).
use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::RunQueryDsl;
use inbox_diesel::idempotent;
use inbox_diesel::testing::{self, Crash};
use inbox_tests::{AppError, Credit, accounts, credits};

#[idempotent(consumer = "credit", key = msg.id)]
async fn credit(conn: &mut AsyncConnection, msg: &Credit) -> Result<(), AppError> {
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.id.to_string()),
            credits::account.eq(msg.account),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)
        .await?;
    diesel::update(accounts::table.find(msg.account))
        .set(accounts::balance.eq(accounts::balance + msg.amount))
        .execute(conn)
        .await?;
    Ok(())
}

fn credits_of(msg: &Credit) -> String {
    format!("SELECT count(*) FROM credits WHERE message = '{}'", msg.id)
}

/// Copies raced on four connections, a crash before the commit and one after it: each
/// message has one credit, and each redelivery's answer is what the crash left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn races_and_crashes_of_an_async_handler_leave_one_effect() {
    let db = Db::new("testing_async");
    let mut connections = Vec::new();
    for _ in 0..4 {
        connections.push(db.connect_async().await);
    }
    let mut check = db.connect_async().await;
    for n in 0..20 {
        let msg = Credit::new(n);
        let answers =
            testing::race_async(&mut connections, async |conn| credit(conn, &msg).await).await;
        let processed = answers
            .iter()
            .filter(|a| a.as_ref().is_ok_and(|o| o.is_processed()))
            .count();
        assert_eq!(processed, 1, "message {n}: {answers:?}");
        testing::assert_once_async(&mut check, &credits_of(&msg)).await;
    }

    let before = Credit::new(100);
    let crashed = testing::crash_async(
        db.connect_async().await,
        Crash::BeforeCommit,
        async |conn| credit(conn, &before).await,
    )
    .await;
    assert_eq!(crashed, testing::Crashed(Crash::BeforeCommit));
    assert_eq!(
        testing::count_async(&mut check, &credits_of(&before)).await,
        0
    );
    assert!(credit(&mut check, &before).await.unwrap().is_processed());
    testing::assert_once_async(&mut check, &credits_of(&before)).await;

    let after = Credit::new(101);
    testing::crash_async(db.connect_async().await, Crash::AfterCommit, async |conn| {
        credit(conn, &after).await
    })
    .await;
    assert!(credit(&mut check, &after).await.unwrap().is_duplicate());
    testing::assert_once_async(&mut check, &credits_of(&after)).await;
}

/// A job of the application's own, async: two credits with a crash point between them.
async fn two_credit_job(
    conn: &mut AsyncConnection,
    first: &Credit,
    second: &Credit,
) -> Result<(), AppError> {
    let _ = credit(conn, first).await?;
    inbox_diesel::crash_point("between-credits");
    let _ = credit(conn, second).await?;
    Ok(())
}

/// A side effect outside the database, in claim mode.
/// A job that loops over messages: the hits of its crash point are counted across the
/// job's polls (each credit awaits the database), and `AtHit` stops it after the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_point_in_an_async_loop_stops_at_the_hit_asked_for() {
    let db = Db::new("testing_async_hits");
    let batch = [Credit::new(11), Credit::new(12), Credit::new(13)];
    async fn job(conn: &mut AsyncConnection, batch: &[Credit]) -> Result<(), AppError> {
        for msg in batch {
            let _ = credit(conn, msg).await?;
            inbox_diesel::crash_point("after-each-credit");
        }
        Ok(())
    }
    let crashed = testing::crash_async(
        db.connect_async().await,
        Crash::AtHit("after-each-credit", 2),
        async |conn| job(conn, &batch).await,
    )
    .await;
    assert_eq!(
        crashed,
        testing::Crashed(Crash::AtHit("after-each-credit", 2))
    );
    let mut check = db.connect_async().await;
    testing::assert_once_async(&mut check, &credits_of(&batch[0])).await;
    testing::assert_once_async(&mut check, &credits_of(&batch[1])).await;
    assert_eq!(
        testing::count_async(&mut check, &credits_of(&batch[2])).await,
        0
    );
    job(&mut db.connect_async().await, &batch).await.unwrap();
    for msg in &batch {
        testing::assert_once_async(&mut check, &credits_of(msg)).await;
    }
}

#[idempotent(consumer = "mail", key = msg.id, mode = "claim")]
async fn mail(
    conn: &mut AsyncConnection,
    msg: &Credit,
    sent: &std::sync::atomic::AtomicUsize,
) -> Result<(), AppError> {
    sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

/// The test kit's own crash points and clock on an async connection: the job dies between
/// its credits, and is redelivered whole; a claim's lease is ended without waiting for it;
/// a purge's retention is reached without waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_crash_points_leases_and_time_of_an_async_job() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    let db = Db::new("testing_async_own");
    let (first, second) = (Credit::new(1), Credit::new(2));
    let crashed = testing::crash_async(
        db.connect_async().await,
        Crash::At("between-credits"),
        async |conn| two_credit_job(conn, &first, &second).await,
    )
    .await;
    assert_eq!(crashed, testing::Crashed(Crash::At("between-credits")));
    let mut check = db.connect_async().await;
    testing::assert_once_async(&mut check, &credits_of(&first)).await;
    assert_eq!(
        testing::count_async(&mut check, &credits_of(&second)).await,
        0
    );
    two_credit_job(&mut db.connect_async().await, &first, &second)
        .await
        .unwrap();
    testing::assert_once_async(&mut check, &credits_of(&first)).await;
    testing::assert_once_async(&mut check, &credits_of(&second)).await;

    let sent = AtomicUsize::new(0);
    let msg = Credit::new(3);
    testing::crash_async(db.connect_async().await, Crash::AfterClaim, async |conn| {
        mail(conn, &msg, &sent).await
    })
    .await;
    let early = mail(&mut db.connect_async().await, &msg, &sent).await;
    assert!(
        !matches!(early, Ok(ref outcome) if outcome.is_processed()),
        "{early:?}"
    );
    let schema = inbox_diesel::InboxSchema::DEFAULT;
    testing::end_leases_async(&mut check, &schema).await;
    let taken = mail(&mut db.connect_async().await, &msg, &sent).await;
    assert!(taken.unwrap().is_processed());
    // (`load` of diesel-async's `RunQueryDsl` is in scope.)
    assert_eq!(AtomicUsize::load(&sent, Ordering::SeqCst), 1);

    let purge = inbox_diesel::purge::Purge::older_than(Duration::from_secs(3600));
    let report = inbox_diesel::purge::purge_async(&mut check, &schema, &purge).await;
    assert_eq!(report.unwrap().removed, 0);
    testing::pass_time_async(&mut check, &schema, Duration::from_secs(7200)).await;
    let report = inbox_diesel::purge::purge_async(&mut check, &schema, &purge).await;
    assert_eq!(report.unwrap().removed, 3);
}

/// `crash_during_async`: an async service that checks its own connection out of a bb8 pool
/// of one, crashed before its handler's commit and after it; the connection the crash left
/// in its transaction is discarded by the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_service_that_takes_its_own_connection_is_crashed_where_asked() {
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::pooled_connection::bb8::Pool;
    let db = Db::new("testing_crash_during_async");
    let pool = Pool::builder()
        .max_size(1)
        .build(AsyncDieselConnectionManager::<AsyncConnection>::new(
            db.url(),
        ))
        .await
        .unwrap();
    let service = async |msg: &Credit| credit(&mut pool.get().await.unwrap(), msg).await;
    let (first, second) = (Credit::new(1), Credit::new(2));
    assert_eq!(
        testing::crash_during_async(Crash::BeforeCommit, service(&first)).await,
        testing::Crashed(Crash::BeforeCommit)
    );
    let mut check = db.connect_async().await;
    assert_eq!(
        testing::count_async(&mut check, &credits_of(&first)).await,
        0
    );
    assert!(service(&first).await.unwrap().is_processed());
    testing::crash_during_async(Crash::AfterCommit, service(&second)).await;
    assert!(service(&second).await.unwrap().is_duplicate());
    testing::assert_once_async(&mut check, &credits_of(&first)).await;
    testing::assert_once_async(&mut check, &credits_of(&second)).await;
}
