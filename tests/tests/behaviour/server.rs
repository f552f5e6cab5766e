// What only servers with row locks show: the deterministic lock wait and a deadlock
// retried. Included after `transaction.rs`, beside `Db` (with `waiting_for_a_lock()`).
type HandlerResult = Result<Outcome<()>, AppError>;

/// Makes A and B overlap for certain: runs `a` until its body calls `hold`, then starts
/// `b`, waits until the server shows one session of the test database waiting for a
/// lock (B blocked behind A), and only then lets A's body go on.
fn a_holds_b_waits(
    db: &Db,
    a: impl FnOnce(&mut DbConnection, &dyn Fn()) -> HandlerResult + Send,
    b: impl FnOnce(&mut DbConnection) -> HandlerResult + Send,
) -> (HandlerResult, HandlerResult) {
    let (holding_tx, holding) = std::sync::mpsc::channel();
    let (go_tx, go) = std::sync::mpsc::channel::<()>();
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
        inbox_tests::wait_until("B waits for a lock A holds", || {
            db.waiting_for_a_lock() == 1
        });
        go_tx.send(()).unwrap();
        (a.join().unwrap(), b.join().unwrap())
    })
}

/// While A holds an uncommitted marker, B's insert of the same marker waits on the
/// unique index; A then finishes with `a_result`.
fn lock_wait(db: &Db, a_result: fn() -> Result<(), AppError>) -> (HandlerResult, HandlerResult) {
    let msg = Credit::new(1);
    a_holds_b_waits(
        db,
        |conn, hold| {
            credit_then(conn, &msg, &mut |_| {
                hold();
                a_result()
            })
        },
        |conn| credit(conn, &msg),
    )
}

#[test]
fn lock_wait_then_commit_makes_the_waiter_a_duplicate() {
    let db = <Db>::new("lock_wait_commit");
    let (a, b) = lock_wait(&db, || Ok(()));
    assert_eq!(a.unwrap(), Outcome::Processed(()));
    assert!(b.unwrap().is_duplicate());
    let mut conn = db.connect();
    assert_eq!(count_markers(&mut conn), 1);
    assert_eq!(balance(&mut conn, 1), 10);
}

#[test]
fn lock_wait_then_rollback_lets_the_waiter_process() {
    let db = <Db>::new("lock_wait_rollback");
    let (a, b) = lock_wait(&db, || Err(AppError::Rejected));
    assert!(matches!(a, Err(AppError::Rejected)));
    assert_eq!(b.unwrap(), Outcome::Processed(()));
    let mut conn = db.connect();
    assert_eq!(count_markers(&mut conn), 1);
    assert_eq!(count_credits(&mut conn, &Credit::new(1)), 1);
    assert_eq!(balance(&mut conn, 1), 10);
}

/// Purges of one table exclude each other: on MySQL and MariaDB a purge that finds
/// another one running returns at once, having done nothing; on PostgreSQL the lock is
/// taken per batch, and a second purge only runs in the first's pauses. Together they
/// remove each row once.
#[test]
fn only_one_purge_runs_at_a_time() {
    use inbox_diesel::purge::{Purge, purge};
    let db = <Db>::new("purge_one_at_a_time");
    db.seed_archive(5_000);
    let day = std::time::Duration::from_secs(86_400);
    let slow = Purge::older_than(day)
        .batch_size(500)
        .pause_between_batches(std::time::Duration::from_millis(100));
    let (first, second) = std::thread::scope(|scope| {
        let mut conn = db.connect();
        let first =
            scope.spawn(move || purge(&mut conn, &inbox_diesel::InboxSchema::DEFAULT, &slow));
        inbox_tests::wait_until("the first purge removed a batch", || {
            count_markers(&mut db.connect()) < 5_003
        });
        let second = purge(
            &mut db.connect(),
            &inbox_diesel::InboxSchema::DEFAULT,
            &Purge::older_than(day),
        );
        (first.join().unwrap().unwrap(), second.unwrap())
    });
    // MySQL and MariaDB hold the lock for the whole purge: the second does not run.
    // PostgreSQL takes it per batch, so that a cancelled purge leaves none behind: the
    // second may run batches in the first's pauses, never beside one of its batches.
    assert!(first.ran);
    assert!(second.ran || second.removed == 0, "{second:?}");
    assert_eq!(
        first.removed + second.removed,
        5_000,
        "{first:?} {second:?}"
    );
    assert_eq!(count_markers(&mut db.connect()), 3);
}

/// A deadlock, provoked: A credits account 1 then touches 2, B credits 2 then touches
/// 1, and both take their first lock before either takes its second. The server
/// aborts one of them; the runtime retries it in a fresh transaction.
#[test]
fn deadlock_is_retried_to_success() {
    let db = <Db>::new("deadlock_retried");
    let rendezvous = std::sync::Barrier::new(2);
    let attempts = AtomicUsize::new(0);
    let handler = |conn: &mut DbConnection, msg: Credit, other: i32| {
        let first_attempt = std::sync::atomic::AtomicBool::new(true);
        credit_then(conn, &msg, &mut |conn| {
            attempts.fetch_add(1, Ordering::SeqCst);
            // Meet the other handler once, holding the first lock; a retry goes on.
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

/// A body whose error type is a boxed error (`Box<dyn Error + Send + Sync>`, which `?` turns
/// anything into): a deadlock in it is found inside the box and retried. A box is not a
/// `std::error::Error` itself, and the deadlock's victim was handed back unretried.
#[test]
fn a_deadlock_in_a_boxed_error_is_retried() {
    type Boxed = Box<dyn std::error::Error + Send + Sync>;

    #[inbox_diesel::idempotent(consumer = "boxed", key = id)]
    fn move_one(
        conn: &mut DbConnection,
        id: i64,
        from: i32,
        to: i32,
        meet: &(dyn Fn() + Sync),
    ) -> Result<(), Boxed> {
        diesel::update(accounts::table.find(from))
            .set(accounts::balance.eq(accounts::balance - 1))
            .execute(conn)?;
        meet();
        diesel::update(accounts::table.find(to))
            .set(accounts::balance.eq(accounts::balance + 1))
            .execute(conn)?;
        Ok(())
    }

    let db = <Db>::new("deadlock_boxed");
    let rendezvous = std::sync::Barrier::new(2);
    let met = AtomicUsize::new(0);
    // Each meets the other once, holding its first lock; a retry goes on.
    let meet = || {
        if met.fetch_add(1, Ordering::SeqCst) < 2 {
            rendezvous.wait();
        }
    };
    let (a, b) = std::thread::scope(|scope| {
        let (mut conn_a, mut conn_b) = (db.connect(), db.connect());
        let meet = &meet;
        let a =
            scope.spawn(move || move_one(&mut conn_a, 1, 1, 2, meet).map_err(|e| e.to_string()));
        let b =
            scope.spawn(move || move_one(&mut conn_b, 2, 2, 1, meet).map_err(|e| e.to_string()));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a, Ok(Outcome::Processed(())));
    assert_eq!(b, Ok(Outcome::Processed(())));
    assert_eq!(
        met.load(Ordering::SeqCst),
        3,
        "the deadlock's victim ran again"
    );
    let mut conn = db.connect();
    assert_eq!(count_markers(&mut conn), 2);
    // One moved from 1 to 2, the other back: each applied once.
    assert_eq!(balance(&mut conn, 1), 0);
    assert_eq!(balance(&mut conn, 2), 0);
}

/// A deduplication table of its own, keyed by text ids, moves into the inbox in one
/// `INSERT … SELECT` over `Backend::text_key_sql`: every moved id is a duplicate to the
/// handler (the SQL computes the id the library derives), and a new id is processed.
#[test]
fn a_dedup_table_of_text_ids_moves_into_the_inbox_in_sql() {
    use diesel::connection::SimpleConnection;
    use inbox_diesel::schema::Backend;
    use inbox_diesel::{InboxConnection, idempotent};

    #[idempotent(consumer = "activities", key = id.as_str())]
    fn apply(conn: &mut DbConnection, id: &String) -> Result<(), AppError> {
        conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")?;
        Ok(())
    }

    let url = format!("https://example.social/{}", "a".repeat(1_016));
    let ids = [
        "https://example.social/users/zoë/statuses/日本".to_owned(),
        "7f1c6b52-4d5e-4c1e-9a56-1b0e4c1d2f3a".to_owned(),
        "it's".to_owned(),
        "x".to_owned(),
        url,
    ];
    let db = <Db>::new("text_key_sql");
    let mut conn = db.connect();
    let backend = <DbConnection as InboxConnection>::BACKEND;
    conn.batch_execute(match backend {
        Backend::Postgres => {
            "CREATE EXTENSION IF NOT EXISTS pgcrypto; CREATE TABLE seen (activity_id TEXT)"
        }
        _ => "CREATE TABLE seen (activity_id TEXT CHARACTER SET utf8mb4)",
    })
    .unwrap();
    for id in &ids {
        let literal = id.replace('\'', "''");
        conn.batch_execute(&format!("INSERT INTO seen VALUES ('{literal}')"))
            .unwrap();
    }
    let computed = backend.text_key_sql("seen.activity_id").unwrap();
    conn.batch_execute(&format!(
        "INSERT INTO inbox (message_id, consumer, processed_at) \
         SELECT {computed}, 'activities', CURRENT_TIMESTAMP FROM seen"
    ))
    .unwrap();
    for id in &ids {
        assert!(apply(&mut conn, id).unwrap().is_duplicate(), "{id}");
    }
    let new = "https://example.social/new".to_owned();
    assert!(apply(&mut conn, &new).unwrap().is_processed());
    assert_eq!(count_markers(&mut conn), 6);
    assert_eq!(balance(&mut conn, 1), 1);
}
