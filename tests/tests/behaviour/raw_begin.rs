// A transaction opened outside diesel — `BEGIN` (`START TRANSACTION`) sent as SQL and left
// open — before a claim-mode handler. Claim mode commits its claim on its own before the
// side effect; inside that transaction the claim would commit only with it, and roll back
// with the connection after the side effect ran: a redelivery runs it again. The handler
// refuses before anything is written (`CalledInsideTransaction`), the side effect never
// runs, and once the transaction is ended the same connection processes the message.
//
// Included with `Db`, `DbConnection` and `BEGIN` (the SQL that opens the transaction) in
// scope.

use std::sync::atomic::{AtomicUsize, Ordering};

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
