// Claim mode's tests, async, on one backend: included by each backend's async suite into a
// module that names `Db` (the fixture), `AsyncConnection` (what `Db::connect_async` returns)
// and `inbox` (the backend's `table!`).
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::RunQueryDsl;
use inbox_diesel::{InFlightOutcome, idempotent};
use inbox_tests::claim::ClaimHook;
use inbox_tests::{AppError, Credit};
use tokio::sync::Notify;

#[idempotent(consumer = "email", key = msg.id, mode = "claim", lease_ms = 1500)]
async fn send(conn: &mut AsyncConnection, msg: &Credit, hook: &ClaimHook) -> Result<(), AppError> {
    if let Some((holding, go)) = &hook.hold {
        holding.notify_one();
        go.notified().await;
    }
    if hook.fail {
        return Err(AppError::Rejected);
    }
    hook.sent.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// The lease of `send`, plus a margin for a slow machine.
const PAST_THE_LEASE: Duration = Duration::from_millis(2_000);

/// The one claim row of a test: (completed, leased, attempts).
async fn row(conn: &mut AsyncConnection) -> (bool, bool, i32) {
    inbox::table
        .filter(inbox::consumer.eq("email"))
        .select((
            inbox::processed_at.is_not_null(),
            inbox::claimed_until.is_not_null(),
            inbox::attempts,
        ))
        .first(conn)
        .await
        .unwrap()
}

/// A hook that holds the body before its side effect: (hook, holding, go).
fn held(sent: &Arc<AtomicUsize>) -> (ClaimHook, Arc<Notify>, Arc<Notify>) {
    let (holding, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let hook = ClaimHook {
        sent: sent.clone(),
        hold: Some((holding.clone(), go.clone())),
        ..ClaimHook::default()
    };
    (hook, holding, go)
}

/// Four tasks on their own connections receive each of 30 messages at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn async_claim_race_runs_the_side_effect_once() {
    const INSTANCES: usize = 4;
    const MESSAGES: u128 = 30;
    let db = <Db>::new("async_claim_race");
    let barrier = Arc::new(tokio::sync::Barrier::new(INSTANCES));
    let hook = ClaimHook::default();
    let mut tasks = Vec::new();
    for _ in 0..INSTANCES {
        let mut conn = db.connect_async().await;
        let (barrier, hook) = (barrier.clone(), hook.clone());
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for n in 0..MESSAGES {
                barrier.wait().await;
                outcomes.push(send(&mut conn, &Credit::new(n), &hook).await);
            }
            outcomes
        }));
    }
    let mut processed = 0;
    for task in tasks {
        for outcome in task.await.unwrap() {
            match outcome.expect("no delivery fails") {
                InFlightOutcome::Processed(()) => processed += 1,
                InFlightOutcome::InFlight { .. } | InFlightOutcome::Duplicate { .. } => {}
            }
        }
    }
    assert_eq!(processed, MESSAGES as usize);
    assert_eq!(
        AtomicUsize::load(&hook.sent, Ordering::SeqCst),
        MESSAGES as usize
    );
    let mut conn = db.connect_async().await;
    let completed: i64 = inbox::table
        .filter(inbox::processed_at.is_not_null())
        .filter(inbox::attempts.eq(1))
        .count()
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!(completed, MESSAGES as i64);
}

#[tokio::test(flavor = "multi_thread")]
async fn async_side_effect_error_releases_the_claim_and_the_retry_succeeds() {
    let db = <Db>::new("async_claim_release");
    let mut conn = db.connect_async().await;
    let msg = Credit::new(1);
    let failing = ClaimHook {
        fail: true,
        ..ClaimHook::default()
    };
    let failed = send(&mut conn, &msg, &failing).await;
    assert!(matches!(failed, Err(AppError::Rejected)), "{failed:?}");
    assert_eq!(row(&mut conn).await, (false, false, 1));
    let hook = ClaimHook::default();
    assert_eq!(
        send(&mut conn, &msg, &hook).await.unwrap(),
        InFlightOutcome::Processed(())
    );
    assert_eq!(AtomicUsize::load(&hook.sent, Ordering::SeqCst), 1);
    assert_eq!(row(&mut conn).await, (true, false, 2));
}

/// The handler's future is dropped between the claim and the side effect — the
/// process's work is gone. Redeliveries see the claim in flight until its lease
/// ends; then one takes it over and completes.
#[tokio::test(flavor = "multi_thread")]
async fn async_dropped_after_claim_is_in_flight_until_the_lease_ends_then_reclaimed() {
    let db = <Db>::new("async_claim_dropped");
    let mut conn = db.connect_async().await;
    let msg = Credit::new(1);
    let sent = Arc::new(AtomicUsize::new(0));
    let (hook, holding, _go) = held(&sent);
    tokio::select! {
        _ = send(&mut conn, &msg, &hook) => panic!("the body is held"),
        _ = holding.notified() => {}
    }
    assert_eq!(row(&mut conn).await, (false, true, 1));
    let hook = ClaimHook {
        sent: sent.clone(),
        ..ClaimHook::default()
    };
    let redelivered = send(&mut conn, &msg, &hook).await.unwrap();
    // The lease the dropped claim holds yet: waiting it out is enough.
    let lease_left = inbox_tests::claim::lease_left(&redelivered, Duration::from_millis(1_500));
    assert!(lease_left > Duration::from_millis(500), "{lease_left:?}");
    tokio::time::sleep(lease_left).await;
    assert_eq!(
        send(&mut conn, &msg, &hook).await.unwrap(),
        InFlightOutcome::Processed(())
    );
    assert_eq!(AtomicUsize::load(&sent, Ordering::SeqCst), 1);
    assert_eq!(row(&mut conn).await, (true, false, 2));
}

/// A's body outlives its lease and B takes the claim over: A's stamp finds the
/// claim is B's and writes nothing; B stamps the work.
#[tokio::test(flavor = "multi_thread")]
async fn async_stolen_claim_is_never_stamped_by_the_instance_that_lost_it() {
    let db = <Db>::new("async_claim_stolen");
    let sent = Arc::new(AtomicUsize::new(0));
    let (a_hook, a_holding, a_go) = held(&sent);
    let (b_hook, b_holding, b_go) = held(&sent);
    let mut a_conn = db.connect_async().await;
    let a = tokio::spawn(async move { send(&mut a_conn, &Credit::new(1), &a_hook).await });
    a_holding.notified().await;
    tokio::time::sleep(PAST_THE_LEASE).await;
    let mut b_conn = db.connect_async().await;
    let b = tokio::spawn(async move { send(&mut b_conn, &Credit::new(1), &b_hook).await });
    b_holding.notified().await;
    let mut conn = db.connect_async().await;
    assert_eq!(row(&mut conn).await, (false, true, 2), "B holds attempt 2");
    a_go.notify_one();
    let lost = a.await.unwrap();
    assert!(
        matches!(
            lost,
            Err(AppError::Inbox(inbox_diesel::Error::ClaimLost {
                attempt: 1
            }))
        ),
        "{lost:?}"
    );
    assert_eq!(row(&mut conn).await, (false, true, 2), "A stamped nothing");
    b_go.notify_one();
    assert_eq!(b.await.unwrap().unwrap(), InFlightOutcome::Processed(()));
    assert_eq!(row(&mut conn).await, (true, false, 2));
    assert_eq!(AtomicUsize::load(&sent, Ordering::SeqCst), 2);
}

/// The old version of `send`'s consumer, in transaction mode, as a rolling deploy runs it
/// beside the new one.
#[idempotent(consumer = "email", key = msg.id)]
async fn record_in_transaction(
    conn: &mut AsyncConnection,
    msg: &Credit,
    recorded: &AtomicUsize,
) -> Result<(), AppError> {
    recorded.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// One consumer run in both modes, async: a claim whose holder died is no duplicate for a
/// transaction-mode handler — refused within its lease to be retried later, with an alert
/// past it, a duplicate once claim mode completed it (`claim.rs` has the sync twin, with a
/// batch).
#[tokio::test(flavor = "multi_thread")]
async fn async_a_claim_of_claim_mode_is_not_a_duplicate_for_another_mode() {
    use inbox_diesel::{Action, ErrorClass};
    let db = <Db>::new("async_claim_mixed_modes");
    let mut conn = db.connect_async().await;
    let (msg, recorded) = (Credit::new(1), AtomicUsize::new(0));
    let sent = Arc::new(AtomicUsize::new(0));
    let (hook, holding, _go) = held(&sent);
    tokio::select! {
        _ = send(&mut conn, &msg, &hook) => panic!("the body is held"),
        _ = holding.notified() => {}
    }
    // The process is gone with its connection; the claim stays.
    drop(conn);
    let mut conn = db.connect_async().await;
    let class = |answer: Result<inbox_diesel::Outcome<()>, AppError>| match answer {
        Err(AppError::Inbox(e @ inbox_diesel::Error::OpenClaim { .. })) => {
            (e.class(), e.class().action())
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(
        class(record_in_transaction(&mut conn, &msg, &recorded).await),
        (ErrorClass::ClaimLost, Action::RetryLater)
    );
    inbox_diesel::testing::end_leases_async(&mut conn, &inbox_diesel::InboxSchema::DEFAULT).await;
    assert_eq!(
        class(record_in_transaction(&mut conn, &msg, &recorded).await),
        (ErrorClass::Misuse, Action::Alert)
    );
    let hook = ClaimHook {
        sent: sent.clone(),
        ..ClaimHook::default()
    };
    assert_eq!(
        send(&mut conn, &msg, &hook).await.unwrap(),
        InFlightOutcome::Processed(())
    );
    assert!(
        record_in_transaction(&mut conn, &msg, &recorded)
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(
        (
            AtomicUsize::load(&sent, Ordering::SeqCst),
            AtomicUsize::load(&recorded, Ordering::SeqCst)
        ),
        (1, 0)
    );
}

/// The pools of these tests: what an async claim-mode handler takes in place of its
/// connection.
type Bb8Pool = diesel_async::pooled_connection::bb8::Pool<AsyncConnection>;
type DeadpoolPool = diesel_async::pooled_connection::deadpool::Pool<AsyncConnection>;

/// Side effects that each wait, for up to 10 s, until both have started.
#[derive(Default)]
struct Meeting {
    inside: AtomicUsize,
    sent: AtomicUsize,
}

impl Meeting {
    async fn both_inside(&self) -> Result<(), AppError> {
        self.inside.fetch_add(1, Ordering::SeqCst);
        let both = async {
            while AtomicUsize::load(&self.inside, Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), both)
            .await
            .map_err(|_| AppError::Rejected)?;
        self.sent.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[idempotent(consumer = "email", key = msg.id, mode = "claim")]
async fn send_on_bb8(pool: &Bb8Pool, msg: &Credit, meeting: &Meeting) -> Result<(), AppError> {
    meeting.both_inside().await
}

#[idempotent(consumer = "email", key = msg.id, mode = "claim")]
async fn send_on_deadpool(
    pool: &DeadpoolPool,
    msg: &Credit,
    meeting: &Meeting,
) -> Result<(), AppError> {
    meeting.both_inside().await
}

/// Messages 1 and 2 completed, each by its first attempt.
async fn both_completed(conn: &mut AsyncConnection) -> i64 {
    inbox::table
        .filter(inbox::consumer.eq("email"))
        .filter(inbox::processed_at.is_not_null())
        .filter(inbox::attempts.eq(1))
        .count()
        .get_result(conn)
        .await
        .unwrap()
}

/// Two deliveries on a bb8 pool of one connection, each of whose side effects waits for the
/// other's to start: both start, and both are stamped — the bodies hold no connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_bb8_pool_the_side_effects_in_flight_hold_no_connection() {
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    let db = <Db>::new("async_claim_bb8_in_flight");
    let pool = Bb8Pool::builder()
        .max_size(1)
        .connection_timeout(Duration::from_secs(20))
        .build(AsyncDieselConnectionManager::new(db.url()))
        .await
        .unwrap();
    let meeting = Meeting::default();
    let (first, second) = (Credit::new(1), Credit::new(2));
    let (one, two) = tokio::join!(
        send_on_bb8(&pool, &first, &meeting),
        send_on_bb8(&pool, &second, &meeting),
    );
    assert!(matches!(one, Ok(InFlightOutcome::Processed(()))), "{one:?}");
    assert!(matches!(two, Ok(InFlightOutcome::Processed(()))), "{two:?}");
    assert_eq!(AtomicUsize::load(&meeting.sent, Ordering::SeqCst), 2);
    assert_eq!(both_completed(&mut pool.get().await.unwrap()).await, 2);
    let again = send_on_bb8(&pool, &Credit::new(1), &meeting).await;
    assert!(again.unwrap().is_duplicate());

    // The pool's one connection elsewhere: nothing is claimed, and the delivery is retried.
    let pool = Bb8Pool::builder()
        .max_size(1)
        .connection_timeout(Duration::from_millis(300))
        .build(AsyncDieselConnectionManager::new(db.url()))
        .await
        .unwrap();
    let elsewhere = pool.get().await.unwrap();
    let refused = send_on_bb8(&pool, &Credit::new(3), &meeting).await;
    match &refused {
        Err(AppError::Inbox(
            e @ inbox_diesel::Error::Checkout {
                after_effect: None, ..
            },
        )) => assert_eq!(e.action(), inbox_diesel::Action::Reconnect),
        other => panic!("{other:?}"),
    }
    drop(elsewhere);
    let claims: i64 = inbox::table
        .count()
        .get_result(&mut pool.get().await.unwrap())
        .await
        .unwrap();
    assert_eq!(claims, 2);
}

/// The same on a deadpool pool of one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_deadpool_pool_the_side_effects_in_flight_hold_no_connection() {
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    let db = <Db>::new("async_claim_deadpool_in_flight");
    let pool = DeadpoolPool::builder(AsyncDieselConnectionManager::new(db.url()))
        .max_size(1)
        .build()
        .unwrap();
    let meeting = Meeting::default();
    let (first, second) = (Credit::new(1), Credit::new(2));
    let (one, two) = tokio::join!(
        send_on_deadpool(&pool, &first, &meeting),
        send_on_deadpool(&pool, &second, &meeting),
    );
    assert!(matches!(one, Ok(InFlightOutcome::Processed(()))), "{one:?}");
    assert!(matches!(two, Ok(InFlightOutcome::Processed(()))), "{two:?}");
    assert_eq!(AtomicUsize::load(&meeting.sent, Ordering::SeqCst), 2);
    assert_eq!(both_completed(&mut pool.get().await.unwrap()).await, 2);
}

/// The function API's claim mode on diesel-async ([`claim_once_async`]
/// (inbox_diesel::handler::claim_once_async)), on a bb8 pool of one connection: two
/// deliveries whose side effects each wait for the other's to start are both stamped — the
/// bodies hold no connection —, and a redelivery is a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_function_api_claims_on_a_pool() {
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use inbox_diesel::guarded;
    use inbox_diesel::handler::{ClaimHandler, claim_once_async};
    use std::sync::LazyLock;
    static MAIL: LazyLock<ClaimHandler> = LazyLock::new(|| ClaimHandler::new("email").unwrap());
    let db = <Db>::new("async_claim_function_api");
    let pool = Bb8Pool::builder()
        .max_size(1)
        .connection_timeout(Duration::from_secs(20))
        .build(AsyncDieselConnectionManager::new(db.url()))
        .await
        .unwrap();
    let meeting = Meeting::default();
    let deliver = |n: u128| {
        let (pool, meeting) = (&pool, &meeting);
        async move {
            claim_once_async(
                pool,
                &MAIL,
                &n,
                guarded!(async || meeting.both_inside().await),
            )
            .await
        }
    };
    // What a server spawns: the delivery's future is `Send`.
    fn spawnable<F: std::future::Future + Send>(future: F) -> F {
        future
    }
    let (one, two) = tokio::join!(spawnable(deliver(1)), spawnable(deliver(2)));
    assert!(matches!(one, Ok(InFlightOutcome::Processed(()))), "{one:?}");
    assert!(matches!(two, Ok(InFlightOutcome::Processed(()))), "{two:?}");
    assert_eq!(AtomicUsize::load(&meeting.sent, Ordering::SeqCst), 2);
    assert_eq!(both_completed(&mut pool.get().await.unwrap()).await, 2);
    let again: Result<InFlightOutcome<()>, AppError> = deliver(1).await;
    assert!(again.unwrap().is_duplicate());
}
