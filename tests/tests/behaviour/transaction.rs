// The handlers under test and the tests every backend must pass: included at the top of
// each backend's suite, beside `Db` (the fixture) and `DbConnection` (what `Db::connect`
// returns).
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use diesel::prelude::*;
use inbox_diesel::{ErrorClass, Outcome, idempotent};
use inbox_tests::{AppError, Credit, accounts, credits, users};

/// The business change: one credit row and the balance, in two statements.
fn apply_credit(conn: &mut DbConnection, msg: &Credit) -> QueryResult<()> {
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.id.to_string()),
            credits::account.eq(msg.account),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)?;
    diesel::update(accounts::table.find(msg.account))
        .set(accounts::balance.eq(accounts::balance + msg.amount))
        .execute(conn)?;
    Ok(())
}

#[idempotent(consumer = "credit", key = msg.id)]
fn credit(conn: &mut DbConnection, msg: &Credit) -> Result<(), AppError> {
    apply_credit(conn, msg)?;
    Ok(())
}

/// `credit`, looking for a completed marker before its transaction.
#[idempotent(consumer = "credit", key = msg.id, precheck = true)]
fn credit_prechecked(conn: &mut DbConnection, msg: &Credit) -> Result<(), AppError> {
    apply_credit(conn, msg)?;
    Ok(())
}

/// `credit`, then whatever the test injects, on the same transaction.
#[idempotent(consumer = "credit", key = msg.id)]
fn credit_then(
    conn: &mut DbConnection,
    msg: &Credit,
    then: &mut dyn FnMut(&mut DbConnection) -> Result<(), AppError>,
) -> Result<(), AppError> {
    apply_credit(conn, msg)?;
    then(conn)
}

fn count_credits(conn: &mut DbConnection, msg: &Credit) -> i64 {
    credits::table
        .filter(credits::message.eq(msg.id.to_string()))
        .count()
        .get_result(conn)
        .unwrap()
}

fn count_markers(conn: &mut DbConnection) -> i64 {
    diesel::sql_query("SELECT count(*) AS n FROM inbox")
        .get_result::<Count>(conn)
        .unwrap()
        .n
}

fn balance(conn: &mut DbConnection, account: i32) -> i64 {
    accounts::table
        .find(account)
        .select(accounts::balance)
        .first(conn)
        .unwrap()
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// The concurrent-delivery race: 8 instances on their own connections each receive
/// every one of 200 messages, released together by a barrier before each message.
/// Exactly one delivery per message may apply it, with or without `precheck`.
#[test]
fn race_applies_each_message_once() {
    const INSTANCES: usize = 8;
    const MESSAGES: u128 = 200;
    let db = <Db>::new("race_applies_each_message_once");
    let barrier = Arc::new(Barrier::new(INSTANCES));
    let processed = Arc::new(AtomicUsize::new(0));
    let duplicates = Arc::new(AtomicUsize::new(0));
    // Failures are collected, not panicked on: an instance that stopped would leave
    // the others waiting at the barrier for ever.
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for instance in 0..INSTANCES {
            let mut conn = db.connect();
            let (barrier, processed, duplicates, failures) = (
                barrier.clone(),
                processed.clone(),
                duplicates.clone(),
                &failures,
            );
            // Half the instances take the precheck's path: both race together.
            let handler: fn(&mut DbConnection, &Credit) -> Result<Outcome<()>, AppError> =
                match instance % 2 {
                    0 => credit,
                    _ => credit_prechecked,
                };
            scope.spawn(move || {
                for n in 0..MESSAGES {
                    barrier.wait();
                    match handler(&mut conn, &Credit::new(n)) {
                        Ok(Outcome::Processed(())) => {
                            processed.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Outcome::Duplicate { .. }) => {
                            duplicates.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => failures
                            .lock()
                            .unwrap()
                            .push(format!("delivery of message {n} failed: {e:?}")),
                    };
                }
            });
        }
    });
    assert_eq!(failures.into_inner().unwrap(), Vec::<String>::new());
    let mut conn = db.connect();
    for n in 0..MESSAGES {
        assert_eq!(count_credits(&mut conn, &Credit::new(n)), 1, "message {n}");
    }
    let markers_per_message: Vec<(i64, String)> = diesel::sql_query(
        "SELECT count(*) AS n, consumer FROM inbox GROUP BY message_id, consumer HAVING count(*) <> 1",
    )
    .load::<PerMessage>(&mut conn)
    .unwrap()
    .into_iter()
    .map(|row| (row.n, row.consumer))
    .collect();
    assert_eq!(markers_per_message, vec![]);
    assert_eq!(count_markers(&mut conn), MESSAGES as i64);
    assert_eq!(balance(&mut conn, 1), 10 * MESSAGES as i64);
    assert_eq!(processed.load(Ordering::Relaxed), MESSAGES as usize);
    assert_eq!(
        duplicates.load(Ordering::Relaxed),
        (INSTANCES - 1) * MESSAGES as usize
    );
}

#[derive(QueryableByName)]
struct PerMessage {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    consumer: String,
}

#[test]
fn redelivery_is_a_duplicate_and_the_body_does_not_run() {
    let db = <Db>::new("redelivery_is_a_duplicate");
    let mut conn = db.connect();
    let msg = Credit::new(1);
    assert_eq!(credit(&mut conn, &msg).unwrap(), Outcome::Processed(()));
    let mut ran = false;
    let outcome = credit_then(&mut conn, &msg, &mut |_| {
        ran = true;
        Ok(())
    })
    .unwrap();
    assert!(
        matches!(&outcome, Outcome::Duplicate { consumer, key, stored: None }
        if consumer.as_str() == "credit" && key.stored_id() == msg.id)
    );
    assert!(!ran);
    assert_eq!(count_credits(&mut conn, &msg), 1);
    assert_eq!(count_markers(&mut conn), 1);
}

/// A handler error rolls back the marker with the work; the redelivery processes.
#[test]
fn handler_error_leaves_no_marker_and_redelivery_processes() {
    let db = <Db>::new("handler_error_leaves_no_marker");
    let mut conn = db.connect();
    let msg = Credit::new(1);
    let failed = credit_then(&mut conn, &msg, &mut |_| Err(AppError::Rejected));
    assert!(matches!(failed, Err(AppError::Rejected)));
    assert_eq!(count_markers(&mut conn), 0);
    assert_eq!(count_credits(&mut conn, &msg), 0);
    assert_eq!(balance(&mut conn, 1), 0);

    assert_eq!(credit(&mut conn, &msg).unwrap(), Outcome::Processed(()));
    assert_eq!(count_markers(&mut conn), 1);
    assert_eq!(balance(&mut conn, 1), 10);
}

/// All or nothing: a write after the marker and after the first business write fails,
/// and neither the marker nor the first write survives.
#[test]
fn failure_after_the_marker_rolls_everything_back() {
    let db = <Db>::new("failure_after_the_marker");
    let mut conn = db.connect();
    let msg = Credit::new(1);
    let failed = credit_then(&mut conn, &msg, &mut |conn| {
        diesel::sql_query("INSERT INTO no_such_table VALUES (1)").execute(conn)?;
        Ok(())
    });
    assert!(matches!(failed, Err(AppError::Db(_))), "{failed:?}");
    assert_eq!(count_markers(&mut conn), 0);
    assert_eq!(count_credits(&mut conn, &msg), 0);
    assert_eq!(balance(&mut conn, 1), 0);
}

/// A business unique violation is the business's error, with its index's name — never
/// "already processed" — and stays one on redelivery.
#[test]
fn business_unique_violation_is_an_error_with_its_name() {
    let db = <Db>::new("business_unique_violation");
    let mut conn = db.connect();
    diesel::insert_into(users::table)
        .values(users::email.eq("a@example.com"))
        .execute(&mut conn)
        .unwrap();
    for attempt in 0..2 {
        let result = credit_then(&mut conn, &Credit::new(1), &mut |conn| {
            diesel::insert_into(users::table)
                .values(users::email.eq("a@example.com"))
                .execute(conn)?;
            Ok(())
        });
        let Err(AppError::Db(error)) = result else {
            panic!("attempt {attempt}: expected the business violation, got {result:?}");
        };
        match inbox_diesel::classify(&error, &inbox_diesel::InboxSchema::DEFAULT) {
            ErrorClass::UniqueViolation {
                constraint: Some(name),
            } => {
                assert!(
                    name.contains("ux_users_email") || name == "users.email",
                    "{name}"
                )
            }
            other => panic!("expected a named unique violation, got {other:?}"),
        }
    }
    assert_eq!(count_markers(&mut conn), 0);
    assert_eq!(balance(&mut conn, 1), 0);
}

/// An over-long key is refused before any SQL: no statement reaches the connection.
#[test]
fn over_long_key_fails_before_any_sql() {
    #[idempotent(consumer = "credit", key = key)]
    fn by_text(conn: &mut DbConnection, key: &str) -> QueryResult<()> {
        let _ = conn;
        Ok(())
    }
    let db = <Db>::new("over_long_key");
    let mut conn = db.connect();
    let statements = Arc::new(AtomicUsize::new(0));
    let counter = statements.clone();
    conn.set_instrumentation(move |event: diesel::connection::InstrumentationEvent<'_>| {
        if matches!(
            event,
            diesel::connection::InstrumentationEvent::StartQuery { .. }
        ) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
    let long = "k".repeat(inbox_diesel::MessageKey::MAX_LEN + 1);
    let error = inbox_tests::error_chain(&by_text(&mut conn, &long).unwrap_err());
    let over = format!(
        "message key is {} bytes long",
        inbox_diesel::MessageKey::MAX_LEN + 1
    );
    assert!(error.contains(&over), "{error}");
    assert_eq!(statements.load(Ordering::Relaxed), 0);
    assert!(by_text(&mut conn, "short").unwrap().is_processed());
    assert!(statements.load(Ordering::Relaxed) > 0);
}

/// Each consumer keeps its own marker: the same message is processed once per consumer.
#[test]
fn consumers_are_independent() {
    #[idempotent(consumer = "audit", key = msg.id)]
    fn audit(conn: &mut DbConnection, msg: &Credit) -> Result<(), AppError> {
        let _ = (conn, msg);
        Ok(())
    }
    let db = <Db>::new("consumers_are_independent");
    let mut conn = db.connect();
    let msg = Credit::new(1);
    assert!(credit(&mut conn, &msg).unwrap().is_processed());
    assert!(audit(&mut conn, &msg).unwrap().is_processed());
    assert!(audit(&mut conn, &msg).unwrap().is_duplicate());
    assert_eq!(count_markers(&mut conn), 2);
}

/// A purge of 100 000 completed markers beside a live consumer: the consumer keeps
/// committing while the purge runs, batch by batch; the consumer's fresh markers and
/// the stale claims stay, the stale claims are reported.
#[test]
fn purge_of_a_large_table_beside_a_live_consumer() {
    use inbox_diesel::purge::{Purge, purge};
    const ARCHIVE: u32 = 100_000;
    let db = <Db>::new("purge_large_table");
    db.seed_archive(ARCHIVE);
    let purging = std::sync::atomic::AtomicBool::new(true);
    let during_purge = AtomicUsize::new(0);
    let report = std::thread::scope(|scope| {
        let mut consumer = db.connect();
        let (purging, during_purge) = (&purging, &during_purge);
        let consumer = scope.spawn(move || {
            let mut n = 0;
            while purging.load(Ordering::SeqCst) {
                n += 1;
                assert!(
                    credit(&mut consumer, &Credit::new(n))
                        .unwrap()
                        .is_processed()
                );
                if purging.load(Ordering::SeqCst) {
                    during_purge.fetch_add(1, Ordering::SeqCst);
                }
            }
            n
        });
        let mut conn = db.connect();
        // SQLite: the purge's deletes wait for the consumer's transactions, not fail.
        let _ = diesel::sql_query("PRAGMA busy_timeout = 5000").execute(&mut conn);
        // Let the consumer get going before the purge starts.
        inbox_tests::wait_until("the consumer processed a message", || {
            during_purge.load(Ordering::SeqCst) > 0
        });
        let before = during_purge.load(Ordering::SeqCst);
        let mut asked = Purge::older_than(std::time::Duration::from_secs(86_400));
        if <DbConnection as inbox_diesel::InboxConnection>::BACKEND
            == inbox_diesel::schema::Backend::Sqlite
        {
            // One writer at a time: a waiting consumer's busy handler wakes at intervals of up
            // to 100 ms and takes the lock only if it finds it free, so the purge leaves gaps.
            asked = asked.pause_between_batches(std::time::Duration::from_millis(1));
        }
        let report = purge(&mut conn, &inbox_diesel::InboxSchema::DEFAULT, &asked).unwrap();
        let while_purging = during_purge.load(Ordering::SeqCst) - before;
        purging.store(false, Ordering::SeqCst);
        let processed = consumer.join().unwrap();
        (report, while_purging, processed)
    });
    let (report, while_purging, processed) = report;
    assert!(report.ran);
    assert_eq!(report.removed, u64::from(ARCHIVE));
    assert!(report.batches > 100, "{report:?}");
    assert_eq!(report.stale_claims, 3);
    assert!(
        while_purging > 0,
        "the consumer committed nothing while the purge ran"
    );
    let mut conn = db.connect();
    let stale = inbox_diesel::purge::stale_claims(
        &mut conn,
        &inbox_diesel::InboxSchema::DEFAULT,
        std::time::Duration::from_secs(86_400),
        10,
    )
    .unwrap();
    assert_eq!(stale.len(), 3, "{stale:?}");
    assert!(
        stale
            .iter()
            .all(|c| c.consumer == "archive" && c.attempts == 1)
    );
    assert_eq!(count_markers(&mut conn), processed as i64 + 3);
    assert_eq!(balance(&mut conn, 1), 10 * processed as i64);
}

/// A nested `transaction` in the body is a savepoint inside the inbox transaction.
/// The startup check passes on the shipped schema, and names what was removed.
#[test]
fn startup_check_names_a_dropped_unique_index_and_column() {
    use diesel::connection::SimpleConnection;
    use inbox_diesel::InboxSchema;
    use inbox_diesel::schema::{Backend, SchemaError, SchemaProblem, verify};
    let db = <Db>::new("startup_check");
    let mut conn = db.connect();
    verify(&mut conn, &InboxSchema::DEFAULT).unwrap();
    let drop_index = match <DbConnection as inbox_diesel::InboxConnection>::BACKEND {
        Backend::Mysql => "ALTER TABLE inbox DROP INDEX ux_inbox_message_consumer",
        _ => "DROP INDEX ux_inbox_message_consumer",
    };
    if let Err(e) = conn.batch_execute(drop_index) {
        // SQLite's lean table has its key as its primary key, which no statement drops: the
        // table is rebuilt without it.
        assert!(e.to_string().contains("no such index"), "{e}");
        conn.batch_execute(
            "CREATE TABLE inbox_copy (message_id BLOB NOT NULL, consumer TEXT NOT NULL, \
             received_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, processed_at TIMESTAMP, \
             claimed_until TIMESTAMP, attempts INTEGER NOT NULL DEFAULT 1); \
             INSERT INTO inbox_copy SELECT * FROM inbox; DROP TABLE inbox; \
             ALTER TABLE inbox_copy RENAME TO inbox",
        )
        .unwrap();
    }
    conn.batch_execute("ALTER TABLE inbox DROP COLUMN claimed_until")
        .unwrap();
    let error = verify(&mut conn, &InboxSchema::DEFAULT).unwrap_err();
    let message = error.to_string();
    let SchemaError::Mismatch { problems, .. } = error else {
        panic!("expected a mismatch: {message}");
    };
    assert_eq!(
        problems,
        [
            SchemaProblem::MissingColumn {
                column: "claimed_until"
            },
            SchemaProblem::MissingUniqueIndex {
                index: "ux_inbox_message_consumer".into()
            },
        ]
    );
    assert!(
        message.contains("unique index `ux_inbox_message_consumer`"),
        "{message}"
    );
    let elsewhere = InboxSchema::new("no_such_inbox", "ux_inbox_message_consumer").unwrap();
    let missing = verify(&mut conn, &elsewhere).unwrap_err().to_string();
    assert!(
        missing.contains("table `no_such_inbox` does not exist"),
        "{missing}"
    );
    // Custom names (`table = …, constraint = …` on the handlers) are checked as given.
    let billing = InboxSchema::new("billing_inbox", "ux_billing_inbox").unwrap();
    let backend = <DbConnection as inbox_diesel::InboxConnection>::BACKEND;
    conn.batch_execute(&backend.create_table_sql(&billing))
        .unwrap();
    verify(&mut conn, &billing).unwrap();
    let misnamed = InboxSchema::new("billing_inbox", "ux_inbox_message_consumer").unwrap();
    let error = verify(&mut conn, &misnamed).unwrap_err().to_string();
    assert!(
        error.contains("unique index `ux_inbox_message_consumer`"),
        "{error}"
    );
}

#[test]
fn nested_transaction_commits_with_the_marker() {
    let db = <Db>::new("nested_transaction");
    let mut conn = db.connect();
    let msg = Credit::new(1);
    let result = credit_then(&mut conn, &msg, &mut |conn| {
        let inner: QueryResult<()> = conn.transaction(|c| {
            diesel::insert_into(users::table)
                .values(users::email.eq("nested@example.com"))
                .execute(c)?;
            Err(diesel::result::Error::RollbackTransaction)
        });
        assert!(inner.is_err());
        Ok(())
    });
    assert_eq!(result.unwrap(), Outcome::Processed(()));
    let users: i64 = users::table.count().get_result(&mut conn).unwrap();
    assert_eq!(users, 0, "the savepoint rolled back alone");
    assert_eq!(count_markers(&mut conn), 1);
    assert_eq!(balance(&mut conn, 1), 10);
}
