// The async handlers under test and the tests every async backend must pass: included at
// the top of each backend's async suite, beside `Db` (the fixture) and `AsyncConnection`
// (what `Db::connect_async` returns).
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::RunQueryDsl;
use inbox_diesel::{ErrorClass, Outcome, idempotent};
use inbox_tests::{AppError, Credit, Hook, accounts, credits, users};

async fn apply_credit(conn: &mut AsyncConnection, msg: &Credit) -> diesel::QueryResult<()> {
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

#[idempotent(consumer = "credit", key = msg.id)]
async fn credit(conn: &mut AsyncConnection, msg: &Credit, hook: &Hook) -> Result<(), AppError> {
    apply_credit(conn, msg).await?;
    if let Some(runs) = &hook.runs {
        runs.fetch_add(1, Ordering::SeqCst);
    }
    if let Some((holding, go)) = &hook.hold {
        holding.notify_one();
        go.notified().await;
    }
    if hook.swallow_an_error {
        let swallowed = diesel::sql_query("INSERT INTO no_such_table VALUES (1)")
            .execute(conn)
            .await;
        assert!(swallowed.is_err());
    }
    if let Some(email) = &hook.insert_user {
        diesel::insert_into(users::table)
            .values(users::email.eq(email))
            .execute(conn)
            .await?;
    }
    if hook.reject {
        return Err(AppError::Rejected);
    }
    Ok(())
}

async fn count_credits(conn: &mut AsyncConnection, msg: &Credit) -> i64 {
    credits::table
        .filter(credits::message.eq(msg.id.to_string()))
        .count()
        .get_result(conn)
        .await
        .unwrap()
}

async fn count_markers(conn: &mut AsyncConnection) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query("SELECT count(*) AS n FROM inbox")
        .get_result::<Count>(conn)
        .await
        .unwrap()
        .n
}

async fn balance(conn: &mut AsyncConnection, account: i32) -> i64 {
    accounts::table
        .find(account)
        .select(accounts::balance)
        .first(conn)
        .await
        .unwrap()
}

/// The concurrent-delivery race on tokio's multi-threaded runtime: 8 tasks on their own
/// connections each receive every one of 200 messages, released together by a barrier.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn async_race_applies_each_message_once() {
    const INSTANCES: usize = 8;
    const MESSAGES: u128 = 200;
    let db = <Db>::new("async_race");
    let barrier = Arc::new(tokio::sync::Barrier::new(INSTANCES));
    let mut tasks = Vec::new();
    for _ in 0..INSTANCES {
        let mut conn = db.connect_async().await;
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            // Failures are collected, not panicked on: a task that stopped would
            // leave the others waiting at the barrier for ever.
            let (mut processed, mut duplicates, mut failures) = (0, 0, Vec::new());
            for n in 0..MESSAGES {
                barrier.wait().await;
                match credit(&mut conn, &Credit::new(n), &Hook::default()).await {
                    Ok(Outcome::Processed(())) => processed += 1,
                    Ok(Outcome::Duplicate { .. }) => duplicates += 1,
                    Err(e) => failures.push(format!("delivery of message {n} failed: {e:?}")),
                }
            }
            (processed, duplicates, failures)
        }));
    }
    let (mut processed, mut duplicates, mut failures) = (0, 0, Vec::new());
    for task in tasks {
        let (p, d, f) = task.await.unwrap();
        processed += p;
        duplicates += d;
        failures.extend(f);
    }
    assert_eq!(failures, Vec::<String>::new());
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
    assert_eq!(processed, MESSAGES as usize);
    assert_eq!(duplicates, (INSTANCES - 1) * MESSAGES as usize);
}

#[tokio::test(flavor = "multi_thread")]
async fn async_startup_check_passes_and_finds_a_missing_table() {
    use inbox_diesel::InboxSchema;
    use inbox_diesel::schema::verify_async;
    let db = <Db>::new("async_startup_check");
    let mut conn = db.connect_async().await;
    verify_async(&mut conn, &InboxSchema::DEFAULT)
        .await
        .unwrap();
    let elsewhere = InboxSchema::new("no_such_inbox", "ux_inbox_message_consumer").unwrap();
    let missing = verify_async(&mut conn, &elsewhere)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("table `no_such_inbox` does not exist"),
        "{missing}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn async_redelivery_is_a_duplicate_and_the_body_does_not_run() {
    let db = <Db>::new("async_redelivery");
    let mut conn = db.connect_async().await;
    let msg = Credit::new(1);
    let runs = Arc::new(AtomicUsize::new(0));
    let hook = Hook {
        runs: Some(runs.clone()),
        ..Hook::default()
    };
    assert_eq!(
        credit(&mut conn, &msg, &hook).await.unwrap(),
        Outcome::Processed(())
    );
    assert!(credit(&mut conn, &msg, &hook).await.unwrap().is_duplicate());
    // Written out: `runs.load(..)` would be diesel-async's `RunQueryDsl::load`.
    assert_eq!(AtomicUsize::load(&runs, Ordering::SeqCst), 1);
    assert_eq!(count_credits(&mut conn, &msg).await, 1);
    assert_eq!(count_markers(&mut conn).await, 1);
}

/// A handler error rolls back the marker with the work; the redelivery processes.
#[tokio::test(flavor = "multi_thread")]
async fn async_handler_error_leaves_no_marker_and_redelivery_processes() {
    let db = <Db>::new("async_handler_error");
    let mut conn = db.connect_async().await;
    let msg = Credit::new(1);
    let reject = Hook {
        reject: true,
        ..Hook::default()
    };
    assert!(matches!(
        credit(&mut conn, &msg, &reject).await,
        Err(AppError::Rejected)
    ));
    assert_eq!(count_markers(&mut conn).await, 0);
    assert_eq!(count_credits(&mut conn, &msg).await, 0);
    assert_eq!(
        credit(&mut conn, &msg, &Hook::default()).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(count_markers(&mut conn).await, 1);
    assert_eq!(balance(&mut conn, 1).await, 10);
}

/// A business unique violation is an error with its index's name, also on redelivery.
#[tokio::test(flavor = "multi_thread")]
async fn async_business_unique_violation_is_an_error_with_its_name() {
    let db = <Db>::new("async_business_violation");
    let mut conn = db.connect_async().await;
    diesel::insert_into(users::table)
        .values(users::email.eq("a@example.com"))
        .execute(&mut conn)
        .await
        .unwrap();
    let hook = Hook {
        insert_user: Some("a@example.com".into()),
        ..Hook::default()
    };
    for attempt in 0..2 {
        let result = credit(&mut conn, &Credit::new(1), &hook).await;
        let Err(AppError::Db(error)) = result else {
            panic!("attempt {attempt}: expected the business violation, got {result:?}");
        };
        match inbox_diesel::classify(&error, &inbox_diesel::InboxSchema::DEFAULT) {
            ErrorClass::UniqueViolation {
                constraint: Some(name),
            } => {
                assert!(
                    name.contains("ux_users_email") || name == "users.email",
                    "{name}"
                )
            }
            other => panic!("expected a named unique violation, got {other:?}"),
        }
    }
    assert_eq!(count_markers(&mut conn).await, 0);
    assert_eq!(balance(&mut conn, 1).await, 0);
}

/// `purge_async` of 100 000 completed markers beside a live async consumer, which
/// keeps committing while the purge runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn async_purge_of_a_large_table_beside_a_live_consumer() {
    use diesel_async::SimpleAsyncConnection;
    use inbox_diesel::purge::{Purge, purge_async};
    const ARCHIVE: u32 = 100_000;
    let db = <Db>::new("async_purge_large_table");
    db.seed_archive(ARCHIVE);
    let purging = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let during_purge = Arc::new(AtomicUsize::new(0));
    let mut consumer_conn = db.connect_async().await;
    let consumer = tokio::spawn({
        let (purging, during_purge) = (purging.clone(), during_purge.clone());
        async move {
            let mut n = 0;
            while std::sync::atomic::AtomicBool::load(&purging, Ordering::SeqCst) {
                n += 1;
                let outcome = credit(&mut consumer_conn, &Credit::new(n), &Hook::default()).await;
                assert!(outcome.unwrap().is_processed());
                if std::sync::atomic::AtomicBool::load(&purging, Ordering::SeqCst) {
                    during_purge.fetch_add(1, Ordering::SeqCst);
                }
            }
            n
        }
    });
    while AtomicUsize::load(&during_purge, Ordering::SeqCst) == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let mut conn = db.connect_async().await;
    // SQLite: the purge's deletes wait for the consumer's transactions, not fail.
    let _ = conn.batch_execute("PRAGMA busy_timeout = 5000").await;
    let before = AtomicUsize::load(&during_purge, Ordering::SeqCst);
    let day = std::time::Duration::from_secs(86_400);
    // Spawned: the purge's future is `Send`.
    let (report, mut conn) = tokio::spawn(async move {
        let report = purge_async(
            &mut conn,
            &inbox_diesel::InboxSchema::DEFAULT,
            &Purge::older_than(day),
        )
        .await;
        (report, conn)
    })
    .await
    .unwrap();
    let report = report.unwrap();
    let while_purging = AtomicUsize::load(&during_purge, Ordering::SeqCst) - before;
    purging.store(false, Ordering::SeqCst);
    let processed = consumer.await.unwrap();
    assert!(report.ran);
    assert_eq!(report.removed, u64::from(ARCHIVE));
    assert_eq!(report.stale_claims, 3);
    assert!(
        while_purging > 0,
        "the consumer committed nothing while the purge ran"
    );
    let stale = inbox_diesel::purge::stale_claims_async(
        &mut conn,
        &inbox_diesel::InboxSchema::DEFAULT,
        day,
        2,
    )
    .await
    .unwrap();
    assert_eq!(stale.len(), 2, "the limit: {stale:?}");
    assert!(
        stale
            .iter()
            .all(|c| c.consumer == "archive" && c.attempts == 1)
    );
    assert_eq!(count_markers(&mut conn).await, processed as i64 + 3);
}

/// A handler future dropped while its body awaits, on a pooled connection: nothing
/// commits, the pool never hands out the connection inside the open transaction, and
/// the redelivery processes the message.
#[tokio::test(flavor = "multi_thread")]
async fn async_cancelled_handler_commits_nothing_and_the_pool_recovers() {
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::pooled_connection::deadpool::Pool;
    let db = <Db>::new("async_cancelled");
    let manager = AsyncDieselConnectionManager::<AsyncConnection>::new(db.url());
    let pool = Pool::builder(manager).max_size(1).build().unwrap();
    let msg = Credit::new(1);
    let holding = Arc::new(tokio::sync::Notify::new());
    let never = Arc::new(tokio::sync::Notify::new());
    let hook = Hook {
        hold: Some((holding.clone(), never.clone())),
        ..Hook::default()
    };
    {
        let mut pooled = pool.get().await.unwrap();
        let handler = credit(&mut pooled, &msg, &hook);
        tokio::select! {
            _ = handler => panic!("the handler cannot finish: its body waits forever"),
            _ = holding.notified() => {}
        }
        // The handler future is dropped here, inside its transaction, after its
        // marker and its credit were written.
    }
    let mut pooled = pool.get().await.unwrap();
    assert_eq!(count_markers(&mut pooled).await, 0);
    assert_eq!(count_credits(&mut pooled, &msg).await, 0);
    assert_eq!(
        credit(&mut pooled, &msg, &Hook::default()).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(count_markers(&mut pooled).await, 1);
    assert_eq!(balance(&mut pooled, 1).await, 10);
}

/// bb8 closes a connection that comes back inside a transaction, so a cancelled
/// handler's transaction ends at once: a redelivery on another pooled connection does
/// not wait on the locks it held (on SQLite, the whole database).
#[tokio::test(flavor = "multi_thread")]
async fn async_cancelled_handler_on_bb8_releases_its_locks_at_once() {
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::pooled_connection::bb8::Pool;
    let db = <Db>::new("async_cancelled_bb8");
    let manager = AsyncDieselConnectionManager::<AsyncConnection>::new(db.url());
    let pool = Pool::builder().max_size(2).build(manager).await.unwrap();
    let msg = Credit::new(1);
    let holding = Arc::new(tokio::sync::Notify::new());
    let hook = Hook {
        hold: Some((holding.clone(), Arc::new(tokio::sync::Notify::new()))),
        ..Hook::default()
    };
    {
        let mut pooled = pool.get().await.unwrap();
        tokio::select! {
            _ = credit(&mut pooled, &msg, &hook) => panic!("the body waits forever"),
            _ = holding.notified() => {}
        }
    }
    let mut other = pool.get().await.unwrap();
    let redelivery = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        credit(&mut other, &msg, &Hook::default()),
    )
    .await
    .expect("the redelivery waited on the abandoned transaction's locks");
    assert_eq!(redelivery.unwrap(), Outcome::Processed(()));
    assert_eq!(count_markers(&mut other).await, 1);
    assert_eq!(count_credits(&mut other, &msg).await, 1);
}

/// Without a pool, a connection left in a cancelled handler's transaction: the next
/// handler call rolls that transaction back (the runtime's own, nothing of it committed)
/// and runs in a transaction of its own — not refused as called inside the caller's, nor
/// run inside the abandoned one.
#[tokio::test(flavor = "multi_thread")]
async fn async_cancelled_handler_is_rolled_back_by_the_next_on_a_bare_connection() {
    let db = <Db>::new("async_cancelled_bare");
    let mut conn = db.connect_async().await;
    let msg = Credit::new(1);
    let holding = Arc::new(tokio::sync::Notify::new());
    let hook = Hook {
        hold: Some((holding.clone(), Arc::new(tokio::sync::Notify::new()))),
        ..Hook::default()
    };
    tokio::select! {
        _ = credit(&mut conn, &msg, &hook) => panic!("the body waits forever"),
        _ = holding.notified() => {}
    }
    let next = credit(&mut conn, &Credit::new(2), &Hook::default()).await;
    assert_eq!(next.unwrap(), Outcome::Processed(()));
    let mut fresh = db.connect_async().await;
    assert_eq!(count_markers(&mut fresh).await, 1);
    assert_eq!(count_credits(&mut fresh, &msg).await, 0);
    let again = credit(&mut conn, &msg, &Hook::default()).await;
    assert_eq!(again.unwrap(), Outcome::Processed(()));
    assert_eq!(count_credits(&mut fresh, &msg).await, 1);
}
