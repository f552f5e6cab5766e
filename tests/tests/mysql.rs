//! The backend suite on MySQL/MariaDB, plus what MySQL does its own way: the lock wait on a
//! uniquely keyed insert, deadlocks, and its messages. Needs `INBOX_TEST_MYSQL`.

inbox_tests::suite!(inbox_tests::mysql::MysqlDb, diesel::MysqlConnection);

use std::sync::atomic::AtomicBool;
use std::sync::mpsc;

use diesel::connection::SimpleConnection;
use inbox_diesel::{InboxSchema, TransientKind, classify};
use inbox_tests::mysql::MysqlDb;
use inbox_tests::wait_until;

type HandlerResult = Result<Outcome<()>, AppError>;

/// Makes A and B overlap for certain: A's body holds (`hold`) until the server shows one
/// transaction of the test database waiting for a lock — B, behind A.
fn a_holds_b_waits(
    db: &MysqlDb,
    a: impl FnOnce(&mut DbConnection, &dyn Fn()) -> HandlerResult + Send,
    b: impl FnOnce(&mut DbConnection) -> HandlerResult + Send,
) -> (HandlerResult, HandlerResult) {
    let (holding_tx, holding) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let mut conn_a = db.connect();
        let a = scope.spawn(move || {
            a(&mut conn_a, &|| {
                holding_tx.send(()).unwrap();
                go.recv().unwrap();
            })
        });
        holding.recv().unwrap();
        let mut conn_b = db.connect();
        let b = scope.spawn(move || b(&mut conn_b));
        let mut observer = db.connect();
        wait_until("B waits for a lock A holds", || {
            db.transactions_waiting_for_a_lock(&mut observer) == 1
        });
        go_tx.send(()).unwrap();
        (a.join().unwrap(), b.join().unwrap())
    })
}

/// A holds an uncommitted marker; B's plain insert of the same marker waits on InnoDB's
/// unique-key lock. A commits → B's insert fails with 1062 on the inbox index: a duplicate.
#[test]
fn lock_wait_then_commit_makes_the_waiter_a_duplicate() {
    let db = MysqlDb::new("lock_wait_commit");
    let msg = Credit::new(1);
    let (a, b) = a_holds_b_waits(
        &db,
        |conn, hold| {
            credit_then(conn, &msg, &mut |_| {
                hold();
                Ok(())
            })
        },
        |conn| credit(conn, &msg),
    );
    assert_eq!(a.unwrap(), Outcome::Processed(()));
    assert!(b.unwrap().is_duplicate());
    let mut conn = db.connect();
    assert_eq!(count_markers(&mut conn), 1);
    assert_eq!(balance(&mut conn, 1), 10);
}

/// A rolls back → B's waiting insert goes through: B processes the message.
#[test]
fn lock_wait_then_rollback_lets_the_waiter_process() {
    let db = MysqlDb::new("lock_wait_rollback");
    let msg = Credit::new(1);
    let (a, b) = a_holds_b_waits(
        &db,
        |conn, hold| {
            credit_then(conn, &msg, &mut |_| {
                hold();
                Err(AppError::Rejected)
            })
        },
        |conn| credit(conn, &msg),
    );
    assert!(matches!(a, Err(AppError::Rejected)));
    assert_eq!(b.unwrap(), Outcome::Processed(()));
    let mut conn = db.connect();
    assert_eq!(count_markers(&mut conn), 1);
    assert_eq!(count_credits(&mut conn, &Credit::new(1)), 1);
}

/// A deadlock, provoked: A credits account 1 then touches 2, B credits 2 then touches 1,
/// and both take their first lock before either takes its second. InnoDB aborts one of them
/// (1213); the runtime retries it in a fresh transaction, and both messages are processed.
#[test]
fn deadlock_is_retried_to_success() {
    let db = MysqlDb::new("deadlock_retried");
    let rendezvous = std::sync::Barrier::new(2);
    let attempts = AtomicUsize::new(0);
    let handler = |conn: &mut DbConnection, msg: Credit, other: i32| {
        let first_attempt = AtomicBool::new(true);
        credit_then(conn, &msg, &mut |conn| {
            attempts.fetch_add(1, Ordering::SeqCst);
            // Meet the other handler once, holding the first lock; a retry goes straight on.
            if first_attempt.swap(false, Ordering::SeqCst) {
                rendezvous.wait();
            }
            diesel::update(accounts::table.find(other))
                .set(accounts::balance.eq(accounts::balance + 1))
                .execute(conn)?;
            Ok(())
        })
    };
    let (a, b) = std::thread::scope(|scope| {
        let (mut conn_a, mut conn_b) = (db.connect(), db.connect());
        let handler = &handler;
        let a = scope.spawn(move || {
            handler(
                &mut conn_a,
                Credit {
                    account: 1,
                    ..Credit::new(1)
                },
                2,
            )
        });
        let b = scope.spawn(move || {
            handler(
                &mut conn_b,
                Credit {
                    account: 2,
                    ..Credit::new(2)
                },
                1,
            )
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a.unwrap(), Outcome::Processed(()));
    assert_eq!(b.unwrap(), Outcome::Processed(()));
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        3,
        "the deadlock victim ran its body twice"
    );
    let mut conn = db.connect();
    assert_eq!(count_markers(&mut conn), 2);
    assert_eq!(balance(&mut conn, 1), 11);
    assert_eq!(balance(&mut conn, 2), 11);
}

/// `classify` against errors raised by this server: its 1062 messages name the key without
/// the table (MariaDB) and carry the 16 raw bytes of the message id.
#[test]
fn classify_real_server_errors() {
    let db = MysqlDb::new("classify_real_errors");
    let mut conn = db.connect();
    let schema = InboxSchema::DEFAULT;
    // A message id with a quote and the text of a key clause in its bytes.
    let marker =
        "INSERT INTO inbox (message_id, consumer) VALUES (x'27666f72206b65792027787827', 'credit')";
    conn.batch_execute(marker).unwrap();
    let duplicate = conn.batch_execute(marker).unwrap_err();
    assert_eq!(
        classify(&duplicate, &schema),
        ErrorClass::InboxDuplicate,
        "{duplicate}"
    );

    conn.batch_execute("INSERT INTO users (email) VALUES ('a@example.com')")
        .unwrap();
    let business = conn
        .batch_execute("INSERT INTO users (email) VALUES ('a@example.com')")
        .unwrap_err();
    assert_eq!(
        classify(&business, &schema),
        ErrorClass::UniqueViolation {
            constraint: Some("ux_users_email".into())
        },
        "{business}"
    );
    let primary = conn
        .batch_execute("INSERT INTO accounts (id, balance) VALUES (1, 0)")
        .unwrap_err();
    assert_eq!(
        classify(&primary, &schema),
        ErrorClass::UniqueViolation {
            constraint: Some("PRIMARY".into())
        },
        "{primary}"
    );

    // A lock wait that times out (1205).
    let mut holder = db.connect();
    holder.batch_execute("START TRANSACTION").unwrap();
    holder
        .batch_execute("UPDATE accounts SET balance = 1 WHERE id = 2")
        .unwrap();
    conn.batch_execute("SET SESSION innodb_lock_wait_timeout = 1")
        .unwrap();
    let timeout = conn
        .batch_execute("UPDATE accounts SET balance = 2 WHERE id = 2")
        .unwrap_err();
    holder.batch_execute("ROLLBACK").unwrap();
    assert_eq!(
        classify(&timeout, &schema),
        ErrorClass::Transient(TransientKind::LockWaitTimeout),
        "{timeout}"
    );
}
