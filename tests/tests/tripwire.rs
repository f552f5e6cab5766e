//! The run-time tripwire on the sync runtime, on SQLite: a helper called by an
//! `#[idempotent]` handler checks a connection out of an r2d2 pool and writes. The mark is
//! set while the body runs and cleared after it, however the body ends.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};

use diesel::prelude::*;
use diesel::r2d2::ConnectionManager;
use inbox_diesel::tripwire::{self, InsideHandler, OnTrip};
use inbox_diesel::{InFlightOutcome, Outcome, idempotent};
use inbox_tests::sqlite::SqliteDb;
use inbox_tests::tripwire::{AuditDb, Logged, TripError, audit, panic_message, rows};
use inbox_tests::{Credit, credits, wait_until};

type Manager = ConnectionManager<SqliteConnection>;

/// What a service hands its handlers: the audit trail's pool, guarded.
struct Services {
    audit: tripwire::r2d2::GuardedPool<Manager>,
}

/// The same, with the plain pool: only an event handler can see its checkouts.
struct PlainServices {
    audit: diesel::r2d2::Pool<Manager>,
}

/// A helper as services write them: given the services, it checks its own connection out.
fn record(services: &Services, msg: &Credit) -> Result<(), TripError> {
    let mut conn = services.audit.get()?;
    write_audit(&mut conn, msg)
}

fn record_plain(services: &PlainServices, msg: &Credit) -> Result<(), TripError> {
    let mut conn = services.audit.get()?;
    write_audit(&mut conn, msg)
}

fn write_audit(conn: &mut SqliteConnection, msg: &Credit) -> Result<(), TripError> {
    diesel::insert_into(audit::table)
        .values(audit::message.eq(msg.id.to_string()))
        .execute(conn)?;
    Ok(())
}

/// The business write, in the handler's transaction.
fn credit(conn: &mut SqliteConnection, msg: &Credit) -> QueryResult<usize> {
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.id.to_string()),
            credits::account.eq(msg.account),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)
}

#[idempotent(consumer = "credit-audited", key = msg.id)]
fn credit_audited(
    conn: &mut SqliteConnection,
    services: &Services,
    msg: &Credit,
) -> Result<(), TripError> {
    credit(conn, msg)?;
    record(services, msg)?;
    Ok(())
}

#[idempotent(consumer = "credit-audit-swallowed", key = msg.id)]
fn credit_audit_swallowed(
    conn: &mut SqliteConnection,
    services: &Services,
    msg: &Credit,
) -> Result<(), TripError> {
    credit(conn, msg)?;
    // A helper that treats the refusal as "no audit today" and goes on.
    let _ = record(services, msg);
    Ok(())
}

#[idempotent(consumer = "credit-audited-anyway", key = msg.id)]
fn credit_audited_anyway(
    conn: &mut SqliteConnection,
    services: &Services,
    msg: &Credit,
) -> Result<(), TripError> {
    credit(conn, msg)?;
    tripwire::allow_outside_transaction("the audit trail records every delivery", || {
        record(services, msg)
    })?;
    Ok(())
}

/// Writes through the plain pool, then fails when told to.
#[idempotent(consumer = "credit-plain", key = msg.id)]
fn credit_plain(
    conn: &mut SqliteConnection,
    services: &PlainServices,
    msg: &Credit,
    fail: bool,
) -> Result<(), TripError> {
    credit(conn, msg)?;
    record_plain(services, msg)?;
    if fail {
        return Err(TripError::Failed);
    }
    Ok(())
}

fn plain_pool(audit: &AuditDb, on: Option<OnTrip>) -> diesel::r2d2::Pool<Manager> {
    let builder = diesel::r2d2::Pool::builder().max_size(2);
    let builder = match on {
        Some(on) => builder.event_handler(Box::new(tripwire::r2d2::Tripwire::new(on))),
        None => builder,
    };
    builder.build(Manager::new(audit.url())).unwrap()
}

/// The leak the tripwire closes: without it, the helper's write commits on its own — kept
/// when the handler fails and rolls back, and applied again by the redelivery.
#[test]
fn without_a_tripwire_a_helper_write_commits_once_per_delivery() {
    let (db, audit) = (SqliteDb::new("no_tripwire"), AuditDb::new());
    let services = PlainServices {
        audit: plain_pool(&audit, None),
    };
    let mut conn = db.connect();
    let msg = Credit::new(1);

    let failed = credit_plain(&mut conn, &services, &msg, true);
    assert!(matches!(failed, Err(TripError::Failed)), "{failed:?}");
    assert_eq!(
        (rows(&mut conn, "inbox"), rows(&mut conn, "credits")),
        (0, 0)
    );
    assert_eq!(audit.rows(), 1, "committed on its own, rolled back or not");

    let redelivered = credit_plain(&mut conn, &services, &msg, false).unwrap();
    assert_eq!(redelivered, Outcome::Processed(()));
    assert_eq!(audit.rows(), 2, "one message, two audit rows");
}

/// A body that swallows the refusal does not make the handler succeed: the checkout it
/// tried is a bug wherever the error went, and the answer says so (`Alert`) — a pump that
/// settled the body's `Ok` would have acknowledged a message whose audit never ran, and one
/// that settled the application's error would have dead-lettered it. Nothing committed.
#[test]
fn a_swallowed_refusal_is_still_the_answer() {
    let (db, audit) = (SqliteDb::new("r2d2_swallowed"), AuditDb::new());
    let services = Services {
        audit: tripwire::r2d2::GuardedPool::new(plain_pool(&audit, None)),
    };
    let mut conn = db.connect();
    let msg = Credit::new(1);
    match credit_audit_swallowed(&mut conn, &services, &msg) {
        Err(TripError::Inbox(error @ inbox_diesel::Error::CheckoutInsideHandler(inside))) => {
            assert_eq!(error.action(), inbox_diesel::Action::Alert);
            assert_eq!(inside.consumer(), "credit-audit-swallowed");
        }
        other => panic!("expected the refusal as the answer, got {other:?}"),
    }
    assert_eq!(audit.rows(), 0);
    assert_eq!(
        (rows(&mut conn, "inbox"), rows(&mut conn, "credits")),
        (0, 0)
    );
    assert_eq!(tripwire::inside_handler(), None);
}

/// The guarded pool refuses the helper's checkout with an error: the handler returns it and
/// rolls back, nothing reaches the audit database, and the pool is as it was.
#[test]
fn r2d2_checkout_inside_a_handler_is_refused() {
    let (db, audit) = (SqliteDb::new("r2d2_refused"), AuditDb::new());
    let services = Services {
        audit: tripwire::r2d2::GuardedPool::new(plain_pool(&audit, None)),
    };
    let before = services.audit.inner().state();
    let mut conn = db.connect();
    let msg = Credit::new(1);

    // The helper hands the refusal up as the application's error; the handler answers
    // with the inbox's, whatever the body made of it: a bug to fix (`Alert`).
    match credit_audited(&mut conn, &services, &msg) {
        Err(TripError::Inbox(error @ inbox_diesel::Error::CheckoutInsideHandler(inside))) => {
            assert_eq!(error.class(), inbox_diesel::ErrorClass::Misuse);
            assert_eq!(inside.consumer(), "credit-audited");
            let message = inside.to_string();
            assert!(message.contains("`credit-audited`"), "{message}");
            assert!(message.contains("allow_outside_transaction"), "{message}");
        }
        other => panic!("expected the checkout refused, got {other:?}"),
    }
    assert_eq!(audit.rows(), 0, "the helper's write never ran");
    assert_eq!(
        (rows(&mut conn, "inbox"), rows(&mut conn, "credits")),
        (0, 0)
    );
    let after = services.audit.inner().state();
    assert_eq!(
        (after.connections, after.idle_connections),
        (before.connections, before.idle_connections),
        "the pool was not touched"
    );
    assert_eq!(tripwire::inside_handler(), None);

    // The pool keeps working, outside the handler.
    record(&services, &msg).unwrap();
    assert_eq!(audit.rows(), 1);
}

/// Outside any handler, neither the guarded pool nor the event handler — set to panic —
/// stands in the way.
#[test]
fn r2d2_checkout_outside_a_handler_is_not_affected() {
    let audit = AuditDb::new();
    let plain = plain_pool(&audit, Some(OnTrip::Panic));
    let services = Services {
        audit: tripwire::r2d2::GuardedPool::new(plain.clone()),
    };
    let msg = Credit::new(1);
    record(&services, &msg).unwrap();
    assert!(services.audit.try_get().unwrap().is_some());
    record_plain(&PlainServices { audit: plain }, &msg).unwrap();
    assert_eq!(audit.rows(), 2);
}

/// `allow_outside_transaction` lifts the mark for the statement that says why: its write
/// commits on its own, once per delivery that runs the body.
#[test]
fn allow_outside_transaction_lets_a_checkout_through() {
    let (db, audit) = (SqliteDb::new("r2d2_allowed"), AuditDb::new());
    let services = Services {
        audit: tripwire::r2d2::GuardedPool::new(plain_pool(&audit, Some(OnTrip::Panic))),
    };
    let mut conn = db.connect();
    let msg = Credit::new(1);
    assert_eq!(
        credit_audited_anyway(&mut conn, &services, &msg).unwrap(),
        Outcome::Processed(())
    );
    assert!(
        credit_audited_anyway(&mut conn, &services, &msg)
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(audit.rows(), 1);
    assert_eq!(
        (rows(&mut conn, "inbox"), rows(&mut conn, "credits")),
        (1, 1)
    );
}

/// r2d2's event handler cannot return an error: `OnTrip::Panic` panics inside `get`. The
/// helper never holds the connection and its write never runs; r2d2 closes that connection
/// and opens another, and the pool keeps working.
#[test]
fn r2d2_event_handler_panics_at_a_checkout_of_the_plain_pool() {
    let (db, audit) = (SqliteDb::new("r2d2_panic"), AuditDb::new());
    let services = PlainServices {
        audit: plain_pool(&audit, Some(OnTrip::Panic)),
    };
    let mut conn = db.connect();
    let msg = Credit::new(1);

    let panicked = catch_unwind(AssertUnwindSafe(|| {
        credit_plain(&mut conn, &services, &msg, false)
    }))
    .expect_err("the checkout panics");
    let message = panic_message(&*panicked);
    assert!(message.contains("`credit-plain`"), "{message}");
    assert_eq!(tripwire::inside_handler(), None);
    // The unwinding left the handler's transaction open on its connection: closing it
    // rolls the transaction back.
    drop(conn);

    let mut conn = db.connect();
    assert_eq!(audit.rows(), 0, "the helper's write never ran");
    assert_eq!(
        (rows(&mut conn, "inbox"), rows(&mut conn, "credits")),
        (0, 0)
    );
    wait_until("r2d2 replaced the closed connection", || {
        services.audit.state().connections == 2
    });
    record_plain(&services, &msg).unwrap();
    assert_eq!(audit.rows(), 1);
}

/// `OnTrip::Log` reports the checkout at error level, naming the handler, and lets it
/// through: the write commits on its own.
#[test]
fn r2d2_event_handler_logs_a_checkout_of_the_plain_pool() {
    let (db, audit) = (SqliteDb::new("r2d2_log"), AuditDb::new());
    let services = PlainServices {
        audit: plain_pool(&audit, Some(OnTrip::Log)),
    };
    let mut conn = db.connect();
    let logged = Logged::capture();

    record_plain(&services, &Credit::new(1)).unwrap();
    assert_eq!(logged.text(), "", "nothing to report outside a handler");
    let outcome = credit_plain(&mut conn, &services, &Credit::new(2), false).unwrap();
    assert_eq!(outcome, Outcome::Processed(()));
    assert_eq!(audit.rows(), 2, "reported, not refused");
    let text = logged.text();
    assert!(text.contains("ERROR"), "{text}");
    assert!(text.contains("consumer=\"credit-plain\""), "{text}");
    assert!(text.contains("commits on its own"), "{text}");
}

/// How a body under test ends.
#[derive(Debug, Clone, Copy)]
enum Ending {
    Ok,
    Err,
    Panic,
}

#[idempotent(consumer = "mark-single", key = msg.id)]
fn marked_single(
    conn: &mut SqliteConnection,
    msg: &Credit,
    seen: &Cell<Option<InsideHandler>>,
    ending: Ending,
) -> Result<(), TripError> {
    credit(conn, msg)?;
    seen.set(tripwire::inside_handler());
    match ending {
        Ending::Ok => Ok(()),
        Ending::Err => Err(TripError::Failed),
        Ending::Panic => panic!("the body panics"),
    }
}

// The expansion slices the batch parameter (`&msgs[..]`), which clippy calls redundant on a
// `&[_]` written outside a macro_rules! suite.
#[idempotent(consumer = "mark-batch", batch = msgs, key = |msg| msg.id)]
fn marked_batch(
    conn: &mut SqliteConnection,
    msgs: &[Credit],
    seen: &Cell<Option<InsideHandler>>,
) -> Result<(), TripError> {
    for msg in msgs {
        credit(conn, msg)?;
    }
    seen.set(tripwire::inside_handler());
    Ok(())
}

#[idempotent(consumer = "mark-claim", key = msg.id, mode = "claim")]
fn marked_claim(
    _conn: &mut SqliteConnection,
    msg: &Credit,
    seen: &Cell<Option<InsideHandler>>,
) -> Result<(), TripError> {
    seen.set(tripwire::inside_handler());
    Ok(())
}

fn consumer(seen: &Cell<Option<InsideHandler>>) -> Option<&'static str> {
    seen.take().map(|inside| inside.consumer())
}

/// The body runs under its handler's mark, and the mark is gone when the handler returns
/// `Ok`, returns `Err`, or unwinds from a panic.
#[test]
fn the_mark_is_set_in_the_body_and_cleared_after_ok_err_and_panic() {
    let db = SqliteDb::new("mark_endings");
    let seen = Cell::new(None);
    assert_eq!(tripwire::inside_handler(), None);

    let mut conn = db.connect();
    let ok = marked_single(&mut conn, &Credit::new(1), &seen, Ending::Ok);
    assert_eq!(ok.unwrap(), Outcome::Processed(()));
    assert_eq!(consumer(&seen), Some("mark-single"));
    assert_eq!(tripwire::inside_handler(), None, "after Ok");

    let err = marked_single(&mut conn, &Credit::new(2), &seen, Ending::Err);
    assert!(matches!(err, Err(TripError::Failed)), "{err:?}");
    assert_eq!(consumer(&seen), Some("mark-single"));
    assert_eq!(tripwire::inside_handler(), None, "after Err");

    let panicked = catch_unwind(AssertUnwindSafe(|| {
        marked_single(&mut conn, &Credit::new(3), &seen, Ending::Panic)
    }));
    assert_eq!(panic_message(&*panicked.unwrap_err()), "the body panics");
    assert_eq!(consumer(&seen), Some("mark-single"));
    assert_eq!(tripwire::inside_handler(), None, "after a panic");
}

/// A batch's body and a claim-mode body run under the mark too.
#[test]
fn the_mark_covers_batch_and_claim_bodies() {
    let db = SqliteDb::new("mark_modes");
    let mut conn = db.connect();
    let seen = Cell::new(None);

    let batch = marked_batch(&mut conn, &[Credit::new(1), Credit::new(2)], &seen).unwrap();
    assert_eq!(batch.processed, vec![0, 1]);
    assert_eq!(consumer(&seen), Some("mark-batch"));
    assert_eq!(tripwire::inside_handler(), None);

    let claimed = marked_claim(&mut conn, &Credit::new(3), &seen).unwrap();
    assert_eq!(claimed, InFlightOutcome::Processed(()));
    assert_eq!(consumer(&seen), Some("mark-claim"));
    assert_eq!(tripwire::inside_handler(), None);
}

/// A handler run from inside another's body — on a connection of its own, to a database of
/// its own — marks its own body, and puts the outer handler's mark back when it returns.
#[idempotent(consumer = "mark-outer", key = msg.id)]
fn marked_outer(
    _conn: &mut SqliteConnection,
    inner_db: &SqliteDb,
    msg: &Credit,
    seen: &Cell<Option<InsideHandler>>,
    after_inner: &Cell<Option<InsideHandler>>,
) -> Result<(), TripError> {
    run_inner(inner_db, msg, seen)?;
    after_inner.set(tripwire::inside_handler());
    Ok(())
}

fn run_inner(
    inner_db: &SqliteDb,
    msg: &Credit,
    seen: &Cell<Option<InsideHandler>>,
) -> Result<(), TripError> {
    let inner = marked_single(&mut inner_db.connect(), msg, seen, Ending::Ok)?;
    assert_eq!(inner, Outcome::Processed(()));
    Ok(())
}

#[test]
fn a_nested_handler_restores_the_outer_mark() {
    let (db, inner_db) = (SqliteDb::new("mark_outer"), SqliteDb::new("mark_inner"));
    let (seen, after_inner) = (Cell::new(None), Cell::new(None));
    let outcome = marked_outer(
        &mut db.connect(),
        &inner_db,
        &Credit::new(1),
        &seen,
        &after_inner,
    );
    assert_eq!(outcome.unwrap(), Outcome::Processed(()));
    assert_eq!(consumer(&seen), Some("mark-single"));
    assert_eq!(consumer(&after_inner), Some("mark-outer"));
    assert_eq!(tripwire::inside_handler(), None);
}
