// `on_locked = "in_flight"` on one backend: included into a module that names `Db` (the
// fixture), `Conn` (its connection), `SESSION_LOCK_WAIT` (the statement that sets the
// session's own lock wait) and `LOCK_WAIT_RESTORED` (a statement that fails unless the body
// waits for locks as the session had it).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use inbox_diesel::{InFlightOutcome, idempotent};

#[idempotent(consumer = "credit", key = *id, on_locked = "in_flight")]
fn credit(conn: &mut Conn, id: &u64, hold: &dyn Fn()) -> diesel::QueryResult<()> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")?;
    // Fails unless the body waits for locks as the session had it.
    conn.batch_execute(LOCK_WAIT_RESTORED)?;
    hold();
    Ok(())
}

/// `credit`, keeping its result and the request's fingerprint (what an HTTP request with an
/// `Idempotency-Key` keeps): on PostgreSQL the marker is written at the commit, and a second
/// delivery meets the first's lock on the key instead of its marker.
#[idempotent(
    consumer = "credit",
    key = *id,
    on_locked = "in_flight",
    store_result = true,
    fingerprint = id.to_le_bytes()
)]
fn credit_kept(conn: &mut Conn, id: &u64, hold: &dyn Fn()) -> diesel::QueryResult<u64> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")?;
    conn.batch_execute(LOCK_WAIT_RESTORED)?;
    hold();
    Ok(*id)
}

/// A holds the marker of message 1 in its body until told to go on; B's delivery of message 1
/// answers `InFlight` while A holds it, and `Duplicate` once A has committed.
#[test]
fn answers_in_flight_instead_of_waiting() {
    in_flight_then_duplicate(&Db::new("in_flight"), credit);
}

/// The same where the handler keeps its result and fingerprint.
#[test]
fn a_kept_result_answers_in_flight_instead_of_waiting() {
    let db = Db::new("in_flight_kept");
    let (backend, schema) = (
        <Conn as inbox_diesel::InboxConnection>::BACKEND,
        inbox_diesel::InboxSchema::DEFAULT,
    );
    let mut conn = db.connect();
    conn.batch_execute(&backend.add_result_sql(&schema))
        .unwrap();
    conn.batch_execute(&backend.add_fingerprint_sql(&schema))
        .unwrap();
    in_flight_then_duplicate(&db, credit_kept);
}

/// A delivery of message `id` that calls `hold` in its body.
type Credit<T> = fn(&mut Conn, &u64, &dyn Fn()) -> diesel::QueryResult<InFlightOutcome<T>>;

fn in_flight_then_duplicate<T: std::fmt::Debug + Send>(db: &Db, credit: Credit<T>) {
    let (held_tx, held) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let mut a = db.connect();
        a.batch_execute(SESSION_LOCK_WAIT).unwrap();
        let first = scope.spawn(move || {
            credit(&mut a, &1, &|| {
                held_tx.send(()).unwrap();
                go.recv().unwrap();
            })
        });
        held.recv().unwrap();
        let mut b = db.connect();
        b.batch_execute(SESSION_LOCK_WAIT).unwrap();
        let started = Instant::now();
        let answer = credit(&mut b, &1, &|| {}).unwrap();
        assert!(
            matches!(answer, InFlightOutcome::InFlight { .. }),
            "{answer:?}"
        );
        assert!(!answer.should_ack());
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        go_tx.send(()).unwrap();
        assert!(first.join().unwrap().unwrap().is_processed());
        assert!(credit(&mut b, &1, &|| {}).unwrap().is_duplicate());
    });
    let balance = inbox_tests::server::count(
        &mut db.connect(),
        "SELECT balance AS n FROM accounts WHERE id = 1",
    );
    assert_eq!(balance, 1, "message 1, once");
}
