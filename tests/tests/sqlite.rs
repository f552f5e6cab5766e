//! The backend suite on SQLite (always runs: SQLite is compiled in).

type Db = inbox_tests::sqlite::SqliteDb;
type DbConnection = diesel::SqliteConnection;

include!("behaviour/transaction.rs");
/// The same suite on SQLite's lean table design (`--lean`).
mod lean {
    type Db = inbox_tests::sqlite::LeanSqliteDb;
    type DbConnection = diesel::SqliteConnection;

    include!("behaviour/transaction.rs");
}
/// The batch form.
mod batch_form {
    type Db = inbox_tests::sqlite::SqliteDb;

    include!("behaviour/batch.rs");
}
/// Get-or-create.
mod get_or_create {
    type Db = inbox_tests::sqlite::SqliteDb;
    type Conn = diesel::SqliteConnection;
    const TABLES: &str = inbox_tests::unique::SQLITE_TABLES;
    const SETUP: &str = "PRAGMA busy_timeout = 10000";
    const PK: &str = "signups.id";
    const HANDLE: &str = "signups.handle";

    include!("behaviour/unique.rs");
}
/// Get-or-create on a partial unique index.
mod partial_index {
    type Db = inbox_tests::sqlite::SqliteDb;
    const ID_SQL: &str = "INTEGER PRIMARY KEY";
    const NO_MATCH: &str = "ON CONFLICT clause does not match any PRIMARY KEY or UNIQUE constraint";

    include!("behaviour/unique_partial.rs");
}
/// A connection to another database file where a checked one stood.
mod another_database {
    type Db = inbox_tests::sqlite::SqliteDb;
    type DbConnection = diesel::SqliteConnection;
    const TRIGGER: &str = "CREATE TRIGGER audit BEFORE INSERT ON inbox BEGIN SELECT 1; END";

    include!("behaviour/tenants.rs");
}
/// An application's enum of connections (diesel's `MultiConnection`) as the handler's.
mod multi_connection {
    type Db = inbox_tests::sqlite::SqliteDb;
    const TABLES: &str = inbox_tests::unique::SQLITE_TABLES;
    const SETUP: &str = "PRAGMA busy_timeout = 10000";

    include!("behaviour/multi.rs");
}
/// Composite keys: a tuple of parameters, a `format!` with inline arguments.
mod composite {
    type Db = inbox_tests::sqlite::SqliteDb;
    type DbConnection = diesel::SqliteConnection;

    include!("behaviour/composite.rs");
}
/// Claim mode after a transaction opened as SQL.
mod raw_begin {
    type Db = inbox_tests::sqlite::SqliteDb;
    type DbConnection = diesel::SqliteConnection;
    const BEGIN: [&str; 3] = [
        "BEGIN",
        "BEGIN IMMEDIATE",
        "BEGIN; UPDATE accounts SET balance = balance WHERE id = 1",
    ];

    include!("behaviour/raw_begin.rs");
}
/// `transaction = "caller"`: a job runner's transaction joined.
mod joined {
    type Db = inbox_tests::sqlite::SqliteDb;
    type DbConnection = diesel::SqliteConnection;
    /// The next job, skipping those another worker holds (where the backend can).
    const TAKE_JOB: &str = "SELECT id, message FROM jobs ORDER BY id LIMIT 1";

    include!("behaviour/joined.rs");
}
/// `inbox_diesel::testing`, as a user's suite uses it.
mod testing_kit {
    type Db = inbox_tests::sqlite::SqliteDb;
    type DbConnection = diesel::SqliteConnection;
    /// Locks account 1 until the transaction ends.
    const LOCK_ROW: &str = "UPDATE accounts SET balance = balance WHERE id = 1";

    include!("behaviour/testing.rs");
}
/// Stored results: a duplicate answers with the value its first delivery stored.
mod stored {
    type Db = inbox_tests::sqlite::SqliteDb;
    type DbConnection = diesel::SqliteConnection;
    const BACKEND: inbox_diesel::schema::Backend = inbox_diesel::schema::Backend::Sqlite;

    include!("behaviour/stored.rs");
}
/// Claim mode, sync.
mod claim_mode {
    use inbox_diesel::schema::sqlite::inbox;

    type Db = inbox_tests::sqlite::SqliteDb;
    type DbConnection = diesel::SqliteConnection;
    /// Makes inserts into the inbox wait until the transaction ends (any write takes the database's one write lock).
    const HOLD_INBOX_INSERTS: &str = "UPDATE accounts SET balance = balance WHERE id = 1";

    include!("behaviour/claim.rs");
}

use diesel::connection::SimpleConnection;
use inbox_tests::sqlite::SqliteDb;

#[idempotent(consumer = "credit", key = msg.id, busy_timeout_ms = 20, retries = 0)]
fn credit_impatient(conn: &mut DbConnection, msg: &Credit) -> Result<(), AppError> {
    apply_credit(conn, msg)?;
    Ok(())
}

#[idempotent(consumer = "credit", key = msg.id, busy_timeout_ms = 20, retries = 0, precheck = true)]
fn credit_impatient_prechecked(conn: &mut DbConnection, msg: &Credit) -> Result<(), AppError> {
    apply_credit(conn, msg)?;
    Ok(())
}

fn is_busy(result: &Result<Outcome<()>, AppError>) -> bool {
    matches!(result, Err(AppError::Inbox(e))
        if e.class() == ErrorClass::Transient(inbox_diesel::TransientKind::Busy))
}

/// `precheck = true` recognises a redelivery with one read, outside any transaction: while
/// another writer holds the database, it answers `Duplicate` where a handler that opens a
/// transaction waits and fails busy. A new message still takes the transaction.
#[test]
fn precheck_answers_a_duplicate_without_a_transaction() {
    let db = SqliteDb::new("precheck");
    let mut conn = db.connect();
    let msg = Credit::new(1);
    assert!(
        credit_impatient_prechecked(&mut conn, &msg)
            .unwrap()
            .is_processed()
    );

    let mut writer = db.connect();
    writer.batch_execute("BEGIN IMMEDIATE").unwrap();
    let opened = credit_impatient(&mut conn, &msg);
    assert!(is_busy(&opened), "{opened:?}");
    let prechecked = credit_impatient_prechecked(&mut conn, &msg).unwrap();
    assert!(prechecked.is_duplicate(), "{prechecked:?}");
    let fresh = credit_impatient_prechecked(&mut conn, &Credit::new(2));
    assert!(is_busy(&fresh), "{fresh:?}");
    writer.batch_execute("ROLLBACK").unwrap();

    assert_eq!(count_credits(&mut conn, &msg), 1);
    assert!(
        credit_impatient_prechecked(&mut conn, &Credit::new(2))
            .unwrap()
            .is_processed()
    );
}

/// A batch of 100 000 messages: more markers than SQLite takes bind parameters in one
/// statement (32 766, two per marker). The markers are inserted in chunks inside the one
/// transaction; the redelivered batch finds every one.
#[test]
fn a_batch_larger_than_one_statement_takes() {
    use inbox_diesel::idempotent;
    use inbox_tests::Credit;

    #[idempotent(consumer = "big", batch = msgs, key = |msg| msg.id)]
    fn count(conn: &mut diesel::SqliteConnection, msgs: &[Credit]) -> diesel::QueryResult<usize> {
        conn.batch_execute("SELECT 1")?;
        Ok(msgs.len())
    }

    let db = SqliteDb::new("big_batch");
    let mut conn = db.connect();
    let msgs: Vec<Credit> = (0..100_000).map(Credit::new).collect();
    let first = count(&mut conn, &msgs).unwrap();
    assert_eq!(
        (first.value, first.processed.len()),
        (Some(100_000), 100_000)
    );
    let again = count(&mut conn, &msgs).unwrap();
    assert_eq!((again.value, again.duplicates.len()), (None, 100_000));
}

/// A method's receiver indexed by a call is asked about with the index computed once: the
/// call runs once per statement, as written, and the statement's effect is the body's.
#[test]
fn a_receiver_indexed_by_a_call_computes_its_index_once() {
    use std::cell::Cell;

    #[idempotent(consumer = "indexed", key = msg.id)]
    fn sort_in(
        conn: &mut DbConnection,
        msg: &Credit,
        lanes: &mut Vec<Vec<i64>>,
        calls: &Cell<u32>,
    ) -> Result<(), AppError> {
        let pick = || {
            calls.set(calls.get() + 1);
            (msg.amount % 3) as usize
        };
        lanes[pick()].push(msg.amount);
        let route = [0, 1, 0];
        lanes[route[pick()]].push(-msg.amount);
        apply_credit(conn, msg)?;
        Ok(())
    }

    let db = SqliteDb::new("indexed");
    let mut conn = db.connect();
    let mut lanes = vec![Vec::new(), Vec::new()];
    let calls = Cell::new(0);
    let msg = Credit::new(3); // amount 10: lane 1, then route[1] = 1
    assert!(
        sort_in(&mut conn, &msg, &mut lanes, &calls)
            .unwrap()
            .is_processed()
    );
    assert_eq!(calls.get(), 2);
    assert_eq!(lanes, vec![vec![], vec![10, -10]]);
    assert!(
        sort_in(&mut conn, &msg, &mut lanes, &calls)
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(calls.get(), 2, "a duplicate runs no body");
}

/// The lean table's key is checked as the inbox's index is: its columns and its collations
/// (the key SQLite builds for a `WITHOUT ROWID` table is named by SQLite, not by the
/// migration). A key that compares consumers without case, or one on `message_id` alone, is
/// refused before any marker; the generated lean table passes.
#[test]
fn the_lean_tables_key_is_checked_as_the_index_is() {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    use inbox_diesel::InboxSchema;
    use inbox_diesel::schema::{Backend, OptionalColumns, verify};
    let lean = Backend::Sqlite.create_table_with_sql(
        &InboxSchema::DEFAULT,
        OptionalColumns {
            lean: true,
            ..OptionalColumns::default()
        },
    );
    for (ddl, expected) in [
        (
            lean.replace(
                "consumer      TEXT      NOT NULL",
                "consumer TEXT NOT NULL COLLATE NOCASE",
            ),
            Some("compares with the collation `NOCASE`"),
        ),
        (
            lean.replace(
                "PRIMARY KEY (message_id, consumer)",
                "PRIMARY KEY (message_id)",
            ),
            Some("ux_inbox_message_consumer"),
        ),
        (lean.clone(), None),
    ] {
        if expected.is_some() {
            assert_ne!(ddl, lean, "the edit applies");
        }
        let mut conn = diesel::SqliteConnection::establish(":memory:").unwrap();
        conn.batch_execute(&ddl).unwrap();
        let checked = verify(&mut conn, &InboxSchema::DEFAULT);
        match expected {
            None => assert!(checked.is_ok(), "{ddl}: {checked:?}"),
            Some(text) => {
                let error = checked.expect_err(&ddl).to_string();
                assert!(error.contains(text), "{ddl}: {error}");
            }
        }
    }
}

/// A body that ends the handler's transaction itself — a `ROLLBACK` or `COMMIT` it sends —
/// after which its writes commit on their own: `COMMIT` failed with "no transaction is
/// active" (dead-lettered, its later writes kept), or after the body's own `BEGIN` committed
/// the body's transaction without the marker (`Processed`, applied again by each
/// redelivery). The handler's savepoint names its transaction: gone, the delivery is
/// `TransactionEnded` (an alert), never `Processed`, and the connection goes on.
#[test]
fn a_body_that_ends_its_transaction_is_reported_never_processed() {
    let shapes: [(&str, &str); 3] = [
        (
            "rolls back, then writes",
            "ROLLBACK; UPDATE accounts SET balance = balance + 100 WHERE id = 1",
        ),
        (
            "commits, then writes",
            "COMMIT; UPDATE accounts SET balance = balance + 100 WHERE id = 1",
        ),
        (
            "rolls back, begins, writes",
            "ROLLBACK; BEGIN; UPDATE accounts SET balance = balance + 100 WHERE id = 1",
        ),
    ];
    let db = SqliteDb::new("ended");
    for (n, (shape, sql)) in shapes.into_iter().enumerate() {
        let mut conn = db.connect();
        for then_fails in [false, true] {
            let msg = Credit::new(100 + 2 * n as u128 + u128::from(then_fails));
            let result = credit_then(&mut conn, &msg, &mut |conn| {
                conn.batch_execute(sql)?;
                match then_fails {
                    true => Err(AppError::Rejected),
                    false => Ok(()),
                }
            });
            // A body that then fails is a failure either way (SQLite also rolls a
            // transaction back itself on some errors: its savepoint's absence after a
            // body's error is no proof the body ended it); one that returns `Ok` is
            // reported as what it did.
            if then_fails {
                assert!(result.is_err(), "{shape}: {result:?}");
                continue;
            }
            let Err(AppError::Inbox(error)) = &result else {
                panic!("{shape}: {result:?}")
            };
            assert!(
                matches!(error, inbox_diesel::Error::TransactionEnded),
                "{shape}: {error:?}"
            );
            assert_eq!(error.action(), inbox_diesel::Action::Alert);
        }
        // The connection goes on: the next message is processed, in a transaction of its own.
        let next = credit(&mut conn, &Credit::new(200 + n as u128)).unwrap();
        assert_eq!(next, Outcome::Processed(()), "{shape}");
    }
}

/// A connection's first delivery meets another connection's exclusive lock (a database in
/// SQLite's default rollback journal, in the middle of another's commit): the startup
/// check's catalog reads wait with the handler's busy timeout, as its statements do, where
/// they failed at once with `SQLITE_BUSY` before.
#[test]
fn the_first_delivery_on_a_connection_waits_for_a_writers_lock() {
    let db = SqliteDb::new("check_waits");
    db.connect()
        .batch_execute("PRAGMA journal_mode = DELETE")
        .unwrap();
    let mut holder = db.connect();
    holder.batch_execute("BEGIN EXCLUSIVE").unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        holder.batch_execute("COMMIT").unwrap();
    });
    // A fresh connection, no statement sent on it yet: what a pool hands out.
    let mut conn = diesel::SqliteConnection::establish(db.url()).unwrap();
    let outcome = credit(&mut conn, &Credit::new(1));
    release.join().unwrap();
    assert!(outcome.unwrap().is_processed());
    assert_eq!(count_markers(&mut conn), 1);
}
