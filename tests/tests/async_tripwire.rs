//! The run-time tripwire on the async runtime, on SQLite through diesel-async: a helper
//! called by an `async fn` `#[idempotent]` handler checks a connection out of a deadpool or
//! a bb8 pool and writes. The mark is set at each poll of the body and cleared after it.

use std::sync::{Arc, Mutex};

use diesel::{ExpressionMethods, QueryResult, SqliteConnection};
use diesel_async::RunQueryDsl;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use inbox_diesel::tripwire::{self, InsideHandler, OnTrip};
use inbox_diesel::{InFlightOutcome, Outcome, idempotent};
use inbox_tests::sqlite::SqliteDb;
use inbox_tests::tripwire::{AuditDb, Logged, TripError, audit, panic_message, rows};
use inbox_tests::{Credit, credits};

type Conn = SyncConnectionWrapper<SqliteConnection>;
type Manager = AsyncDieselConnectionManager<Conn>;
type Deadpool = diesel_async::pooled_connection::deadpool::Pool<Conn>;
type Bb8 = diesel_async::pooled_connection::bb8::Pool<Conn>;

#[derive(Debug, Clone, Copy)]
enum Which {
    Deadpool,
    Bb8,
}

/// What a service hands its handlers: the audit trail's pools, guarded.
struct Services {
    deadpool: tripwire::deadpool::GuardedPool<Manager>,
    bb8: tripwire::bb8::GuardedPool<Manager>,
}

/// The same, with the plain pools: only their hooks can see their checkouts.
#[derive(Clone)]
struct PlainServices {
    deadpool: Deadpool,
    bb8: Bb8,
}

/// A helper as services write them: given the services, it checks its own connection out.
async fn record(services: &Services, which: Which, msg: &Credit) -> Result<(), TripError> {
    match which {
        Which::Deadpool => write_audit(&mut *services.deadpool.get().await?, msg).await,
        Which::Bb8 => write_audit(&mut *services.bb8.get().await?, msg).await,
    }
}

async fn record_plain(
    services: &PlainServices,
    which: Which,
    msg: &Credit,
) -> Result<(), TripError> {
    match which {
        Which::Deadpool => write_audit(&mut *services.deadpool.get().await?, msg).await,
        Which::Bb8 => write_audit(&mut *services.bb8.get().await?, msg).await,
    }
}

async fn write_audit(conn: &mut Conn, msg: &Credit) -> Result<(), TripError> {
    diesel::insert_into(audit::table)
        .values(audit::message.eq(msg.id.to_string()))
        .execute(conn)
        .await?;
    Ok(())
}

/// The business write, in the handler's transaction.
async fn credit(conn: &mut Conn, msg: &Credit) -> QueryResult<usize> {
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.id.to_string()),
            credits::account.eq(msg.account),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)
        .await
}

#[idempotent(consumer = "async-credit-audited", key = msg.id)]
async fn credit_audited(
    conn: &mut Conn,
    services: &Services,
    which: Which,
    msg: &Credit,
) -> Result<(), TripError> {
    credit(conn, msg).await?;
    record(services, which, msg).await?;
    Ok(())
}

#[idempotent(consumer = "async-credit-plain", key = msg.id)]
async fn credit_plain(
    conn: &mut Conn,
    services: &PlainServices,
    which: Which,
    msg: &Credit,
) -> Result<(), TripError> {
    credit(conn, msg).await?;
    record_plain(services, which, msg).await?;
    Ok(())
}

async fn deadpool(audit: &AuditDb, hooks: Option<OnTrip>) -> Deadpool {
    let builder = Deadpool::builder(Manager::new(audit.url())).max_size(2);
    let builder = match hooks {
        Some(on) => builder
            .post_create(tripwire::deadpool::hook(on))
            .post_recycle(tripwire::deadpool::hook(on)),
        None => builder,
    };
    let pool = builder.build().unwrap();
    // Two connections open and idle, as in a pool that has served requests.
    let (a, b) = (pool.get().await.unwrap(), pool.get().await.unwrap());
    drop((a, b));
    pool
}

async fn bb8(audit: &AuditDb, check: Option<OnTrip>) -> Bb8 {
    let mut config = ManagerConfig::default();
    if let Some(on) = check {
        config.recycling_method = tripwire::bb8::recycling_method(on, RecyclingMethod::Verified);
    }
    let manager = Manager::new_with_config(audit.url(), config);
    let pool = Bb8::builder().max_size(2).build(manager).await.unwrap();
    let (a, b) = (pool.get().await.unwrap(), pool.get().await.unwrap());
    drop((a, b));
    pool
}

async fn plain_services(audit: &AuditDb, on: Option<OnTrip>) -> PlainServices {
    PlainServices {
        deadpool: deadpool(audit, on).await,
        bb8: bb8(audit, on).await,
    }
}

/// What the pools say about themselves: open and idle connections, and for bb8 the
/// checkouts started.
fn pool_state(services: &PlainServices) -> [u64; 5] {
    let (deadpool, bb8) = (services.deadpool.status(), services.bb8.state());
    [
        deadpool.size as u64,
        deadpool.available as u64,
        bb8.connections.into(),
        bb8.idle_connections.into(),
        bb8.statistics.get_started,
    ]
}

/// The guarded pools refuse the helper's checkout with an error: the handler returns it and
/// rolls back, nothing reaches the audit database, the pool is as it was, and it serves
/// checkouts outside the handler.
#[tokio::test]
async fn deadpool_and_bb8_checkouts_inside_a_handler_are_refused() {
    for which in [Which::Deadpool, Which::Bb8] {
        let (db, audit) = (SqliteDb::new("async_refused"), AuditDb::new());
        let plain = plain_services(&audit, None).await;
        let services = Services {
            deadpool: tripwire::deadpool::GuardedPool::new(plain.deadpool.clone()),
            bb8: tripwire::bb8::GuardedPool::new(plain.bb8.clone()),
        };
        let before = pool_state(&plain);
        let mut conn = db.connect_async().await;
        let msg = Credit::new(1);

        match credit_audited(&mut conn, &services, which, &msg).await {
            Err(TripError::Inbox(error @ inbox_diesel::Error::CheckoutInsideHandler(inside))) => {
                assert_eq!(error.class(), inbox_diesel::ErrorClass::Misuse, "{which:?}");
                assert_eq!(inside.consumer(), "async-credit-audited", "{which:?}")
            }
            other => panic!("{which:?}: expected the checkout refused, got {other:?}"),
        }
        assert_eq!(audit.rows(), 0, "{which:?}: the helper's write never ran");
        let mut check = db.connect();
        assert_eq!(
            (rows(&mut check, "inbox"), rows(&mut check, "credits")),
            (0, 0)
        );
        assert_eq!(
            pool_state(&plain),
            before,
            "{which:?}: the pool was not touched"
        );
        assert_eq!(tripwire::inside_handler(), None);

        // The pool keeps working, outside the handler.
        record(&services, which, &msg).await.unwrap();
        assert_eq!(audit.rows(), 1, "{which:?}");
    }
}

/// Outside any handler, neither the guarded pools nor the hooks — set to panic — stand in
/// the way.
#[tokio::test]
async fn deadpool_and_bb8_checkouts_outside_a_handler_are_not_affected() {
    let audit = AuditDb::new();
    let plain = plain_services(&audit, Some(OnTrip::Panic)).await;
    let services = Services {
        deadpool: tripwire::deadpool::GuardedPool::new(plain.deadpool.clone()),
        bb8: tripwire::bb8::GuardedPool::new(plain.bb8.clone()),
    };
    let msg = Credit::new(1);
    for which in [Which::Deadpool, Which::Bb8] {
        record(&services, which, &msg).await.unwrap();
        record_plain(&plain, which, &msg).await.unwrap();
    }
    assert!(services.bb8.get_owned().await.is_ok());
    assert_eq!(audit.rows(), 4);
}

/// The hooks cannot return an error that keeps the connection: with `OnTrip::Panic` they
/// panic inside the pool's `get`, in the handler's task. The helper never holds the
/// connection and its write never runs; the pool closes that one connection and keeps
/// working.
#[tokio::test]
async fn deadpool_and_bb8_hooks_panic_at_a_checkout_of_the_plain_pool() {
    for which in [Which::Deadpool, Which::Bb8] {
        let (db, audit) = (Arc::new(SqliteDb::new("async_panic")), AuditDb::new());
        let plain = plain_services(&audit, Some(OnTrip::Panic)).await;
        let task = tokio::spawn({
            let (db, plain) = (db.clone(), plain.clone());
            async move {
                let mut conn = db.connect_async().await;
                credit_plain(&mut conn, &plain, which, &Credit::new(1)).await
            }
        });
        let panicked = task.await.expect_err("the checkout panics").into_panic();
        let message = panic_message(&*panicked);
        assert!(
            message.contains("`async-credit-plain`"),
            "{which:?}: {message}"
        );
        // The task ran on this thread: the unwinding put the mark back.
        assert_eq!(tripwire::inside_handler(), None);

        assert_eq!(audit.rows(), 0, "{which:?}: the helper's write never ran");
        let mut check = db.connect();
        assert_eq!(
            (rows(&mut check, "inbox"), rows(&mut check, "credits")),
            (0, 0)
        );
        match which {
            Which::Deadpool => assert_eq!(plain.deadpool.status().size, 1, "one closed"),
            Which::Bb8 => assert_eq!(
                plain.bb8.state().statistics.connections_closed_broken,
                1,
                "one closed"
            ),
        }
        record_plain(&plain, which, &Credit::new(1)).await.unwrap();
        assert_eq!(audit.rows(), 1, "{which:?}: the pool keeps working");
    }
}

/// With `OnTrip::Log` the hooks report the checkout at error level, naming the handler,
/// and let it through without closing anything: the write commits on its own.
#[tokio::test]
async fn deadpool_and_bb8_hooks_log_a_checkout_of_the_plain_pool() {
    for which in [Which::Deadpool, Which::Bb8] {
        let (db, audit) = (SqliteDb::new("async_log"), AuditDb::new());
        let plain = plain_services(&audit, Some(OnTrip::Log)).await;
        let mut conn = db.connect_async().await;
        let logged = Logged::capture();

        record_plain(&plain, which, &Credit::new(1)).await.unwrap();
        assert_eq!(
            logged.text(),
            "",
            "{which:?}: nothing to report outside a handler"
        );
        let outcome = credit_plain(&mut conn, &plain, which, &Credit::new(2)).await;
        assert_eq!(outcome.unwrap(), Outcome::Processed(()));
        assert_eq!(audit.rows(), 2, "{which:?}: reported, not refused");
        let text = logged.text();
        assert!(text.contains("ERROR"), "{which:?}: {text}");
        assert!(
            text.contains("consumer=\"async-credit-plain\""),
            "{which:?}: {text}"
        );
        let [deadpool_size, _, bb8_connections, _, _] = pool_state(&plain);
        assert_eq!((deadpool_size, bb8_connections), (2, 2), "nothing closed");
    }
}

/// How a body under test ends.
#[derive(Debug, Clone, Copy)]
enum Ending {
    Ok,
    Err,
    Panic,
}

/// Records the mark after an `.await` that yields: the mark is set again at the poll that
/// resumes the body.
#[idempotent(consumer = "async-mark", key = msg.id)]
async fn marked(
    conn: &mut Conn,
    msg: &Credit,
    seen: &Mutex<Option<InsideHandler>>,
    ending: Ending,
) -> Result<(), TripError> {
    credit(conn, msg).await?;
    tokio::task::yield_now().await;
    *seen.lock().unwrap() = tripwire::inside_handler();
    match ending {
        Ending::Ok => Ok(()),
        Ending::Err => Err(TripError::Failed),
        Ending::Panic => panic!("the body panics"),
    }
}

fn consumer(seen: &Mutex<Option<InsideHandler>>) -> Option<&'static str> {
    seen.lock().unwrap().take().map(|inside| inside.consumer())
}

/// The body runs under its handler's mark, and the mark is gone when the handler returns
/// `Ok`, returns `Err`, or unwinds from a panic (in a task of this thread).
#[tokio::test]
async fn async_the_mark_is_set_in_the_body_and_cleared_after_ok_err_and_panic() {
    let db = Arc::new(SqliteDb::new("async_mark_endings"));
    let seen = Arc::new(Mutex::new(None));
    let mut conn = db.connect_async().await;

    let ok = marked(&mut conn, &Credit::new(1), &seen, Ending::Ok).await;
    assert_eq!(ok.unwrap(), Outcome::Processed(()));
    assert_eq!(consumer(&seen), Some("async-mark"));
    assert_eq!(tripwire::inside_handler(), None, "after Ok");

    let err = marked(&mut conn, &Credit::new(2), &seen, Ending::Err).await;
    assert!(matches!(err, Err(TripError::Failed)), "{err:?}");
    assert_eq!(consumer(&seen), Some("async-mark"));
    assert_eq!(tripwire::inside_handler(), None, "after Err");

    let task = tokio::spawn({
        let (db, seen) = (db.clone(), seen.clone());
        async move {
            let mut conn = db.connect_async().await;
            marked(&mut conn, &Credit::new(3), &seen, Ending::Panic).await
        }
    });
    let panicked = task.await.expect_err("the body panics").into_panic();
    assert_eq!(panic_message(&*panicked), "the body panics");
    assert_eq!(consumer(&seen), Some("async-mark"));
    assert_eq!(tripwire::inside_handler(), None, "after a panic");
}

#[idempotent(consumer = "async-mark-waiting", key = msg.id)]
async fn marked_waiting(
    conn: &mut Conn,
    msg: &Credit,
    entered: &tokio::sync::Notify,
    release: &tokio::sync::Notify,
    seen: &Mutex<Option<InsideHandler>>,
) -> Result<(), TripError> {
    credit(conn, msg).await?;
    entered.notify_one();
    release.notified().await;
    *seen.lock().unwrap() = tripwire::inside_handler();
    Ok(())
}

/// While the body waits, the code the thread runs in between — here another future of the
/// same task — is not marked; the body is again when it resumes.
#[tokio::test]
async fn async_code_polled_between_the_body_polls_is_not_marked() {
    let db = SqliteDb::new("async_mark_between");
    let mut conn = db.connect_async().await;
    let (entered, release) = (tokio::sync::Notify::new(), tokio::sync::Notify::new());
    let (msg, seen) = (Credit::new(1), Mutex::new(None));
    let handler = marked_waiting(&mut conn, &msg, &entered, &release, &seen);
    let observer = async {
        entered.notified().await;
        let observed = tripwire::inside_handler();
        release.notify_one();
        observed
    };
    let (outcome, observed) = tokio::join!(handler, observer);
    assert_eq!(outcome.unwrap(), Outcome::Processed(()));
    assert_eq!(observed, None, "between the body's polls");
    assert_eq!(consumer(&seen), Some("async-mark-waiting"));
}

// The expansion slices the batch parameter (`&msgs[..]`), which clippy calls redundant on a
// `&[_]` written outside a macro_rules! suite.
#[idempotent(consumer = "async-mark-batch", batch = msgs, key = |msg| msg.id)]
async fn marked_batch(
    conn: &mut Conn,
    msgs: &[Credit],
    seen: &Mutex<Option<InsideHandler>>,
) -> Result<(), TripError> {
    for msg in msgs {
        credit(conn, msg).await?;
    }
    *seen.lock().unwrap() = tripwire::inside_handler();
    Ok(())
}

#[idempotent(consumer = "async-mark-claim", key = msg.id, mode = "claim")]
async fn marked_claim(
    _conn: &mut Conn,
    msg: &Credit,
    seen: &Mutex<Option<InsideHandler>>,
) -> Result<(), TripError> {
    tokio::task::yield_now().await;
    *seen.lock().unwrap() = tripwire::inside_handler();
    Ok(())
}

/// A batch's body and a claim-mode body run under the mark too.
#[tokio::test]
async fn async_the_mark_covers_batch_and_claim_bodies() {
    let db = SqliteDb::new("async_mark_modes");
    let mut conn = db.connect_async().await;
    let seen = Mutex::new(None);

    let batch = marked_batch(&mut conn, &[Credit::new(1), Credit::new(2)], &seen).await;
    assert_eq!(batch.unwrap().processed, vec![0, 1]);
    assert_eq!(consumer(&seen), Some("async-mark-batch"));

    let claimed = marked_claim(&mut conn, &Credit::new(3), &seen).await;
    assert_eq!(claimed.unwrap(), InFlightOutcome::Processed(()));
    assert_eq!(consumer(&seen), Some("async-mark-claim"));
    assert_eq!(tripwire::inside_handler(), None);
}
