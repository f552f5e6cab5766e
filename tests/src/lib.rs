//! Fixtures of the database suites: a fresh database per test, the business schema the
//! handlers write to, and [`suite!`], the tests every backend must pass, written once and
//! instantiated per backend with its concrete connection type.

use std::fmt;

pub use inbox_diesel::Uuid;

pub mod claim;
pub mod sqlite;
pub mod tripwire;
pub mod unique;

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod server;

#[cfg(feature = "postgres")]
pub mod postgres;

#[cfg(feature = "mysql")]
pub mod mysql;

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

diesel::table! {
    /// One row per applied credit, deliberately without a unique index: a message applied
    /// twice shows up as two rows.
    credits (id) {
        id -> BigInt,
        message -> Text,
        account -> Integer,
        amount -> BigInt,
    }
}

diesel::table! {
    /// A business table with a unique index of its own (`ux_users_email`).
    users (id) {
        id -> Integer,
        email -> Text,
    }
}

/// The message the handlers under test consume.
#[derive(Debug, Clone)]
pub struct Credit {
    pub id: Uuid,
    pub account: i32,
    pub amount: i64,
}

impl Credit {
    pub fn new(n: u128) -> Self {
        Self {
            id: Uuid::from_u128(n),
            account: 1,
            amount: 10,
        }
    }
}

/// An application error type as users write them: a diesel variant reachable through
/// `source()`, the inbox's own errors, and a business rejection.
#[derive(Debug)]
pub enum AppError {
    Db(diesel::result::Error),
    Inbox(inbox_diesel::Error),
    Rejected,
}

impl fmt::Display for AppError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppError::Db(_) => f.write_str("database error"),
            AppError::Inbox(_) => f.write_str("inbox error"),
            AppError::Rejected => f.write_str("rejected"),
        }
    }
}

impl std::error::Error for AppError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AppError::Db(e) => Some(e),
            AppError::Inbox(e) => Some(e),
            AppError::Rejected => None,
        }
    }
}

impl From<diesel::result::Error> for AppError {
    fn from(e: diesel::result::Error) -> Self {
        AppError::Db(e)
    }
}

impl From<inbox_diesel::Error> for AppError {
    fn from(e: inbox_diesel::Error) -> Self {
        AppError::Inbox(e)
    }
}

/// An error and its sources, as a reporter prints them: each `Display` once.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut chain = error.to_string();
    let mut next = error.source();
    while let Some(source) = next {
        chain.push_str(": ");
        chain.push_str(&source.to_string());
        next = source.source();
    }
    chain
}

/// Waits for `condition`, polling; panics with `what` after 20 s.
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The handlers under test and the tests every backend must pass, for a fixture `$db` whose
/// `connect()` returns a `$conn`.
#[macro_export]
macro_rules! suite {
    ($db:ty, $conn:ty) => {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::{Arc, Barrier};

        use diesel::prelude::*;
        use inbox_diesel::{idempotent, ErrorClass, Outcome};
        use $crate::{accounts, credits, users, AppError, Credit};

        type DbConnection = $conn;

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
            let db = <$db>::new("race_applies_each_message_once");
            let barrier = Arc::new(Barrier::new(INSTANCES));
            let processed = Arc::new(AtomicUsize::new(0));
            let duplicates = Arc::new(AtomicUsize::new(0));
            // Failures are collected, not panicked on: an instance that stopped would leave
            // the others waiting at the barrier for ever.
            let failures = std::sync::Mutex::new(Vec::new());
            std::thread::scope(|scope| {
                for instance in 0..INSTANCES {
                    let mut conn = db.connect();
                    let (barrier, processed, duplicates, failures) =
                        (barrier.clone(), processed.clone(), duplicates.clone(), &failures);
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
                                Ok(other) => failures
                                    .lock()
                                    .unwrap()
                                    .push(format!("transaction mode returned {other:?}")),
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
            let db = <$db>::new("redelivery_is_a_duplicate");
            let mut conn = db.connect();
            let msg = Credit::new(1);
            assert_eq!(credit(&mut conn, &msg).unwrap(), Outcome::Processed(()));
            let mut ran = false;
            let outcome = credit_then(&mut conn, &msg, &mut |_| {
                ran = true;
                Ok(())
            })
            .unwrap();
            assert!(matches!(&outcome, Outcome::Duplicate { consumer, key }
                if consumer.as_str() == "credit" && key.stored_id() == msg.id));
            assert!(!ran);
            assert_eq!(count_credits(&mut conn, &msg), 1);
            assert_eq!(count_markers(&mut conn), 1);
        }

        /// A handler error rolls back the marker with the work; the redelivery processes.
        #[test]
        fn handler_error_leaves_no_marker_and_redelivery_processes() {
            let db = <$db>::new("handler_error_leaves_no_marker");
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
            let db = <$db>::new("failure_after_the_marker");
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
            let db = <$db>::new("business_unique_violation");
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
                    ErrorClass::UniqueViolation { constraint: Some(name) } => {
                        assert!(name.contains("ux_users_email") || name == "users.email", "{name}")
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
            let db = <$db>::new("over_long_key");
            let mut conn = db.connect();
            let statements = Arc::new(AtomicUsize::new(0));
            let counter = statements.clone();
            conn.set_instrumentation(move |event: diesel::connection::InstrumentationEvent<'_>| {
                if matches!(event, diesel::connection::InstrumentationEvent::StartQuery { .. }) {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            });
            let long = "k".repeat(inbox_diesel::MessageKey::MAX_LEN + 1);
            let error = $crate::error_chain(&by_text(&mut conn, &long).unwrap_err());
            let over = format!("message key is {} bytes long", inbox_diesel::MessageKey::MAX_LEN + 1);
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
            let db = <$db>::new("consumers_are_independent");
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
            use inbox_diesel::purge::{purge, Purge};
            const ARCHIVE: u32 = 100_000;
            let db = <$db>::new("purge_large_table");
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
                        assert!(credit(&mut consumer, &Credit::new(n)).unwrap().is_processed());
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
                $crate::wait_until("the consumer processed a message", || during_purge.load(Ordering::SeqCst) > 0);
                let before = during_purge.load(Ordering::SeqCst);
                let report = purge(&mut conn, &inbox_diesel::InboxSchema::DEFAULT, &Purge::older_than(std::time::Duration::from_secs(86_400)))
                    .unwrap();
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
            assert!(while_purging > 0, "the consumer committed nothing while the purge ran");
            let mut conn = db.connect();
            let stale = inbox_diesel::purge::stale_claims(
                &mut conn,
                &inbox_diesel::InboxSchema::DEFAULT,
                std::time::Duration::from_secs(86_400),
                10,
            )
            .unwrap();
            assert_eq!(stale.len(), 3, "{stale:?}");
            assert!(stale.iter().all(|c| c.consumer == "archive" && c.attempts == 1));
            assert_eq!(count_markers(&mut conn), processed as i64 + 3);
            assert_eq!(balance(&mut conn, 1), 10 * processed as i64);
        }

        /// A nested `transaction` in the body is a savepoint inside the inbox transaction.
        /// The startup check passes on the shipped schema, and names what was removed.
        #[test]
        fn startup_check_names_a_dropped_unique_index_and_column() {
            use diesel::connection::SimpleConnection;
            use inbox_diesel::schema::{verify, Backend, SchemaError, SchemaProblem};
            use inbox_diesel::InboxSchema;
            let db = <$db>::new("startup_check");
            let mut conn = db.connect();
            verify(&mut conn, &InboxSchema::DEFAULT).unwrap();
            let drop_index = match <DbConnection as inbox_diesel::InboxConnection>::BACKEND {
                Backend::Mysql => "ALTER TABLE inbox DROP INDEX ux_inbox_message_consumer",
                _ => "DROP INDEX ux_inbox_message_consumer",
            };
            conn.batch_execute(drop_index).unwrap();
            conn.batch_execute("ALTER TABLE inbox DROP COLUMN claimed_until").unwrap();
            let error = verify(&mut conn, &InboxSchema::DEFAULT).unwrap_err();
            let message = error.to_string();
            let SchemaError::Mismatch { problems, .. } = error else {
                panic!("expected a mismatch: {message}");
            };
            assert_eq!(
                problems,
                [
                    SchemaProblem::MissingColumn { column: "claimed_until" },
                    SchemaProblem::MissingUniqueIndex { index: "ux_inbox_message_consumer".into() },
                ]
            );
            assert!(message.contains("unique index `ux_inbox_message_consumer`"), "{message}");
            let elsewhere = InboxSchema::new("no_such_inbox", "ux_inbox_message_consumer").unwrap();
            let missing = verify(&mut conn, &elsewhere).unwrap_err().to_string();
            assert!(missing.contains("table `no_such_inbox` does not exist"), "{missing}");
            // Custom names (`table = …, constraint = …` on the handlers) are checked as given.
            let billing = InboxSchema::new("billing_inbox", "ux_billing_inbox").unwrap();
            let backend = <DbConnection as inbox_diesel::InboxConnection>::BACKEND;
            conn.batch_execute(&backend.create_table_sql(&billing)).unwrap();
            verify(&mut conn, &billing).unwrap();
            let misnamed = InboxSchema::new("billing_inbox", "ux_inbox_message_consumer").unwrap();
            let error = verify(&mut conn, &misnamed).unwrap_err().to_string();
            assert!(error.contains("unique index `ux_inbox_message_consumer`"), "{error}");
        }

        #[test]
        fn nested_transaction_commits_with_the_marker() {
            let db = <$db>::new("nested_transaction");
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
    };
}

/// What the async handler under test does after its business change, on the same
/// transaction: the async counterpart of the sync suite's `then` closures.
#[derive(Clone, Default)]
pub struct Hook {
    /// Return `AppError::Rejected`.
    pub reject: bool,
    /// Run a failing statement and ignore its error.
    pub swallow_an_error: bool,
    /// Insert this e-mail into `users` (which has a unique index on it).
    pub insert_user: Option<String>,
    /// Signal `holding`, then wait for `go`.
    pub hold: Option<(
        std::sync::Arc<tokio::sync::Notify>,
        std::sync::Arc<tokio::sync::Notify>,
    )>,
    /// Count the hook's runs.
    pub runs: Option<std::sync::Arc<std::sync::atomic::AtomicUsize>>,
}

/// The async handlers under test and the tests every async backend must pass, for a fixture
/// `$db` whose `connect_async()` returns a `$conn`.
#[macro_export]
macro_rules! async_suite {
    ($db:ty, $conn:ty) => {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        use diesel::{ExpressionMethods, QueryDsl};
        use diesel_async::RunQueryDsl;
        use inbox_diesel::{ErrorClass, Outcome, idempotent};
        use $crate::{AppError, Credit, Hook, accounts, credits, users};

        type AsyncConnection = $conn;

        async fn apply_credit(conn: &mut AsyncConnection, msg: &Credit) -> diesel::QueryResult<()> {
            diesel::insert_into(credits::table)
                .values((
                    credits::message.eq(msg.id.to_string()),
                    credits::account.eq(msg.account),
                    credits::amount.eq(msg.amount),
                ))
                .execute(conn)
                .await?;
            diesel::update(accounts::table.find(msg.account))
                .set(accounts::balance.eq(accounts::balance + msg.amount))
                .execute(conn)
                .await?;
            Ok(())
        }

        #[idempotent(consumer = "credit", key = msg.id)]
        async fn credit(
            conn: &mut AsyncConnection,
            msg: &Credit,
            hook: &Hook,
        ) -> Result<(), AppError> {
            apply_credit(conn, msg).await?;
            if let Some(runs) = &hook.runs {
                runs.fetch_add(1, Ordering::SeqCst);
            }
            if let Some((holding, go)) = &hook.hold {
                holding.notify_one();
                go.notified().await;
            }
            if hook.swallow_an_error {
                let swallowed = diesel::sql_query("INSERT INTO no_such_table VALUES (1)")
                    .execute(conn)
                    .await;
                assert!(swallowed.is_err());
            }
            if let Some(email) = &hook.insert_user {
                diesel::insert_into(users::table)
                    .values(users::email.eq(email))
                    .execute(conn)
                    .await?;
            }
            if hook.reject {
                return Err(AppError::Rejected);
            }
            Ok(())
        }

        async fn count_credits(conn: &mut AsyncConnection, msg: &Credit) -> i64 {
            credits::table
                .filter(credits::message.eq(msg.id.to_string()))
                .count()
                .get_result(conn)
                .await
                .unwrap()
        }

        async fn count_markers(conn: &mut AsyncConnection) -> i64 {
            #[derive(diesel::QueryableByName)]
            struct Count {
                #[diesel(sql_type = diesel::sql_types::BigInt)]
                n: i64,
            }
            diesel::sql_query("SELECT count(*) AS n FROM inbox")
                .get_result::<Count>(conn)
                .await
                .unwrap()
                .n
        }

        async fn balance(conn: &mut AsyncConnection, account: i32) -> i64 {
            accounts::table
                .find(account)
                .select(accounts::balance)
                .first(conn)
                .await
                .unwrap()
        }

        /// The concurrent-delivery race on tokio's multi-threaded runtime: 8 tasks on their own
        /// connections each receive every one of 200 messages, released together by a barrier.
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn async_race_applies_each_message_once() {
            const INSTANCES: usize = 8;
            const MESSAGES: u128 = 200;
            let db = <$db>::new("async_race");
            let barrier = Arc::new(tokio::sync::Barrier::new(INSTANCES));
            let mut tasks = Vec::new();
            for _ in 0..INSTANCES {
                let mut conn = db.connect_async().await;
                let barrier = barrier.clone();
                tasks.push(tokio::spawn(async move {
                    // Failures are collected, not panicked on: a task that stopped would
                    // leave the others waiting at the barrier for ever.
                    let (mut processed, mut duplicates, mut failures) = (0, 0, Vec::new());
                    for n in 0..MESSAGES {
                        barrier.wait().await;
                        match credit(&mut conn, &Credit::new(n), &Hook::default()).await {
                            Ok(Outcome::Processed(())) => processed += 1,
                            Ok(Outcome::Duplicate { .. }) => duplicates += 1,
                            Ok(other) => {
                                failures.push(format!("transaction mode returned {other:?}"))
                            }
                            Err(e) => {
                                failures.push(format!("delivery of message {n} failed: {e:?}"))
                            }
                        }
                    }
                    (processed, duplicates, failures)
                }));
            }
            let (mut processed, mut duplicates, mut failures) = (0, 0, Vec::new());
            for task in tasks {
                let (p, d, f) = task.await.unwrap();
                processed += p;
                duplicates += d;
                failures.extend(f);
            }
            assert_eq!(failures, Vec::<String>::new());
            let mut conn = db.connect_async().await;
            for n in 0..MESSAGES {
                assert_eq!(
                    count_credits(&mut conn, &Credit::new(n)).await,
                    1,
                    "message {n}"
                );
            }
            assert_eq!(count_markers(&mut conn).await, MESSAGES as i64);
            assert_eq!(balance(&mut conn, 1).await, 10 * MESSAGES as i64);
            assert_eq!(processed, MESSAGES as usize);
            assert_eq!(duplicates, (INSTANCES - 1) * MESSAGES as usize);
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn async_startup_check_passes_and_finds_a_missing_table() {
            use inbox_diesel::InboxSchema;
            use inbox_diesel::schema::verify_async;
            let db = <$db>::new("async_startup_check");
            let mut conn = db.connect_async().await;
            verify_async(&mut conn, &InboxSchema::DEFAULT)
                .await
                .unwrap();
            let elsewhere = InboxSchema::new("no_such_inbox", "ux_inbox_message_consumer").unwrap();
            let missing = verify_async(&mut conn, &elsewhere)
                .await
                .unwrap_err()
                .to_string();
            assert!(
                missing.contains("table `no_such_inbox` does not exist"),
                "{missing}"
            );
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn async_redelivery_is_a_duplicate_and_the_body_does_not_run() {
            let db = <$db>::new("async_redelivery");
            let mut conn = db.connect_async().await;
            let msg = Credit::new(1);
            let runs = Arc::new(AtomicUsize::new(0));
            let hook = Hook {
                runs: Some(runs.clone()),
                ..Hook::default()
            };
            assert_eq!(
                credit(&mut conn, &msg, &hook).await.unwrap(),
                Outcome::Processed(())
            );
            assert!(credit(&mut conn, &msg, &hook).await.unwrap().is_duplicate());
            // Written out: `runs.load(..)` would be diesel-async's `RunQueryDsl::load`.
            assert_eq!(AtomicUsize::load(&runs, Ordering::SeqCst), 1);
            assert_eq!(count_credits(&mut conn, &msg).await, 1);
            assert_eq!(count_markers(&mut conn).await, 1);
        }

        /// A handler error rolls back the marker with the work; the redelivery processes.
        #[tokio::test(flavor = "multi_thread")]
        async fn async_handler_error_leaves_no_marker_and_redelivery_processes() {
            let db = <$db>::new("async_handler_error");
            let mut conn = db.connect_async().await;
            let msg = Credit::new(1);
            let reject = Hook {
                reject: true,
                ..Hook::default()
            };
            assert!(matches!(
                credit(&mut conn, &msg, &reject).await,
                Err(AppError::Rejected)
            ));
            assert_eq!(count_markers(&mut conn).await, 0);
            assert_eq!(count_credits(&mut conn, &msg).await, 0);
            assert_eq!(
                credit(&mut conn, &msg, &Hook::default()).await.unwrap(),
                Outcome::Processed(())
            );
            assert_eq!(count_markers(&mut conn).await, 1);
            assert_eq!(balance(&mut conn, 1).await, 10);
        }

        /// A business unique violation is an error with its index's name, also on redelivery.
        #[tokio::test(flavor = "multi_thread")]
        async fn async_business_unique_violation_is_an_error_with_its_name() {
            let db = <$db>::new("async_business_violation");
            let mut conn = db.connect_async().await;
            diesel::insert_into(users::table)
                .values(users::email.eq("a@example.com"))
                .execute(&mut conn)
                .await
                .unwrap();
            let hook = Hook {
                insert_user: Some("a@example.com".into()),
                ..Hook::default()
            };
            for attempt in 0..2 {
                let result = credit(&mut conn, &Credit::new(1), &hook).await;
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
            assert_eq!(count_markers(&mut conn).await, 0);
            assert_eq!(balance(&mut conn, 1).await, 0);
        }

        /// `purge_async` of 100 000 completed markers beside a live async consumer, which
        /// keeps committing while the purge runs.
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn async_purge_of_a_large_table_beside_a_live_consumer() {
            use diesel_async::SimpleAsyncConnection;
            use inbox_diesel::purge::{Purge, purge_async};
            const ARCHIVE: u32 = 100_000;
            let db = <$db>::new("async_purge_large_table");
            db.seed_archive(ARCHIVE);
            let purging = Arc::new(std::sync::atomic::AtomicBool::new(true));
            let during_purge = Arc::new(AtomicUsize::new(0));
            let mut consumer_conn = db.connect_async().await;
            let consumer = tokio::spawn({
                let (purging, during_purge) = (purging.clone(), during_purge.clone());
                async move {
                    let mut n = 0;
                    while std::sync::atomic::AtomicBool::load(&purging, Ordering::SeqCst) {
                        n += 1;
                        let outcome =
                            credit(&mut consumer_conn, &Credit::new(n), &Hook::default()).await;
                        assert!(outcome.unwrap().is_processed());
                        if std::sync::atomic::AtomicBool::load(&purging, Ordering::SeqCst) {
                            during_purge.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    n
                }
            });
            while AtomicUsize::load(&during_purge, Ordering::SeqCst) == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            let mut conn = db.connect_async().await;
            // SQLite: the purge's deletes wait for the consumer's transactions, not fail.
            let _ = conn.batch_execute("PRAGMA busy_timeout = 5000").await;
            let before = AtomicUsize::load(&during_purge, Ordering::SeqCst);
            let day = std::time::Duration::from_secs(86_400);
            // Spawned: the purge's future is `Send`.
            let (report, mut conn) = tokio::spawn(async move {
                let report = purge_async(
                    &mut conn,
                    &inbox_diesel::InboxSchema::DEFAULT,
                    &Purge::older_than(day),
                )
                .await;
                (report, conn)
            })
            .await
            .unwrap();
            let report = report.unwrap();
            let while_purging = AtomicUsize::load(&during_purge, Ordering::SeqCst) - before;
            purging.store(false, Ordering::SeqCst);
            let processed = consumer.await.unwrap();
            assert!(report.ran);
            assert_eq!(report.removed, u64::from(ARCHIVE));
            assert_eq!(report.stale_claims, 3);
            assert!(
                while_purging > 0,
                "the consumer committed nothing while the purge ran"
            );
            let stale = inbox_diesel::purge::stale_claims_async(
                &mut conn,
                &inbox_diesel::InboxSchema::DEFAULT,
                day,
                2,
            )
            .await
            .unwrap();
            assert_eq!(stale.len(), 2, "the limit: {stale:?}");
            assert!(
                stale
                    .iter()
                    .all(|c| c.consumer == "archive" && c.attempts == 1)
            );
            assert_eq!(count_markers(&mut conn).await, processed as i64 + 3);
        }

        /// A handler future dropped while its body awaits, on a pooled connection: nothing
        /// commits, the pool never hands out the connection inside the open transaction, and
        /// the redelivery processes the message.
        #[tokio::test(flavor = "multi_thread")]
        async fn async_cancelled_handler_commits_nothing_and_the_pool_recovers() {
            use diesel_async::pooled_connection::AsyncDieselConnectionManager;
            use diesel_async::pooled_connection::deadpool::Pool;
            let db = <$db>::new("async_cancelled");
            let manager = AsyncDieselConnectionManager::<AsyncConnection>::new(db.url());
            let pool = Pool::builder(manager).max_size(1).build().unwrap();
            let msg = Credit::new(1);
            let holding = Arc::new(tokio::sync::Notify::new());
            let never = Arc::new(tokio::sync::Notify::new());
            let hook = Hook {
                hold: Some((holding.clone(), never.clone())),
                ..Hook::default()
            };
            {
                let mut pooled = pool.get().await.unwrap();
                let handler = credit(&mut pooled, &msg, &hook);
                tokio::select! {
                    _ = handler => panic!("the handler cannot finish: its body waits forever"),
                    _ = holding.notified() => {}
                }
                // The handler future is dropped here, inside its transaction, after its
                // marker and its credit were written.
            }
            let mut pooled = pool.get().await.unwrap();
            assert_eq!(count_markers(&mut pooled).await, 0);
            assert_eq!(count_credits(&mut pooled, &msg).await, 0);
            assert_eq!(
                credit(&mut pooled, &msg, &Hook::default()).await.unwrap(),
                Outcome::Processed(())
            );
            assert_eq!(count_markers(&mut pooled).await, 1);
            assert_eq!(balance(&mut pooled, 1).await, 10);
        }

        /// bb8 closes a connection that comes back inside a transaction, so a cancelled
        /// handler's transaction ends at once: a redelivery on another pooled connection does
        /// not wait on the locks it held (on SQLite, the whole database).
        #[tokio::test(flavor = "multi_thread")]
        async fn async_cancelled_handler_on_bb8_releases_its_locks_at_once() {
            use diesel_async::pooled_connection::AsyncDieselConnectionManager;
            use diesel_async::pooled_connection::bb8::Pool;
            let db = <$db>::new("async_cancelled_bb8");
            let manager = AsyncDieselConnectionManager::<AsyncConnection>::new(db.url());
            let pool = Pool::builder().max_size(2).build(manager).await.unwrap();
            let msg = Credit::new(1);
            let holding = Arc::new(tokio::sync::Notify::new());
            let hook = Hook {
                hold: Some((holding.clone(), Arc::new(tokio::sync::Notify::new()))),
                ..Hook::default()
            };
            {
                let mut pooled = pool.get().await.unwrap();
                tokio::select! {
                    _ = credit(&mut pooled, &msg, &hook) => panic!("the body waits forever"),
                    _ = holding.notified() => {}
                }
            }
            let mut other = pool.get().await.unwrap();
            let redelivery = tokio::time::timeout(
                std::time::Duration::from_secs(20),
                credit(&mut other, &msg, &Hook::default()),
            )
            .await
            .expect("the redelivery waited on the abandoned transaction's locks");
            assert_eq!(redelivery.unwrap(), Outcome::Processed(()));
            assert_eq!(count_markers(&mut other).await, 1);
            assert_eq!(count_credits(&mut other, &msg).await, 1);
        }

        /// Without a pool, a connection left in a cancelled handler's transaction refuses the
        /// next handler call instead of running it inside that transaction.
        #[tokio::test(flavor = "multi_thread")]
        async fn async_cancelled_handler_leaves_a_bare_connection_refusing() {
            let db = <$db>::new("async_cancelled_bare");
            let mut conn = db.connect_async().await;
            let msg = Credit::new(1);
            let holding = Arc::new(tokio::sync::Notify::new());
            let hook = Hook {
                hold: Some((holding.clone(), Arc::new(tokio::sync::Notify::new()))),
                ..Hook::default()
            };
            tokio::select! {
                _ = credit(&mut conn, &msg, &hook) => panic!("the body waits forever"),
                _ = holding.notified() => {}
            }
            let refused = credit(&mut conn, &Credit::new(2), &Hook::default()).await;
            assert!(matches!(&refused, Err(AppError::Inbox(_))), "{refused:?}");
            drop(conn);
            let mut fresh = db.connect_async().await;
            assert_eq!(count_markers(&mut fresh).await, 0);
            assert_eq!(count_credits(&mut fresh, &msg).await, 0);
        }
    };
}

/// What only servers with row locks show, for a fixture `$db` with `waiting_for_a_lock()`:
/// the deterministic lock wait and a deadlock retried. Instantiated after [`suite!`].
#[macro_export]
macro_rules! server_suite {
    ($db:ty) => {
        type HandlerResult = Result<Outcome<()>, AppError>;

        /// Makes A and B overlap for certain: runs `a` until its body calls `hold`, then starts
        /// `b`, waits until the server shows one session of the test database waiting for a
        /// lock (B blocked behind A), and only then lets A's body go on.
        fn a_holds_b_waits(
            db: &$db,
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
                $crate::wait_until("B waits for a lock A holds", || {
                    db.waiting_for_a_lock() == 1
                });
                go_tx.send(()).unwrap();
                (a.join().unwrap(), b.join().unwrap())
            })
        }

        /// While A holds an uncommitted marker, B's insert of the same marker waits on the
        /// unique index; A then finishes with `a_result`.
        fn lock_wait(
            db: &$db,
            a_result: fn() -> Result<(), AppError>,
        ) -> (HandlerResult, HandlerResult) {
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
            let db = <$db>::new("lock_wait_commit");
            let (a, b) = lock_wait(&db, || Ok(()));
            assert_eq!(a.unwrap(), Outcome::Processed(()));
            assert!(b.unwrap().is_duplicate());
            let mut conn = db.connect();
            assert_eq!(count_markers(&mut conn), 1);
            assert_eq!(balance(&mut conn, 1), 10);
        }

        #[test]
        fn lock_wait_then_rollback_lets_the_waiter_process() {
            let db = <$db>::new("lock_wait_rollback");
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
            let db = <$db>::new("purge_one_at_a_time");
            db.seed_archive(5_000);
            let day = std::time::Duration::from_secs(86_400);
            let slow = Purge::older_than(day)
                .batch_size(500)
                .pause_between_batches(std::time::Duration::from_millis(100));
            let (first, second) = std::thread::scope(|scope| {
                let mut conn = db.connect();
                let first = scope
                    .spawn(move || purge(&mut conn, &inbox_diesel::InboxSchema::DEFAULT, &slow));
                $crate::wait_until("the first purge removed a batch", || {
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
            let db = <$db>::new("deadlock_retried");
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
            let db = <$db>::new("text_key_sql");
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
    };
}

/// The async counterpart of [`server_suite!`]: the lock wait and a deadlock retried, for a
/// fixture `$db` with `connect_async()` and `waiting_for_a_lock()`. Instantiated after
/// [`async_suite!`].
#[macro_export]
macro_rules! async_server_suite {
    ($db:ty) => {
        type HandlerResult = Result<Outcome<()>, AppError>;

        /// Waits until the server shows one session of the test database waiting for a lock.
        async fn until_one_session_waits(db: &$db) {
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
            while db.waiting_for_a_lock() != 1 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "B never waited for A's lock"
                );
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }

        /// A runs `a` until its body holds (`Hook::hold`), B then runs `b` and blocks behind
        /// A's lock; only when the server shows B waiting does A go on.
        async fn a_holds_b_waits(
            db: &$db,
            a: impl AsyncFnOnce(&mut AsyncConnection, Hook) -> HandlerResult,
            b: impl AsyncFnOnce(&mut AsyncConnection) -> HandlerResult,
        ) -> (HandlerResult, HandlerResult) {
            let (holding, go) = (
                Arc::new(tokio::sync::Notify::new()),
                Arc::new(tokio::sync::Notify::new()),
            );
            let hold = Hook {
                hold: Some((holding.clone(), go.clone())),
                ..Hook::default()
            };
            let (mut conn_a, mut conn_b) = (db.connect_async().await, db.connect_async().await);
            let a = a(&mut conn_a, hold);
            let b = async {
                holding.notified().await;
                let b = b(&mut conn_b);
                let release = async {
                    until_one_session_waits(db).await;
                    go.notify_one();
                };
                tokio::join!(b, release).0
            };
            tokio::join!(a, b)
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn async_lock_wait_then_commit_makes_the_waiter_a_duplicate() {
            let db = <$db>::new("async_lock_wait_commit");
            let msg = Credit::new(1);
            let (a, b) = a_holds_b_waits(
                &db,
                async |conn, hook| credit(conn, &msg, &hook).await,
                async |conn| credit(conn, &msg, &Hook::default()).await,
            )
            .await;
            assert_eq!(a.unwrap(), Outcome::Processed(()));
            assert!(b.unwrap().is_duplicate());
            let mut conn = db.connect_async().await;
            assert_eq!(count_markers(&mut conn).await, 1);
            assert_eq!(balance(&mut conn, 1).await, 10);
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn async_lock_wait_then_rollback_lets_the_waiter_process() {
            let db = <$db>::new("async_lock_wait_rollback");
            let msg = Credit::new(1);
            let (a, b) = a_holds_b_waits(
                &db,
                async |conn, hook| {
                    credit(
                        conn,
                        &msg,
                        &Hook {
                            reject: true,
                            ..hook
                        },
                    )
                    .await
                },
                async |conn| credit(conn, &msg, &Hook::default()).await,
            )
            .await;
            assert!(matches!(a, Err(AppError::Rejected)));
            assert_eq!(b.unwrap(), Outcome::Processed(()));
            let mut conn = db.connect_async().await;
            assert_eq!(count_markers(&mut conn).await, 1);
            assert_eq!(count_credits(&mut conn, &msg).await, 1);
        }

        /// The provoked deadlock of the sync suite, on async connections.
        #[tokio::test(flavor = "multi_thread")]
        async fn async_deadlock_is_retried_to_success() {
            let db = <$db>::new("async_deadlock_retried");
            let rendezvous = Arc::new(tokio::sync::Barrier::new(2));
            let attempts = Arc::new(AtomicUsize::new(0));
            let deliver = async |msg: Credit, other: i32| {
                let mut conn = db.connect_async().await;
                let meeting = Meeting {
                    rendezvous: rendezvous.clone(),
                    attempts: attempts.clone(),
                    first_attempt: std::sync::atomic::AtomicBool::new(true),
                };
                transfer(&mut conn, &msg, other, &meeting).await
            };
            let (a, b) = tokio::join!(
                deliver(
                    Credit {
                        account: 1,
                        ..Credit::new(1)
                    },
                    2
                ),
                deliver(
                    Credit {
                        account: 2,
                        ..Credit::new(2)
                    },
                    1
                )
            );
            assert_eq!(a.unwrap(), Outcome::Processed(()));
            assert_eq!(b.unwrap(), Outcome::Processed(()));
            assert_eq!(
                AtomicUsize::load(&attempts, Ordering::SeqCst),
                3,
                "the victim ran its body twice"
            );
            let mut conn = db.connect_async().await;
            assert_eq!(balance(&mut conn, 1).await, 11);
            assert_eq!(balance(&mut conn, 2).await, 11);
        }

        /// Where two deliveries meet once, each holding its first lock.
        struct Meeting {
            rendezvous: Arc<tokio::sync::Barrier>,
            attempts: Arc<AtomicUsize>,
            first_attempt: std::sync::atomic::AtomicBool,
        }

        /// `credit`, then the meeting (on the first attempt only), then one more on `other`.
        #[idempotent(consumer = "credit", key = msg.id)]
        async fn transfer(
            conn: &mut AsyncConnection,
            msg: &Credit,
            other: i32,
            meeting: &Meeting,
        ) -> Result<(), AppError> {
            apply_credit(conn, msg).await?;
            meeting.attempts.fetch_add(1, Ordering::SeqCst);
            if meeting.first_attempt.swap(false, Ordering::SeqCst) {
                meeting.rendezvous.wait().await;
            }
            diesel::update(accounts::table.find(other))
                .set(accounts::balance.eq(accounts::balance + 1))
                .execute(conn)
                .await?;
            Ok(())
        }
    };
}
