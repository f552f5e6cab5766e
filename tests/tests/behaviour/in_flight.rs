// `on_locked = "in_flight"` on one backend: included into a module that names `Db` (the
// fixture), `Conn` (its connection), `SESSION_LOCK_WAIT` (the statement that sets the
// session's own lock wait) and `LOCK_WAIT_RESTORED` (a statement that fails unless the body
// waits for locks as the session had it).

/// A holds the marker of message 1 in its body until told to go on; B's delivery of message 1
/// answers `InFlight` while A holds it, and `Duplicate` once A has committed.
#[test]
fn answers_in_flight_instead_of_waiting() {
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

    let db = Db::new("in_flight");
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
