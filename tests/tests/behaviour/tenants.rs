// A connection to another database standing where a checked one stood: a database per
// tenant, each tenant's connection opened in turn into one variable. The runtime remembers
// a check by what stays with a connection on the client, and that is the same place. The
// other database's inbox has a trigger, which the check refuses. Before each marker insert
// required the database and table the check read, the check was skipped there: the message
// was processed on a table the check refuses, in every mode. The insert is refused by the
// server instead, the runtime checks that database's table on the session, and refuses it;
// nothing is written there, and the first database goes on.
//
// Included with `Db`, `DbConnection` and `TRIGGER` (SQL giving the inbox a trigger) in
// scope.

use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::RunQueryDsl;
use diesel::connection::SimpleConnection;
use inbox_diesel::{ErrorClass, Outcome, idempotent};
use inbox_tests::count;

#[idempotent(consumer = "tenant", key = id)]
fn credit(conn: &mut DbConnection, id: &str) -> Result<(), inbox_diesel::Error> {
    let _ = id;
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    Ok(())
}

#[idempotent(consumer = "tenant-batch", batch = ids, key = |id| id.as_str())]
fn credit_all(conn: &mut DbConnection, ids: &[String]) -> Result<(), inbox_diesel::Error> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    let _ = ids;
    Ok(())
}

#[idempotent(consumer = "tenant-claim", key = id, mode = "claim")]
fn notify(
    conn: &mut DbConnection,
    id: &str,
    sent: &AtomicUsize,
) -> Result<(), inbox_diesel::Error> {
    let _ = id;
    sent.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

fn refused<T: std::fmt::Debug>(result: Result<T, inbox_diesel::Error>) {
    let error = result.unwrap_err();
    assert_eq!(error.class(), ErrorClass::Schema, "{error:?}");
    let chain = inbox_tests::error_chain(&error);
    assert!(chain.contains("trigger"), "{chain}");
}

fn balance(db: &Db) -> i64 {
    count(
        &mut db.connect(),
        "SELECT balance AS n FROM accounts WHERE id = 1",
    )
}

fn markers(db: &Db) -> i64 {
    count(&mut db.connect(), "SELECT count(*) AS n FROM inbox")
}

#[test]
fn a_connection_to_another_database_where_a_checked_one_stood_is_checked() {
    let (checked, other) = (Db::new("tenant_checked"), Db::new("tenant_other"));
    other.connect().batch_execute(TRIGGER).unwrap();
    let sent = AtomicUsize::new(0);
    let batch = |n: u32| vec![format!("b-{n}"), format!("b-{}", n + 1)];
    let mut conn = checked.connect();
    assert_eq!(credit(&mut conn, "m-1").unwrap(), Outcome::Processed(()));
    assert_eq!(credit_all(&mut conn, &batch(1)).unwrap().processed, [0, 1]);
    assert!(notify(&mut conn, "n-1", &sent).unwrap().is_processed());
    // The same variable, the same place: another database's connection.
    conn = other.connect();
    refused(credit(&mut conn, "m-2"));
    refused(credit_all(&mut conn, &batch(3)));
    refused(notify(&mut conn, "n-2", &sent));
    assert_eq!(markers(&other), 0);
    assert_eq!(balance(&other), 0);
    assert_eq!(sent.load(Ordering::SeqCst), 1, "no side effect there");
    // Back in the checked database, in the same place again.
    conn = checked.connect();
    assert!(credit(&mut conn, "m-1").unwrap().is_duplicate());
    assert!(credit(&mut conn, "m-3").unwrap().is_processed());
    assert!(notify(&mut conn, "n-1", &sent).unwrap().is_duplicate());
    assert_eq!(balance(&checked), 3);
}
