// Claim mode's tests, sync, on one backend: included by each backend's suite into a module
// that names `Db` (the fixture), `DbConnection` (what `Db::connect` returns) and `inbox`
// (the backend's `table!`).
use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use diesel::prelude::*;
use inbox_diesel::testing::{self, Crash};
use inbox_diesel::{InFlightOutcome, StaleClaimOutcome, idempotent};
use inbox_tests::claim::Gate;
use inbox_tests::{AppError, Credit};

/// The side effect: counted in `sent` after `before` let it through.
fn side_effect(
    sent: &AtomicUsize,
    before: &dyn Fn() -> Result<(), AppError>,
) -> Result<(), AppError> {
    before()?;
    sent.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[idempotent(consumer = "email", key = msg.id, mode = "claim")]
fn send(
    conn: &mut DbConnection,
    msg: &Credit,
    sent: &AtomicUsize,
    before: &dyn Fn() -> Result<(), AppError>,
) -> Result<(), AppError> {
    side_effect(sent, before)
}

/// `send` with a short lease, for the tests in which leases end.
#[idempotent(consumer = "email", key = msg.id, mode = "claim", lease_ms = 1500)]
fn send_short_lease(
    conn: &mut DbConnection,
    msg: &Credit,
    sent: &AtomicUsize,
    before: &dyn Fn() -> Result<(), AppError>,
) -> Result<(), AppError> {
    side_effect(sent, before)
}

/// `send_short_lease`, reporting an expired claim instead of taking it over.
#[idempotent(
    consumer = "email",
    key = msg.id,
    mode = "claim",
    lease_ms = 1500,
    on_expired = "report"
)]
fn send_or_report(
    conn: &mut DbConnection,
    msg: &Credit,
    sent: &AtomicUsize,
    before: &dyn Fn() -> Result<(), AppError>,
) -> Result<(), AppError> {
    side_effect(sent, before)
}

/// A deployment's settings, read at startup.
struct Settings {
    lease_ms: u64,
}

/// `send` with its lease from a setting: evaluated at each call, checked before any SQL.
#[idempotent(consumer = "email", key = msg.id, mode = "claim", lease_ms = settings.lease_ms)]
fn send_with_settings(
    conn: &mut DbConnection,
    msg: &Credit,
    settings: &Settings,
    sent: &AtomicUsize,
) -> Result<(), AppError> {
    side_effect(sent, &ok)
}

/// The lease of `send_short_lease`, plus a margin for a slow machine.
const PAST_THE_LEASE: Duration = Duration::from_millis(2_000);

fn ok() -> Result<(), AppError> {
    Ok(())
}

/// The one claim row of a test: (completed, leased, attempts).
fn row(conn: &mut DbConnection) -> (bool, bool, i32) {
    inbox::table
        .filter(inbox::consumer.eq("email"))
        .select((
            inbox::processed_at.is_not_null(),
            inbox::claimed_until.is_not_null(),
            inbox::attempts,
        ))
        .first(conn)
        .unwrap()
}

/// A claim-mode handler of these tests: `send` and its variants, which return
/// `InFlightOutcome` (`StaleClaimOutcome` with `on_expired = "report"`).
type Sender<O> = fn(
    &mut DbConnection,
    &Credit,
    &AtomicUsize,
    &dyn Fn() -> Result<(), AppError>,
) -> Result<O, AppError>;

/// A crash after the claim committed and before the side effect (`testing::crash`): the
/// handler stops there and its connection is closed; it never gets to stamp or release.
fn crash_after_claim<O>(db: &Db, msg: &Credit, sent: &AtomicUsize, handler: Sender<O>) {
    testing::crash(db.connect(), Crash::AfterClaim, |conn| {
        handler(conn, msg, sent, &ok)
    });
    assert_eq!(sent.load(Ordering::SeqCst), 0, "the side effect ran");
}

/// Four instances on their own connections receive each of 50 messages at once,
/// released together by a barrier before each. The side effect runs once per
/// message; the other deliveries see it in flight or completed.
#[test]
fn claim_race_runs_the_side_effect_once() {
    const INSTANCES: usize = 4;
    const MESSAGES: u128 = 50;
    let db = <Db>::new("claim_race");
    let barrier = Barrier::new(INSTANCES);
    let sent = AtomicUsize::new(0);
    // Results, not unwraps: an instance that panicked would leave the others
    // waiting at the barrier.
    let outcomes: Vec<Vec<Result<InFlightOutcome<()>, AppError>>> = std::thread::scope(|scope| {
        let instances: Vec<_> = (0..INSTANCES)
            .map(|_| {
                let mut conn = db.connect();
                let (barrier, sent) = (&barrier, &sent);
                scope.spawn(move || {
                    (0..MESSAGES)
                        .map(|n| {
                            barrier.wait();
                            // Long enough for the others to find the claim open.
                            let slow = || {
                                std::thread::sleep(Duration::from_millis(2));
                                Ok(())
                            };
                            send(&mut conn, &Credit::new(n), sent, &slow)
                        })
                        .collect()
                })
            })
            .collect();
        instances.into_iter().map(|i| i.join().unwrap()).collect()
    });
    let all: Vec<&InFlightOutcome<()>> = outcomes
        .iter()
        .flatten()
        .map(|r| r.as_ref().expect("no delivery fails"))
        .collect();
    let processed = all.iter().filter(|o| o.is_processed()).count();
    let in_flight = all.iter().filter(|o| o.is_in_flight()).count();
    let duplicates = all.iter().filter(|o| o.is_duplicate()).count();
    assert_eq!(
        processed, MESSAGES as usize,
        "one delivery of each processes it"
    );
    assert_eq!(in_flight + duplicates, (INSTANCES - 1) * MESSAGES as usize);
    assert_eq!(sent.load(Ordering::SeqCst), MESSAGES as usize);
    let mut conn = db.connect();
    let completed: i64 = inbox::table
        .filter(inbox::consumer.eq("email"))
        .filter(inbox::processed_at.is_not_null())
        .filter(inbox::attempts.eq(1))
        .count()
        .get_result(&mut conn)
        .unwrap();
    assert_eq!(completed, MESSAGES as i64);
}

#[test]
fn completed_claim_makes_the_redelivery_a_duplicate() {
    let db = <Db>::new("claim_duplicate");
    let mut conn = db.connect();
    let (msg, sent) = (Credit::new(1), AtomicUsize::new(0));
    assert_eq!(
        send(&mut conn, &msg, &sent, &ok).unwrap(),
        InFlightOutcome::Processed(())
    );
    assert!(send(&mut conn, &msg, &sent, &ok).unwrap().is_duplicate());
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    assert_eq!(row(&mut conn), (true, false, 1));
}

/// The body fails before its side effect: the claim is released, and the
/// redelivery runs it at once — no lease to wait out — as attempt 2.
#[test]
fn side_effect_error_releases_the_claim_and_the_retry_succeeds() {
    let db = <Db>::new("claim_release");
    let mut conn = db.connect();
    let (msg, sent) = (Credit::new(1), AtomicUsize::new(0));
    let failed = send(&mut conn, &msg, &sent, &|| Err(AppError::Rejected));
    assert!(matches!(failed, Err(AppError::Rejected)), "{failed:?}");
    assert_eq!(row(&mut conn), (false, false, 1), "released, not completed");
    assert_eq!(
        send(&mut conn, &msg, &sent, &ok).unwrap(),
        InFlightOutcome::Processed(())
    );
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    assert_eq!(row(&mut conn), (true, false, 2));
}

/// The claim's insert waits behind a lock (`HOLD_INBOX_INSERTS`) for over a quarter of the
/// lease, as a commit held back by a cluster or a standby would: the lease the database
/// started may be half over when the claim comes back. The handler releases that claim and
/// takes it over with a whole lease before the body runs (attempt 2), rather than running
/// the body on what is left.
#[test]
fn claim_held_back_past_a_quarter_of_its_lease_is_claimed_again_before_the_body() {
    let db = <Db>::new("claim_held_back");
    let (msg, sent) = (Credit::new(1), AtomicUsize::new(0));
    // `send_short_lease`'s lease is 1 500 ms: a quarter is 375.
    let hold = Duration::from_millis(800);
    let locked = testing::while_locked(
        &mut db.connect(),
        HOLD_INBOX_INSERTS,
        hold,
        &mut db.connect(),
        |conn| send_short_lease(conn, &msg, &sent, &ok),
    );
    assert!(
        matches!(locked.answer, Ok(InFlightOutcome::Processed(()))),
        "{:?}",
        locked.answer
    );
    assert!(
        locked.took >= hold / 2,
        "the claim did not wait: {:?}",
        locked.took
    );
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    assert_eq!(row(&mut db.connect()), (true, false, 2), "claimed twice");
}

/// The process dies between the claim and the side effect: redeliveries find the
/// claim in flight until its lease ends, then one takes it over and completes.
#[test]
fn crash_after_claim_is_in_flight_until_the_lease_ends_then_reclaimed() {
    let db = <Db>::new("claim_crash");
    let mut conn = db.connect();
    let (msg, sent) = (Credit::new(1), AtomicUsize::new(0));
    crash_after_claim(&db, &msg, &sent, send_short_lease);
    assert_eq!(
        row(&mut conn),
        (false, true, 1),
        "the claim outlives the crash"
    );
    let redelivered = send_short_lease(&mut conn, &msg, &sent, &ok).unwrap();
    assert!(!redelivered.should_ack());
    // How long the crashed claim holds yet, on the database's clock: most of its
    // 1 500 ms lease, and waiting that long is enough for the next delivery.
    let lease_left = inbox_tests::claim::lease_left(&redelivered, Duration::from_millis(1_500));
    assert!(lease_left > Duration::from_millis(500), "{lease_left:?}");
    std::thread::sleep(lease_left);
    let reclaimed = send_short_lease(&mut conn, &msg, &sent, &ok).unwrap();
    assert_eq!(reclaimed, InFlightOutcome::Processed(()));
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    assert_eq!(row(&mut conn), (true, false, 2));
}

/// `on_expired = "report"`: the expired claim is reported for reconciliation,
/// and the side effect does not run again.
#[test]
fn expired_claim_is_reported_not_rerun_under_the_report_policy() {
    let db = <Db>::new("claim_report");
    let mut conn = db.connect();
    let (msg, sent) = (Credit::new(1), AtomicUsize::new(0));
    crash_after_claim(&db, &msg, &sent, send_or_report);
    assert!(
        send_or_report(&mut conn, &msg, &sent, &ok)
            .unwrap()
            .is_in_flight()
    );
    std::thread::sleep(PAST_THE_LEASE);
    let reported = send_or_report(&mut conn, &msg, &sent, &ok).unwrap();
    assert!(
        matches!(&reported, StaleClaimOutcome::StaleClaim { attempts: 1, consumer, .. } if consumer.as_str() == "email"),
        "{reported:?}"
    );
    assert!(!reported.should_ack());
    assert_eq!(sent.load(Ordering::SeqCst), 0);
    assert_eq!(row(&mut conn), (false, true, 1), "left as it was");
}

/// A's body outlives its lease; B takes the claim over and is held too. A's
/// stamp then finds the claim is B's: A reports `ClaimLost` and writes nothing;
/// B stamps the work.
#[test]
fn stolen_claim_is_never_stamped_by_the_instance_that_lost_it() {
    let db = <Db>::new("claim_stolen");
    let msg = Credit::new(1);
    let sent = AtomicUsize::new(0);
    let (a_gate, b_gate) = (Gate::default(), Gate::default());
    std::thread::scope(|scope| {
        let a = scope.spawn(|| {
            let mut conn = db.connect();
            send_short_lease(&mut conn, &msg, &sent, &|| {
                a_gate.pass();
                Ok(())
            })
        });
        a_gate.wait_inside();
        std::thread::sleep(PAST_THE_LEASE);
        let b = scope.spawn(|| {
            let mut conn = db.connect();
            send_short_lease(&mut conn, &msg, &sent, &|| {
                b_gate.pass();
                Ok(())
            })
        });
        b_gate.wait_inside();
        let mut conn = db.connect();
        assert_eq!(row(&mut conn), (false, true, 2), "B holds attempt 2");
        a_gate.open();
        let lost = a.join().unwrap();
        assert!(
            matches!(
                lost,
                Err(AppError::Inbox(inbox_diesel::Error::ClaimLost {
                    attempt: 1
                }))
            ),
            "{lost:?}"
        );
        assert_eq!(row(&mut conn), (false, true, 2), "A stamped nothing");
        b_gate.open();
        assert_eq!(b.join().unwrap().unwrap(), InFlightOutcome::Processed(()));
        assert_eq!(row(&mut conn), (true, false, 2));
    });
    // Both side effects ran: the unknown window the key passed downstream closes.
    assert_eq!(sent.load(Ordering::SeqCst), 2);
}

/// Each claim statement must commit as it runs: inside a caller's transaction
/// the handler refuses to start.
#[test]
fn claim_inside_an_open_transaction_is_refused() {
    let db = <Db>::new("claim_in_transaction");
    let mut conn = db.connect();
    let sent = AtomicUsize::new(0);
    let refused = conn.transaction(|conn| {
        Ok::<_, diesel::result::Error>(send(conn, &Credit::new(1), &sent, &ok))
    });
    let Ok(Err(AppError::Inbox(inbox_diesel::Error::CalledInsideTransaction))) = refused else {
        panic!("expected CalledInsideTransaction, got {refused:?}");
    };
    assert_eq!(sent.load(Ordering::SeqCst), 0);
    let markers: i64 = inbox::table.count().get_result(&mut conn).unwrap();
    assert_eq!(markers, 0);
}

/// The process dies after the side effect, before its claim is stamped complete: the side
/// effect happened once; the claim is in flight until its lease ends, then reported (under
/// `on_expired = "report"`) and the side effect is not run again.
#[test]
fn crash_before_the_stamp_is_reported_after_the_lease_not_rerun() {
    let db = <Db>::new("claim_before_stamp");
    let (msg, sent) = (Credit::new(1), AtomicUsize::new(0));
    testing::crash(db.connect(), Crash::BeforeStamp, |conn| {
        send_or_report(conn, &msg, &sent, &ok)
    });
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    let mut conn = db.connect();
    assert_eq!(row(&mut conn), (false, true, 1), "not stamped");
    assert!(
        send_or_report(&mut conn, &msg, &sent, &ok)
            .unwrap()
            .is_in_flight()
    );
    std::thread::sleep(PAST_THE_LEASE);
    let reported = send_or_report(&mut conn, &msg, &sent, &ok).unwrap();
    assert!(
        matches!(reported, StaleClaimOutcome::StaleClaim { attempts: 1, .. }),
        "{reported:?}"
    );
    assert_eq!(sent.load(Ordering::SeqCst), 1, "the side effect ran again");
}

/// A lease from a setting: one no claim can hold (50 ms) is refused before any SQL — no
/// claim, no side effect — and one it can is the claim's lease, as the `InFlight` of a
/// crashed claim says.
#[test]
fn a_lease_from_a_setting_is_checked_before_any_sql_and_held() {
    let db = <Db>::new("claim_lease_setting");
    let mut conn = db.connect();
    let (msg, sent) = (Credit::new(1), AtomicUsize::new(0));
    let refused = send_with_settings(&mut conn, &msg, &Settings { lease_ms: 50 }, &sent);
    assert!(
        matches!(
            refused,
            Err(AppError::Inbox(inbox_diesel::Error::InvalidLease {
                lease_ms: 50
            }))
        ),
        "{refused:?}"
    );
    assert_eq!(
        inbox::table.count().get_result::<i64>(&mut conn).unwrap(),
        0,
        "nothing claimed"
    );
    let settings = Settings { lease_ms: 1_200 };
    testing::crash(db.connect(), Crash::AfterClaim, |conn| {
        send_with_settings(conn, &msg, &settings, &sent)
    });
    let held = send_with_settings(&mut conn, &msg, &settings, &sent).unwrap();
    let lease_left = inbox_tests::claim::lease_left(&held, Duration::from_millis(1_200));
    std::thread::sleep(lease_left);
    assert_eq!(
        send_with_settings(&mut conn, &msg, &settings, &sent).unwrap(),
        InFlightOutcome::Processed(())
    );
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}

/// The old version of `send`'s consumer, in transaction mode: what a rolling deploy that
/// moves `email` to claim mode still runs beside the new one.
#[idempotent(consumer = "email", key = msg.id)]
fn record_in_transaction(
    conn: &mut DbConnection,
    msg: &Credit,
    recorded: &AtomicUsize,
) -> Result<(), AppError> {
    recorded.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// The same, as a batch.
#[idempotent(consumer = "email", batch = msgs, key = |msg| msg.id)]
fn record_batch(
    conn: &mut DbConnection,
    msgs: &[Credit],
    recorded: &AtomicUsize,
) -> Result<(), AppError> {
    recorded.fetch_add(msgs.len(), Ordering::SeqCst);
    Ok(())
}

/// One consumer run in both modes: a claim whose holder died is not a duplicate's evidence
/// for a transaction-mode handler or a batch — its side effect may not have run. Within its
/// lease they are refused to be retried later (`ClaimLost`); past it, with an alert
/// (`Misuse`: only claim mode can take it over); once claim mode has completed it, they
/// answer `Duplicate`. Before, both answered `Duplicate` at once, and the message was never
/// applied.
#[test]
fn a_claim_of_claim_mode_is_not_a_duplicate_for_another_mode() {
    use inbox_diesel::{Action, ErrorClass};
    let db = <Db>::new("claim_mixed_modes");
    let mut conn = db.connect();
    let (msg, sent, recorded) = (Credit::new(1), AtomicUsize::new(0), AtomicUsize::new(0));
    crash_after_claim(&db, &msg, &sent, send_short_lease);
    fn class<T: std::fmt::Debug>(answer: Result<T, AppError>) -> (ErrorClass, Action) {
        match answer {
            Err(AppError::Inbox(e @ inbox_diesel::Error::OpenClaim { .. })) => {
                (e.class(), e.class().action())
            }
            other => panic!("{other:?}"),
        }
    }
    let live = (ErrorClass::ClaimLost, Action::RetryLater);
    assert_eq!(
        class(record_in_transaction(&mut conn, &msg, &recorded)),
        live
    );
    assert_eq!(
        class(record_batch(
            &mut conn,
            std::slice::from_ref(&msg),
            &recorded
        )),
        live
    );
    testing::end_leases(&mut conn, &inbox_diesel::InboxSchema::DEFAULT);
    let stale = (ErrorClass::Misuse, Action::Alert);
    assert_eq!(
        class(record_in_transaction(&mut conn, &msg, &recorded)),
        stale
    );
    assert_eq!(
        class(record_batch(
            &mut conn,
            std::slice::from_ref(&msg),
            &recorded
        )),
        stale
    );
    assert_eq!(recorded.load(Ordering::SeqCst), 0);
    assert_eq!(row(&mut conn), (false, true, 1), "the claim is as it was");
    // Claim mode takes it over and completes it: now a duplicate for every mode.
    assert_eq!(
        send_short_lease(&mut conn, &msg, &sent, &ok).unwrap(),
        InFlightOutcome::Processed(())
    );
    assert!(
        record_in_transaction(&mut conn, &msg, &recorded)
            .unwrap()
            .is_duplicate()
    );
    let again = record_batch(&mut conn, std::slice::from_ref(&msg), &recorded).unwrap();
    assert_eq!(again.duplicates, [0]);
    assert_eq!(
        (sent.load(Ordering::SeqCst), recorded.load(Ordering::SeqCst)),
        (1, 0)
    );
}

/// A pool of these tests: what a claim-mode handler takes in place of its connection.
type DbPool = diesel::r2d2::Pool<diesel::r2d2::ConnectionManager<DbConnection>>;

/// `send` on a pool: the claim and the stamp each check a connection out; the body holds
/// none.
#[idempotent(consumer = "email", key = msg.id, mode = "claim")]
fn send_pooled(
    pool: &DbPool,
    msg: &Credit,
    sent: &AtomicUsize,
    before: &dyn Fn() -> Result<(), AppError>,
) -> Result<(), AppError> {
    side_effect(sent, before)
}

/// `send_pooled` with a short lease, reporting an expired claim instead of taking it over.
#[idempotent(
    consumer = "email",
    key = msg.id,
    mode = "claim",
    lease_ms = 1500,
    on_expired = "report"
)]
fn send_pooled_or_report(
    pool: &DbPool,
    msg: &Credit,
    sent: &AtomicUsize,
    before: &dyn Fn() -> Result<(), AppError>,
) -> Result<(), AppError> {
    side_effect(sent, before)
}

/// A pool of one connection, whose checkout waits `timeout`.
fn pool_of_one(db: &Db, timeout: Duration) -> DbPool {
    diesel::r2d2::Pool::builder()
        .max_size(1)
        .connection_timeout(timeout)
        .build(diesel::r2d2::ConnectionManager::new(db.url()))
        .unwrap()
}

/// Two deliveries on a pool of one connection, each of whose side effects waits for the
/// other's to start: both start, and both are stamped. A handler holding its connection
/// through the side effect would leave the second claim waiting for the first stamp, which
/// waits for the second side effect.
#[test]
fn on_a_pool_the_side_effects_in_flight_hold_no_connection() {
    let db = <Db>::new("claim_pool_in_flight");
    let pool = pool_of_one(&db, Duration::from_secs(20));
    let (sent, inside) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let meet = || {
        inside.fetch_add(1, Ordering::SeqCst);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while inside.load(Ordering::SeqCst) < 2 {
            if std::time::Instant::now() > deadline {
                return Err(AppError::Rejected);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    };
    let outcomes: Vec<Result<InFlightOutcome<()>, AppError>> = std::thread::scope(|scope| {
        let deliveries: Vec<_> = (1..=2)
            .map(|n| {
                let (pool, sent, meet) = (&pool, &sent, &meet);
                scope.spawn(move || send_pooled(pool, &Credit::new(n), sent, meet))
            })
            .collect();
        deliveries.into_iter().map(|d| d.join().unwrap()).collect()
    });
    for outcome in &outcomes {
        assert!(
            matches!(outcome, Ok(InFlightOutcome::Processed(()))),
            "{outcome:?}"
        );
    }
    assert_eq!(sent.load(Ordering::SeqCst), 2);
    let completed: i64 = inbox::table
        .filter(inbox::consumer.eq("email"))
        .filter(inbox::processed_at.is_not_null())
        .filter(inbox::attempts.eq(1))
        .count()
        .get_result(&mut *pool.get().unwrap())
        .unwrap();
    assert_eq!(completed, 2);
    let msg = Credit::new(1);
    assert!(send_pooled(&pool, &msg, &sent, &ok).unwrap().is_duplicate());
}

/// The pool's one connection taken elsewhere: before the claim, nothing runs and the
/// delivery is to be retried (`Reconnect`); during the side effect for a while, even past
/// the claim's lease, the stamp waits for it; past twice the lease, the effect is not
/// recorded (`Alert`), and the claim is left as after a crash.
#[test]
fn on_a_pool_without_a_connection_nothing_is_claimed_or_the_effect_is_not_recorded() {
    use inbox_diesel::{Action, Error};
    let db = <Db>::new("claim_pool_exhausted");
    let pool = pool_of_one(&db, Duration::from_millis(300));
    let (msg, sent) = (Credit::new(1), AtomicUsize::new(0));
    {
        let _elsewhere = pool.get().unwrap();
        let refused = send_pooled(&pool, &msg, &sent, &ok);
        match &refused {
            Err(AppError::Inbox(
                e @ Error::Checkout {
                    after_effect: None, ..
                },
            )) => assert_eq!(e.action(), Action::Reconnect),
            other => panic!("{other:?}"),
        }
    }
    let claims: i64 = inbox::table
        .count()
        .get_result(&mut *pool.get().unwrap())
        .unwrap();
    assert_eq!((claims, sent.load(Ordering::SeqCst)), (0, 0));

    // Taken for a while during the side effect (a request path sharing the pool), past the
    // claim's 1.5 s lease: the stamp waits for it — no delivery took the claim over, so the
    // stamp still completes the work.
    let taken = std::sync::Mutex::new(None);
    let take_for_a_while = || {
        let connection = pool.get().unwrap();
        *taken.lock().unwrap() = Some(std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2_000));
            drop(connection);
        }));
        Ok(())
    };
    let waited = send_pooled_or_report(&pool, &msg, &sent, &take_for_a_while);
    assert!(waited.unwrap().is_processed());
    taken.lock().unwrap().take().unwrap().join().unwrap();
    assert_eq!(sent.load(Ordering::SeqCst), 1);

    // Taken past twice the lease: the effect is not recorded, and the claim is reported,
    // never run again.
    let msg = Credit::new(2);
    let elsewhere = std::sync::Mutex::new(None);
    let take_the_connection = || {
        *elsewhere.lock().unwrap() = Some(pool.get().unwrap());
        Ok(())
    };
    let unstamped = send_pooled_or_report(&pool, &msg, &sent, &take_the_connection);
    match &unstamped {
        Err(AppError::Inbox(
            e @ Error::Checkout {
                after_effect: Some(1),
                ..
            },
        )) => {
            assert_eq!(e.action(), Action::Alert);
            let text = e.to_string();
            assert!(
                text.contains("no connection (") && text.contains("lease") && !text.contains("  "),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    drop(elsewhere.lock().unwrap().take());
    assert_eq!(sent.load(Ordering::SeqCst), 2);
    let unfinished: (bool, i32) = inbox::table
        .filter(inbox::consumer.eq("email"))
        .filter(inbox::attempts.eq(1))
        .select((inbox::processed_at.is_not_null(), inbox::attempts))
        .order(inbox::processed_at.is_not_null())
        .first(&mut *pool.get().unwrap())
        .unwrap();
    assert_eq!(unfinished, (false, 1));
    let reported = send_pooled_or_report(&pool, &msg, &sent, &ok).unwrap();
    assert!(
        matches!(reported, StaleClaimOutcome::StaleClaim { .. }),
        "{reported:?}"
    );
    assert_eq!(sent.load(Ordering::SeqCst), 2);
}

/// On a pool, a body's error releases the claim on a connection checked out for it: the
/// redelivery runs the side effect at once, as attempt 2.
#[test]
fn on_a_pool_a_failed_side_effect_is_released_and_retried() {
    let db = <Db>::new("claim_pool_release");
    let pool = pool_of_one(&db, Duration::from_secs(20));
    let (msg, sent) = (Credit::new(1), AtomicUsize::new(0));
    let failed = send_pooled(&pool, &msg, &sent, &|| Err(AppError::Rejected));
    assert!(matches!(failed, Err(AppError::Rejected)), "{failed:?}");
    assert_eq!(row(&mut pool.get().unwrap()), (false, false, 1));
    assert!(send_pooled(&pool, &msg, &sent, &ok).unwrap().is_processed());
    assert_eq!(row(&mut pool.get().unwrap()), (true, false, 2));
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}

/// An application's own pool type, wrapping r2d2's (as a service keeps its pool with its
/// settings): taken in place of a connection once it says how it checks out.
struct AppPool {
    inner: DbPool,
}

impl inbox_diesel::pool::ConnectionPool for AppPool {
    type Connection = DbConnection;
}

impl inbox_diesel::pool::ClaimPool for AppPool {
    type Checkout<'a> =
        diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<DbConnection>>;
    fn checkout(&self) -> Result<Self::Checkout<'_>, inbox_diesel::pool::CheckoutFailure> {
        Ok(self.inner.get()?)
    }
}

#[idempotent(consumer = "email", key = msg.id, mode = "claim")]
fn send_on_the_apps_pool(pool: &AppPool, msg: &Credit, sent: &AtomicUsize) -> Result<(), AppError> {
    side_effect(sent, &ok)
}

#[test]
fn on_an_applications_own_pool_type_the_claim_is_stamped() {
    let db = <Db>::new("claim_app_pool");
    let pool = AppPool {
        inner: pool_of_one(&db, Duration::from_secs(20)),
    };
    let (msg, sent) = (Credit::new(1), AtomicUsize::new(0));
    assert!(
        send_on_the_apps_pool(&pool, &msg, &sent)
            .unwrap()
            .is_processed()
    );
    assert!(
        send_on_the_apps_pool(&pool, &msg, &sent)
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    assert_eq!(row(&mut pool.inner.get().unwrap()), (true, false, 1));
}

/// The function API's claim mode ([`claim_once`](inbox_diesel::handler::claim_once)), for a
/// job whose pool lives in a runner's context: the same race as `send`'s — four instances
/// behind a barrier for each message —, a failing body's claim released and run again, the
/// report policy, and a lease out of range refused before any SQL.
#[test]
fn the_function_api_claims_as_the_attribute_does() {
    use inbox_diesel::handler::{ClaimHandler, ReportExpired, claim_once};
    use inbox_diesel::{Error as InboxError, guarded};
    use std::sync::LazyLock;
    static MAIL: LazyLock<ClaimHandler> = LazyLock::new(|| ClaimHandler::new("mail").unwrap());
    static REPORTING: LazyLock<ClaimHandler<ReportExpired>> = LazyLock::new(|| {
        ClaimHandler::new("mail-reported")
            .unwrap()
            .lease(Duration::from_millis(1500))
            .report_expired()
    });
    static NO_LEASE: LazyLock<ClaimHandler> = LazyLock::new(|| {
        ClaimHandler::new("mail")
            .unwrap()
            .lease(Duration::from_millis(10))
    });
    const INSTANCES: usize = 4;
    const MESSAGES: u64 = 20;
    let db = <Db>::new("claim_function_api");
    let barrier = Barrier::new(INSTANCES);
    let sent = AtomicUsize::new(0);
    let outcomes: Vec<Result<InFlightOutcome<()>, AppError>> = std::thread::scope(|scope| {
        let instances: Vec<_> = (0..INSTANCES)
            .map(|_| {
                let mut conn = db.connect();
                let (barrier, sent) = (&barrier, &sent);
                scope.spawn(move || {
                    (0..MESSAGES)
                        .map(|n| {
                            barrier.wait();
                            let slow = || {
                                std::thread::sleep(Duration::from_millis(2));
                                Ok(())
                            };
                            claim_once(&mut conn, &MAIL, &n, guarded!(|| side_effect(sent, &slow)))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        instances
            .into_iter()
            .flat_map(|i| i.join().unwrap())
            .collect()
    });
    let processed = outcomes
        .iter()
        .filter(|o| o.as_ref().expect("no delivery fails").is_processed())
        .count();
    assert_eq!(processed, MESSAGES as usize);
    assert_eq!(sent.load(Ordering::SeqCst), MESSAGES as usize);

    let mut conn = db.connect();
    let failed = claim_once(
        &mut conn,
        &MAIL,
        "m-failing",
        guarded!(|| { Err::<(), _>(AppError::Rejected) }),
    );
    assert!(matches!(failed, Err(AppError::Rejected)), "{failed:?}");
    let retried = claim_once(
        &mut conn,
        &MAIL,
        "m-failing",
        guarded!(|| side_effect(&sent, &ok)),
    );
    assert!(
        retried.unwrap().is_processed(),
        "the released claim runs again"
    );
    let again = claim_once(
        &mut conn,
        &MAIL,
        "m-failing",
        guarded!(|| side_effect(&sent, &ok)),
    );
    assert!(again.unwrap().is_duplicate());
    assert_eq!(sent.load(Ordering::SeqCst), MESSAGES as usize + 1);

    // A claim whose body died: reported once its lease ended, not run again.
    testing::crash(db.connect(), Crash::AfterClaim, |conn| {
        claim_once(
            conn,
            &REPORTING,
            "m-crashed",
            guarded!(|| side_effect(&sent, &ok)),
        )
    });
    std::thread::sleep(Duration::from_millis(1600));
    let reported = claim_once(
        &mut conn,
        &REPORTING,
        "m-crashed",
        guarded!(|| { side_effect(&sent, &ok) }),
    );
    assert!(
        matches!(reported, Ok(StaleClaimOutcome::StaleClaim { .. })),
        "{reported:?}"
    );
    assert_eq!(sent.load(Ordering::SeqCst), MESSAGES as usize + 1);

    let refused = claim_once(
        &mut conn,
        &NO_LEASE,
        "m-lease",
        guarded!(|| side_effect(&sent, &ok)),
    );
    assert!(
        matches!(
            refused,
            Err(AppError::Inbox(InboxError::InvalidLease { .. }))
        ),
        "{refused:?}"
    );
}
