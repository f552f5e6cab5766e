// `inbox_diesel::testing` on one backend, as a user's own test suite uses it: included by each
// backend's suite into a module that names `Db` (the fixture), `DbConnection` (what
// `Db::connect` returns) and `LOCK_ROW` (a statement that locks account 1 until its
// transaction ends).
use std::time::Duration;

use diesel::prelude::*;
use inbox_diesel::testing::{self, Crash};
use inbox_diesel::{Outcome, idempotent};
use inbox_tests::{AppError, Credit, accounts, credits};

/// The user's handler: a credit row and the balance, in the inbox's transaction.
#[idempotent(consumer = "credit", key = msg.id)]
fn credit(conn: &mut DbConnection, msg: &Credit) -> Result<(), AppError> {
    write_credit(conn, msg)?;
    diesel::update(accounts::table.find(msg.account))
        .set(accounts::balance.eq(accounts::balance + msg.amount))
        .execute(conn)?;
    Ok(())
}

/// The credit row of `msg`: the user's handlers' effect.
fn write_credit(conn: &mut DbConnection, msg: &Credit) -> QueryResult<usize> {
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.id.to_string()),
            credits::account.eq(msg.account),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)
}

/// The handler as it is often written by hand: look for an earlier credit, then write one.
/// Two deliveries at once both find none.
fn check_then_insert(conn: &mut DbConnection, msg: &Credit) -> Result<(), AppError> {
    let seen: i64 = credits::table
        .filter(credits::message.eq(msg.id.to_string()))
        .count()
        .get_result(conn)?;
    if seen == 0 {
        write_credit(conn, msg)?;
    }
    Ok(())
}

fn credits_of(msg: &Credit) -> String {
    format!("SELECT count(*) FROM credits WHERE message = '{}'", msg.id)
}

/// The user's test: 200 messages, each delivered by 8 connections at once; each must have
/// exactly one credit afterwards. (Who wins a race is chance: one round may not show a
/// doubled credit where two hundred do.)
fn applies_once_under_races(db: &Db, deliver: impl Fn(&mut DbConnection, &Credit) + Sync) {
    let mut connections: Vec<DbConnection> = (0..8).map(|_| db.connect()).collect();
    let mut check = db.connect();
    for n in 0..200 {
        let msg = Credit::new(n);
        testing::race(&mut connections, |conn| deliver(conn, &msg));
        testing::assert_once(&mut check, &credits_of(&msg));
    }
}

/// The same user test fails on the hand-written check and passes on `#[idempotent]`.
#[test]
fn a_race_test_fails_on_check_then_insert_and_passes_on_idempotent() {
    let naive = Db::new("testing_naive");
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        applies_once_under_races(&naive, |conn, msg| {
            // A busy database is an error the broker retries; only doubled credits count.
            let _ = check_then_insert(conn, msg);
        })
    }));
    assert!(
        failed.is_err(),
        "eight deliveries at once never doubled a credit of the check-then-insert handler"
    );
    let guarded = Db::new("testing_idempotent");
    applies_once_under_races(&guarded, |conn, msg| {
        let _ = credit(conn, msg).expect("a delivery failed");
    });
}

/// A crash after the body, before the commit: nothing of it stays, and the redelivery
/// applies the message once.
#[test]
fn a_crash_before_the_commit_leaves_nothing_and_the_redelivery_applies() {
    let db = Db::new("testing_before_commit");
    let msg = Credit::new(1);
    let crashed = testing::crash(db.connect(), Crash::BeforeCommit, |conn| credit(conn, &msg));
    assert_eq!(crashed, testing::Crashed(Crash::BeforeCommit));
    assert_eq!(testing::count(&mut db.connect(), &credits_of(&msg)), 0);
    assert_eq!(
        testing::count(&mut db.connect(), "SELECT count(*) FROM inbox"),
        0,
        "the marker went with the body"
    );
    let redelivered = credit(&mut db.connect(), &msg).unwrap();
    assert!(redelivered.is_processed(), "{redelivered:?}");
    testing::assert_once(&mut db.connect(), &credits_of(&msg));
}

/// A crash after the commit (the acknowledgement lost): the redelivery is a duplicate.
#[test]
fn a_crash_after_the_commit_makes_the_redelivery_a_duplicate() {
    let db = Db::new("testing_after_commit");
    let msg = Credit::new(1);
    testing::crash(db.connect(), Crash::AfterCommit, |conn| credit(conn, &msg));
    testing::assert_once(&mut db.connect(), &credits_of(&msg));
    let [first, second] = testing::twice(&mut db.connect(), |conn| credit(conn, &msg));
    assert!(first.unwrap().is_duplicate());
    assert!(second.unwrap().is_duplicate());
    testing::assert_once(&mut db.connect(), &credits_of(&msg));
}

/// A crash point the handler never reaches is a failed test, not a silent pass.
#[test]
fn a_crash_point_not_reached_fails_the_test() {
    let db = Db::new("testing_not_reached");
    let msg = Credit::new(1);
    assert!(credit(&mut db.connect(), &msg).unwrap().is_processed());
    let duplicate = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        testing::crash(db.connect(), Crash::BeforeCommit, |conn| credit(conn, &msg))
    }));
    let message = duplicate.expect_err("a duplicate never reaches the commit");
    let text = message
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(text.contains("without reaching BeforeCommit"), "{text}");
}

/// The handler waits for a lock another connection holds on the row it updates, then
/// applies the message once.
#[test]
fn a_handler_under_a_held_lock_waits_and_applies_once() {
    let db = Db::new("testing_locked");
    let msg = Credit::new(1);
    let hold = Duration::from_millis(300);
    let locked = testing::while_locked(
        &mut db.connect(),
        LOCK_ROW,
        hold,
        &mut db.connect(),
        |conn| credit(conn, &msg),
    );
    assert!(
        matches!(locked.answer, Ok(Outcome::Processed(()))),
        "{:?}",
        locked.answer
    );
    // It could not finish before the holder let go.
    assert!(locked.took >= hold / 2, "{:?}", locked.took);
    testing::assert_once(&mut db.connect(), &credits_of(&msg));
}

/// A job of the application's own: two credits, each its own handler call, with a crash
/// point of the application's between them — the window a worker's death leaves half a job
/// in.
fn two_credit_job(
    conn: &mut DbConnection,
    first: &Credit,
    second: &Credit,
) -> Result<(), AppError> {
    let _ = credit(conn, first)?;
    inbox_diesel::crash_point("between-credits");
    let _ = credit(conn, second)?;
    Ok(())
}

/// The user's handler with a crash point inside its body, after its writes.
#[idempotent(consumer = "credit", key = msg.id)]
fn credit_with_a_point(conn: &mut DbConnection, msg: &Credit) -> Result<(), AppError> {
    write_credit(conn, msg)?;
    inbox_diesel::crash_point("after-the-credit");
    Ok(())
}

/// Crash points of the application's own: the job dies between its two credits (the first
/// committed, the second never ran), or inside a body after its write (nothing committed);
/// the redelivered job applies each credit once.
#[test]
fn the_applications_own_crash_points_stop_the_job_there() {
    let db = Db::new("testing_own_points");
    let (first, second) = (Credit::new(1), Credit::new(2));
    let crashed = testing::crash(db.connect(), Crash::At("between-credits"), |conn| {
        two_credit_job(conn, &first, &second)
    });
    assert_eq!(crashed, testing::Crashed(Crash::At("between-credits")));
    testing::assert_once(&mut db.connect(), &credits_of(&first));
    assert_eq!(testing::count(&mut db.connect(), &credits_of(&second)), 0);
    two_credit_job(&mut db.connect(), &first, &second).unwrap();
    testing::assert_once(&mut db.connect(), &credits_of(&first));
    testing::assert_once(&mut db.connect(), &credits_of(&second));

    let third = Credit::new(3);
    testing::crash(db.connect(), Crash::At("after-the-credit"), |conn| {
        credit_with_a_point(conn, &third)
    });
    assert_eq!(testing::count(&mut db.connect(), &credits_of(&third)), 0);
    assert!(
        credit_with_a_point(&mut db.connect(), &third)
            .unwrap()
            .is_processed()
    );
    testing::assert_once(&mut db.connect(), &credits_of(&third));

    // A point of another name is never reached: a failed test, not a silent pass.
    let missed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        testing::crash(db.connect(), Crash::At("no-such-point"), |conn| {
            two_credit_job(conn, &Credit::new(4), &Credit::new(5))
        })
    }));
    let text = missed
        .expect_err("the point is never reached")
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(text.contains("no `crash_point` of that name"), "{text}");
}

/// A job that loops over messages, a crash point after each: `AtHit` stops it after the
/// second, not the first — the first two credits committed, the third never ran — and the
/// redelivered job applies each credit once.
#[test]
fn a_crash_point_in_a_loop_stops_at_the_hit_asked_for() {
    let db = Db::new("testing_point_hits");
    let batch = [Credit::new(11), Credit::new(12), Credit::new(13)];
    let job = |conn: &mut DbConnection| -> Result<(), AppError> {
        for msg in &batch {
            let _ = credit(conn, msg)?;
            inbox_diesel::crash_point("after-each-credit");
        }
        Ok(())
    };
    let crashed = testing::crash(db.connect(), Crash::AtHit("after-each-credit", 2), job);
    assert_eq!(
        crashed,
        testing::Crashed(Crash::AtHit("after-each-credit", 2))
    );
    testing::assert_once(&mut db.connect(), &credits_of(&batch[0]));
    testing::assert_once(&mut db.connect(), &credits_of(&batch[1]));
    assert_eq!(testing::count(&mut db.connect(), &credits_of(&batch[2])), 0);
    job(&mut db.connect()).unwrap();
    for msg in &batch {
        testing::assert_once(&mut db.connect(), &credits_of(msg));
    }
}

/// A side effect outside the database (an e-mail), in claim mode.
#[idempotent(consumer = "mail", key = msg.id, mode = "claim")]
fn mail(
    conn: &mut DbConnection,
    msg: &Credit,
    sent: &std::sync::atomic::AtomicUsize,
) -> Result<(), AppError> {
    sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

/// Claim mode's crash window, tested without waiting out the lease: the worker dies after
/// its claim, before the e-mail; the redelivery is refused while the claim's lease runs,
/// and once `end_leases` has ended it, takes the claim over and sends the e-mail once.
#[test]
fn a_lease_ended_by_the_test_kit_is_taken_over_at_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let db = Db::new("testing_leases");
    let msg = Credit::new(1);
    let sent = AtomicUsize::new(0);
    testing::crash(db.connect(), Crash::AfterClaim, |conn| {
        mail(conn, &msg, &sent)
    });
    let early = mail(&mut db.connect(), &msg, &sent);
    assert!(
        !matches!(early, Ok(ref outcome) if outcome.is_processed()),
        "{early:?}"
    );
    assert_eq!(sent.load(Ordering::SeqCst), 0);
    testing::end_leases(&mut db.connect(), &inbox_diesel::InboxSchema::DEFAULT);
    assert!(mail(&mut db.connect(), &msg, &sent).unwrap().is_processed());
    assert!(mail(&mut db.connect(), &msg, &sent).unwrap().is_duplicate());
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}

/// A purge's retention, tested without waiting: markers a day old are kept by a purge of
/// markers older than two days, and removed once two days more have passed for them.
#[test]
fn time_passed_by_the_test_kit_reaches_the_purge() {
    use inbox_diesel::purge::{Purge, purge};
    let db = Db::new("testing_time");
    for n in 1..=3 {
        assert!(
            credit(&mut db.connect(), &Credit::new(n))
                .unwrap()
                .is_processed()
        );
    }
    let schema = inbox_diesel::InboxSchema::DEFAULT;
    let two_days = Purge::older_than(Duration::from_secs(2 * 86_400));
    testing::pass_time(&mut db.connect(), &schema, Duration::from_secs(86_400));
    assert_eq!(
        purge(&mut db.connect(), &schema, &two_days)
            .unwrap()
            .removed,
        0
    );
    testing::pass_time(&mut db.connect(), &schema, Duration::from_secs(2 * 86_400));
    assert_eq!(
        purge(&mut db.connect(), &schema, &two_days)
            .unwrap()
            .removed,
        3
    );
    // The messages are new again: nothing remembers them.
    assert!(
        credit(&mut db.connect(), &Credit::new(1))
            .unwrap()
            .is_processed()
    );
}

/// A service that checks its own connection out of a pool — a web handler, a job runner —
/// crashed in its handler before the commit and after it, by `crash_during`, which needs no
/// connection of the test's. The pool has one connection: the one the crash left in its
/// transaction is discarded, not handed out again, and the next call runs on a new one.
#[test]
fn a_service_that_takes_its_own_connection_is_crashed_where_asked() {
    use diesel::r2d2::{ConnectionManager, Pool};
    let db = Db::new("testing_crash_during");
    let pool = Pool::builder()
        .max_size(1)
        .build(ConnectionManager::<DbConnection>::new(db.url()))
        .unwrap();
    let service = |msg: &Credit| credit(&mut pool.get().unwrap(), msg);
    let (first, second) = (Credit::new(1), Credit::new(2));
    assert_eq!(
        testing::crash_during(Crash::BeforeCommit, || service(&first)),
        testing::Crashed(Crash::BeforeCommit)
    );
    assert_eq!(testing::count(&mut db.connect(), &credits_of(&first)), 0);
    assert!(service(&first).unwrap().is_processed());
    testing::crash_during(Crash::AfterCommit, || service(&second));
    assert!(service(&second).unwrap().is_duplicate());
    testing::assert_once(&mut db.connect(), &credits_of(&first));
    testing::assert_once(&mut db.connect(), &credits_of(&second));
}
