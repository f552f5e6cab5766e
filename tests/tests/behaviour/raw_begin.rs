// A transaction opened outside diesel — `BEGIN` (`START TRANSACTION`) sent as SQL and left
// open — before a handler, in either mode.
//
// Claim mode: Claim mode commits its claim on its own before the
// side effect; inside that transaction the claim would commit only with it, and roll back
// with the connection after the side effect ran: a redelivery runs it again. The handler
// refuses before anything is written (`CalledInsideTransaction`), the side effect never
// runs, and once the transaction is ended the same connection processes the message.
//
// Transaction mode: the handler's `BEGIN` joined the caller's transaction on PostgreSQL (a
// warning), and committed it on MySQL and MariaDB (`START TRANSACTION` commits an open
// one): the caller's writes committed with the marker, or before it, as the caller never
// meant. The handler refuses before its body runs, and commits nothing of the caller's.
//
// Included with `Db`, `DbConnection` and `BEGIN` (the SQL that opens the transaction) in
// scope.

use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::RunQueryDsl;
use diesel::connection::SimpleConnection;
use inbox_diesel::{Action, Error, ErrorClass, idempotent};

#[idempotent(consumer = "raw-begin", key = id, mode = "claim")]
fn notify(conn: &mut DbConnection, id: &str, sent: &AtomicUsize) -> Result<(), Error> {
    let _ = id;
    sent.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[test]
fn a_claim_inside_a_transaction_opened_as_sql_is_refused() {
    let db = Db::new("raw_begin");
    let sent = AtomicUsize::new(0);
    let mut conn = db.connect();
    // The check runs first, outside the transaction.
    assert!(notify(&mut conn, "n-0", &sent).unwrap().is_processed());
    for begin in BEGIN {
        conn.batch_execute(begin).unwrap();
        let error = notify(&mut conn, "n-1", &sent).unwrap_err();
        assert!(
            matches!(error, Error::CalledInsideTransaction),
            "{begin}: {error:?}"
        );
        assert_eq!(error.class(), ErrorClass::Misuse);
        assert_eq!(error.action(), Action::Alert);
        assert_eq!(sent.load(Ordering::SeqCst), 1, "{begin}: no side effect");
        conn.batch_execute("ROLLBACK").unwrap();
    }
    assert_eq!(
        inbox_tests::count(
            &mut db.connect(),
            "SELECT count(*) AS n FROM inbox WHERE consumer = 'raw-begin'"
        ),
        1,
        "only n-0's claim"
    );
    // The transaction ended, the same connection goes on.
    assert!(notify(&mut conn, "n-1", &sent).unwrap().is_processed());
    assert!(notify(&mut conn, "n-1", &sent).unwrap().is_duplicate());
    assert_eq!(sent.load(Ordering::SeqCst), 2);
}

#[idempotent(consumer = "raw-begin-tx", key = id)]
fn credit(conn: &mut DbConnection, id: &str, ran: &AtomicUsize) -> Result<(), Error> {
    let _ = id;
    ran.fetch_add(1, Ordering::SeqCst);
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    Ok(())
}

#[test]
fn a_handler_inside_a_transaction_opened_as_sql_is_refused() {
    let db = Db::new("raw_begin_tx");
    let ran = AtomicUsize::new(0);
    let mut conn = db.connect();
    assert!(credit(&mut conn, "c-0", &ran).unwrap().is_processed());
    for begin in BEGIN {
        conn.batch_execute(begin).unwrap();
        // The caller's own write, in its transaction.
        conn.batch_execute("UPDATE accounts SET balance = balance + 1000 WHERE id = 2")
            .unwrap_or_else(|e| panic!("{begin}: {e}"));
        let error = credit(&mut conn, "c-1", &ran).unwrap_err();
        assert!(
            matches!(error, Error::CalledInsideTransaction),
            "{begin}: {error:?}"
        );
        assert_eq!(error.action(), Action::Alert);
        assert_eq!(ran.load(Ordering::SeqCst), 1, "{begin}: the body never ran");
        // Nothing of the caller's committed: seen from another connection while its
        // transaction is still there.
        assert_eq!(
            inbox_tests::balance(&mut db.connect(), 2),
            0,
            "{begin}: the caller's write committed"
        );
        conn.batch_execute("ROLLBACK").unwrap();
        assert_eq!(inbox_tests::balance(&mut db.connect(), 2), 0, "{begin}");
    }
    assert_eq!(
        inbox_tests::balance(&mut db.connect(), 1),
        1,
        "only c-0's body"
    );
    assert_eq!(
        inbox_tests::count(
            &mut db.connect(),
            "SELECT count(*) AS n FROM inbox WHERE consumer = 'raw-begin-tx'"
        ),
        1,
        "only c-0's marker"
    );
    // The transaction ended, the same connection goes on.
    assert!(credit(&mut conn, "c-1", &ran).unwrap().is_processed());
    assert!(credit(&mut conn, "c-1", &ran).unwrap().is_duplicate());
    assert_eq!(inbox_tests::balance(&mut db.connect(), 1), 2);
}
