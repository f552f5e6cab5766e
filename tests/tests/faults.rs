//! Every fault a pump must route, provoked for real on each backend, and the [`Action`] it
//! gets: `RetryLater` for a lock or statement timeout and a busy database, `Reconnect` for a
//! connection the server ended, `Alert` for a handler called inside a transaction and for an
//! inbox table that cannot recognise a duplicate, `DeadLetter` for a business constraint. An
//! error of the inbox is read with `Error::action()`; an error the body returned, with
//! `classify(…).action()`.
//!
//! SQLite always; PostgreSQL and MariaDB with their features (`INBOX_TEST_PG`,
//! `INBOX_TEST_MYSQL`).

use diesel::connection::{AnsiTransactionManager, SimpleConnection, TransactionManager};
use diesel::result::Error as DieselError;
use inbox_diesel::{Action, Error, ErrorClass, InboxSchema, Outcome, classify};

/// The inbox's own error inside a `QueryResult` handler's diesel error.
fn inbox_error(error: DieselError) -> Error {
    match error {
        DieselError::QueryBuilderError(inner) => *inner
            .downcast::<Error>()
            .unwrap_or_else(|e| panic!("not an inbox error: {e:?}")),
        other => panic!("not an inbox error: {other:?}"),
    }
}

/// The action for an error that came out of a body.
fn body_action(error: &DieselError) -> Action {
    classify(error, &InboxSchema::DEFAULT).action()
}

/// The faults every backend shares: misuse, a drifted table, a business constraint. `run`
/// is the backend's handler running `sql` in its body for message `id`.
fn shared_faults<C>(
    connect: impl Fn() -> C,
    run: fn(&mut C, &u64, &str) -> diesel::QueryResult<Outcome<()>>,
) where
    C: diesel::Connection<TransactionManager = AnsiTransactionManager> + SimpleConnection,
{
    // Called inside the caller's open transaction: nothing runs.
    let mut conn = connect();
    AnsiTransactionManager::begin_transaction(&mut conn).unwrap();
    let misuse = inbox_error(run(&mut conn, &1, "SELECT 1").unwrap_err());
    assert!(
        matches!(misuse, Error::CalledInsideTransaction),
        "{misuse:?}"
    );
    assert_eq!(misuse.action(), Action::Alert);
    AnsiTransactionManager::rollback_transaction(&mut conn).unwrap();

    // A business unique violation in the body.
    let mut conn = connect();
    conn.batch_execute("INSERT INTO users (email) VALUES ('a@example.com')")
        .unwrap();
    let business = run(
        &mut conn,
        &2,
        "INSERT INTO users (email) VALUES ('a@example.com')",
    )
    .unwrap_err();
    assert_eq!(body_action(&business), Action::DeadLetter, "{business:?}");

    // A body that reads a table dropped under it.
    let missing = run(&mut conn, &3, "SELECT * FROM no_such_table").unwrap_err();
    assert_eq!(
        classify(&missing, &InboxSchema::DEFAULT),
        ErrorClass::Schema,
        "{missing:?}"
    );
    assert_eq!(body_action(&missing), Action::Alert);

    // The inbox table itself dropped: refused before any marker, on a fresh connection.
    conn.batch_execute("DROP TABLE inbox").unwrap();
    let mut fresh = connect();
    let schema = inbox_error(run(&mut fresh, &4, "SELECT 1").unwrap_err());
    assert!(matches!(schema, Error::Schema(_)), "{schema:?}");
    assert_eq!(schema.action(), Action::Alert);
}

/// A claim-mode handler on an r2d2 pool whose body runs `during` (the side effect).
type OnPool<C> = fn(
    &diesel::r2d2::Pool<diesel::r2d2::ConnectionManager<C>>,
    &u64,
    &dyn Fn(),
) -> Result<inbox_diesel::InFlightOutcome<()>, inbox_tests::AppError>;

/// Claim mode on a pool whose connection the server ends during the side effect (a
/// failover, a pooler's restart, an operator's kill): the pool, not testing its
/// connections on checkout, hands the dead one to the stamp, which fails on it and takes
/// another — the effect is stamped, and its redelivery is a duplicate. Before, the stamp
/// gave up at its first failure and the effect ran again after the lease.
fn a_connection_ended_during_the_side_effect_is_replaced_for_the_stamp<C>(
    url: &str,
    kill_the_others: impl FnMut(),
    handler: OnPool<C>,
) where
    C: diesel::r2d2::R2D2Connection + 'static,
{
    use std::sync::atomic::{AtomicUsize, Ordering};
    let pool = diesel::r2d2::Pool::builder()
        .max_size(1)
        .test_on_check_out(false)
        .connection_timeout(std::time::Duration::from_secs(20))
        .build(diesel::r2d2::ConnectionManager::<C>::new(url))
        .unwrap();
    let (effects, kill) = (
        AtomicUsize::new(0),
        std::cell::RefCell::new(kill_the_others),
    );
    let during = || {
        effects.fetch_add(1, Ordering::SeqCst);
        (kill.borrow_mut())();
    };
    let outcome = handler(&pool, &1, &during);
    assert!(
        matches!(outcome, Ok(inbox_diesel::InFlightOutcome::Processed(()))),
        "{outcome:?}"
    );
    let again = handler(&pool, &1, &|| {
        effects.fetch_add(1, Ordering::SeqCst);
    });
    assert!(again.unwrap().is_duplicate());
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

mod sqlite {
    use super::*;
    use diesel::SqliteConnection;
    use inbox_diesel::idempotent;
    use inbox_tests::sqlite::SqliteDb;

    #[idempotent(consumer = "fault", key = *id, retries = 1, busy_timeout_ms = 50)]
    fn run(conn: &mut SqliteConnection, id: &u64, sql: &str) -> diesel::QueryResult<()> {
        conn.batch_execute(sql)
    }

    /// The same with an application error type, which keeps the inbox's error whole.
    #[idempotent(consumer = "fault", key = *id, retries = 1, busy_timeout_ms = 50)]
    fn run_app(conn: &mut SqliteConnection, id: &u64) -> Result<(), inbox_tests::AppError> {
        conn.batch_execute("SELECT 1")?;
        Ok(())
    }

    #[test]
    fn every_fault_has_its_action() {
        // Busy: another connection holds the write lock past the busy timeout, through the
        // handler's retry.
        let db = SqliteDb::new("faults");
        let mut holder = db.connect();
        holder.batch_execute("BEGIN IMMEDIATE").unwrap();
        let busy = match run_app(&mut db.connect(), &10).unwrap_err() {
            inbox_tests::AppError::Inbox(error) => error,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            busy.class(),
            ErrorClass::Transient(inbox_diesel::TransientKind::Busy)
        );
        // The handler's retry was used up: two attempts, then the pump's turn.
        assert_eq!((busy.action(), busy.attempts()), (Action::RetryLater, 2));
        holder.batch_execute("ROLLBACK").unwrap();

        shared_faults(|| db.connect(), run);
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use diesel::PgConnection;
    use inbox_diesel::idempotent;
    use inbox_tests::postgres::PgDb;

    #[idempotent(consumer = "fault", key = *id, retries = 0)]
    fn run(conn: &mut PgConnection, id: &u64, sql: &str) -> diesel::QueryResult<()> {
        conn.batch_execute(sql)
    }

    #[idempotent(consumer = "fault-claim", key = *id, mode = "claim", retries = 0)]
    fn claim(conn: &mut PgConnection, id: &u64) -> Result<(), inbox_tests::AppError> {
        Ok(())
    }

    type DbPool = diesel::r2d2::Pool<diesel::r2d2::ConnectionManager<PgConnection>>;

    #[idempotent(consumer = "fault-pool", key = *id, mode = "claim")]
    fn claim_on_a_pool(
        pool: &DbPool,
        id: &u64,
        during: &dyn Fn(),
    ) -> Result<(), inbox_tests::AppError> {
        during();
        Ok(())
    }

    #[idempotent(consumer = "fault-unread", key = *id, mode = "claim")]
    fn claim_counted(
        conn: &mut PgConnection,
        id: &u64,
        effects: &std::sync::atomic::AtomicUsize,
    ) -> Result<(), inbox_tests::AppError> {
        effects.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// A stamp the server refuses in words the runtime cannot read — a server in another
    /// language whose session a transaction-mode pooler handed the stamp without the
    /// English the check set on another, a trigger's own message — is tried again, as a
    /// transient failure would be: the side effect ran, and what failed may pass. Before, the
    /// stamp gave up at once (`EffectNotRecorded`) and the effect ran again after the lease
    /// (an operator's trial: a French server's statement timeout behind PgBouncer).
    #[test]
    fn a_stamp_refused_in_words_the_runtime_cannot_read_is_tried_again() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let db = PgDb::new("faults_unread_stamp");
        let mut conn = db.connect();
        let effects = AtomicUsize::new(0);
        // The check passes on this connection, and is remembered for it.
        assert!(
            claim_counted(&mut conn, &1, &effects)
                .unwrap()
                .is_processed()
        );
        // The next two stamps refused with a message of the server's own words.
        db.connect()
            .batch_execute(
                "CREATE SEQUENCE stamp_refusals; \
                 CREATE FUNCTION refuse_stamp() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 IF nextval('stamp_refusals') <= 2 THEN \
                 RAISE EXCEPTION 'Abbruch der Anweisung wegen Zeitüberschreitung'; END IF; \
                 RETURN NEW; END $$; \
                 CREATE TRIGGER refuse_stamp BEFORE UPDATE ON inbox \
                 FOR EACH ROW EXECUTE FUNCTION refuse_stamp()",
            )
            .unwrap();
        let outcome = claim_counted(&mut conn, &2, &effects);
        assert!(
            matches!(outcome, Ok(inbox_diesel::InFlightOutcome::Processed(()))),
            "{outcome:?}"
        );
        assert!(
            claim_counted(&mut conn, &2, &effects)
                .unwrap()
                .is_duplicate()
        );
        assert_eq!(
            effects.load(Ordering::SeqCst),
            2,
            "each side effect ran once"
        );
        assert_eq!(
            inbox_tests::count(
                &mut db.connect(),
                "SELECT count(*) AS n FROM inbox WHERE processed_at IS NOT NULL"
            ),
            2
        );
    }

    #[idempotent(consumer = "fault-locked", key = *id, mode = "claim", lease_ms = 6000)]
    fn claim_while_locked(
        conn: &mut PgConnection,
        id: &u64,
        effects: &std::sync::atomic::AtomicUsize,
        during: &dyn Fn(),
    ) -> Result<(), inbox_tests::AppError> {
        during();
        effects.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// A stamp that meets a lock on the whole table — a migration's `ACCESS EXCLUSIVE`, a
    /// `VACUUM FULL` — past the session's `lock_timeout` through more than the handler's
    /// retries, while the claim's lease lasts: tried again until the lock is gone, and the
    /// effect recorded once. Before, the stamp gave up after its four tries
    /// (`EffectNotRecorded`), and the redelivery after the lease ran the effect again (an
    /// operator's trial: two effects for one message, on PostgreSQL and MariaDB).
    #[test]
    fn a_stamp_held_back_by_a_table_lock_is_tried_while_the_claim_lasts() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let db = PgDb::new("faults_locked_stamp");
        let mut conn = db.connect();
        conn.batch_execute("SET lock_timeout = '100ms'").unwrap();
        let effects = AtomicUsize::new(0);
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let locker = {
            let url = db.url().to_owned();
            std::thread::spawn(move || {
                let mut admin = <PgConnection as diesel::Connection>::establish(&url).unwrap();
                locked_rx.recv().unwrap();
                admin
                    .batch_execute("BEGIN; LOCK TABLE inbox IN ACCESS EXCLUSIVE MODE")
                    .unwrap();
                std::thread::sleep(std::time::Duration::from_millis(2500));
                admin.batch_execute("COMMIT").unwrap();
            })
        };
        // The lock taken while the side effect runs, before its stamp.
        let during = || {
            locked_tx.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(300));
        };
        let outcome = claim_while_locked(&mut conn, &1, &effects, &during);
        locker.join().unwrap();
        assert!(
            matches!(outcome, Ok(inbox_diesel::InFlightOutcome::Processed(()))),
            "{outcome:?}"
        );
        assert!(
            claim_while_locked(&mut conn, &1, &effects, &|| ())
                .unwrap()
                .is_duplicate()
        );
        assert_eq!(
            effects.load(Ordering::SeqCst),
            1,
            "the side effect ran once"
        );
    }

    #[test]
    fn on_a_pool_a_connection_ended_during_the_side_effect_is_replaced_for_the_stamp() {
        let db = PgDb::new("faults_pool_stamp");
        let mut killer = db.connect();
        a_connection_ended_during_the_side_effect_is_replaced_for_the_stamp(
            db.url(),
            move || {
                killer
                    .batch_execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE datname = current_database() AND pid <> pg_backend_pid()",
                    )
                    .unwrap()
            },
            claim_on_a_pool,
        );
    }

    #[test]
    fn every_fault_has_its_action() {
        let db = PgDb::new("faults");

        // A lock timeout, while another session holds the row: 55P03.
        let mut holder = db.connect();
        holder
            .batch_execute("BEGIN; SELECT * FROM accounts WHERE id = 1 FOR UPDATE")
            .unwrap();
        let locked = run(
            &mut db.connect(),
            &10,
            "SET LOCAL lock_timeout = '50ms'; UPDATE accounts SET balance = 1 WHERE id = 1",
        )
        .unwrap_err();
        assert_eq!(body_action(&locked), Action::RetryLater, "{locked:?}");
        holder.batch_execute("ROLLBACK").unwrap();

        // A statement timeout: 57014.
        let slow = run(
            &mut db.connect(),
            &11,
            "SET LOCAL statement_timeout = '20ms'; SELECT pg_sleep(1)",
        )
        .unwrap_err();
        assert_eq!(body_action(&slow), Action::RetryLater, "{slow:?}");

        // The server ends the session: 57P01.
        let mut doomed = db.connect();
        // Checked once on this connection, so that the claim below fails in its own steps.
        assert!(claim(&mut doomed, &15).unwrap().is_processed());
        let ended = run(
            &mut doomed,
            &12,
            "SELECT pg_terminate_backend(pg_backend_pid())",
        )
        .unwrap_err();
        assert_eq!(body_action(&ended), Action::Reconnect, "{ended:?}");
        // The connection is not handed back silently: the next call on it says so too.
        let next = run(&mut doomed, &13, "SELECT 1").unwrap_err();
        assert_eq!(body_action(&next), Action::Reconnect, "{next:?}");
        // Claim mode reads the same fault the same way, in the inbox's own error.
        match claim(&mut doomed, &16).unwrap_err() {
            inbox_tests::AppError::Inbox(error) => {
                assert_eq!(error.action(), Action::Reconnect, "{error:?}")
            }
            other => panic!("{other:?}"),
        }
        // An r2d2 pool discards it: the next checkout is a working connection.
        let pool = diesel::r2d2::Pool::builder()
            .max_size(1)
            .build(diesel::r2d2::ConnectionManager::<PgConnection>::new(
                db.url(),
            ))
            .unwrap();
        let ended = run(
            &mut pool.get().unwrap(),
            &14,
            "SELECT pg_terminate_backend(pg_backend_pid())",
        )
        .unwrap_err();
        assert_eq!(body_action(&ended), Action::Reconnect, "{ended:?}");
        assert!(
            run(&mut pool.get().unwrap(), &15, "SELECT 1")
                .unwrap()
                .is_processed()
        );

        shared_faults(|| db.connect(), run);
    }

    #[idempotent(consumer = "fault", key = *id, retries = 0)]
    async fn run_async(
        conn: &mut diesel_async::AsyncPgConnection,
        id: &u64,
        sql: &str,
    ) -> diesel::QueryResult<()> {
        diesel_async::SimpleAsyncConnection::batch_execute(conn, sql).await
    }

    /// diesel-async reads the same faults the same way.
    #[test]
    fn every_fault_has_its_action_on_diesel_async() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let db = PgDb::new("faults_async");
            let ended = run_async(
                &mut db.connect_async().await,
                &12,
                "SELECT pg_terminate_backend(pg_backend_pid())",
            )
            .await
            .unwrap_err();
            assert_eq!(body_action(&ended), Action::Reconnect, "{ended:?}");
            // deadpool and bb8 discard the ended connection: the next checkout works.
            use diesel_async::pooled_connection::AsyncDieselConnectionManager;
            type Manager = AsyncDieselConnectionManager<diesel_async::AsyncPgConnection>;
            let deadpool =
                diesel_async::pooled_connection::deadpool::Pool::builder(Manager::new(db.url()))
                    .max_size(1)
                    .build()
                    .unwrap();
            let bb8 = diesel_async::pooled_connection::bb8::Pool::builder()
                .max_size(1)
                .build(Manager::new(db.url()))
                .await
                .unwrap();
            let kill = "SELECT pg_terminate_backend(pg_backend_pid())";
            let ended = run_async(&mut deadpool.get().await.unwrap(), &20, kill)
                .await
                .unwrap_err();
            assert_eq!(body_action(&ended), Action::Reconnect, "{ended:?}");
            let next = run_async(&mut deadpool.get().await.unwrap(), &21, "SELECT 1").await;
            assert!(next.unwrap().is_processed());
            let ended = run_async(&mut bb8.get().await.unwrap(), &22, kill)
                .await
                .unwrap_err();
            assert_eq!(body_action(&ended), Action::Reconnect, "{ended:?}");
            let next = run_async(&mut bb8.get().await.unwrap(), &23, "SELECT 1").await;
            assert!(next.unwrap().is_processed());
            let slow = run_async(
                &mut db.connect_async().await,
                &11,
                "SET LOCAL statement_timeout = '20ms'; SELECT pg_sleep(1)",
            )
            .await
            .unwrap_err();
            assert_eq!(body_action(&slow), Action::RetryLater, "{slow:?}");
        });
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use diesel::MysqlConnection;
    use inbox_diesel::idempotent;
    use inbox_tests::mysql::MysqlDb;

    #[idempotent(consumer = "fault", key = *id, retries = 0)]
    fn run(conn: &mut MysqlConnection, id: &u64, sql: &str) -> diesel::QueryResult<()> {
        conn.batch_execute(sql)
    }

    type DbPool = diesel::r2d2::Pool<diesel::r2d2::ConnectionManager<MysqlConnection>>;

    #[idempotent(consumer = "fault-pool", key = *id, mode = "claim")]
    fn claim_on_a_pool(
        pool: &DbPool,
        id: &u64,
        during: &dyn Fn(),
    ) -> Result<(), inbox_tests::AppError> {
        during();
        Ok(())
    }

    #[test]
    fn on_a_pool_a_connection_ended_during_the_side_effect_is_replaced_for_the_stamp() {
        let db = MysqlDb::new("faults_pool_stamp");
        // The pool's sessions of the test's database, ended by their ids.
        let mut killer = db.connect();
        a_connection_ended_during_the_side_effect_is_replaced_for_the_stamp(
            db.url(),
            move || {
                use diesel::RunQueryDsl;
                #[derive(diesel::QueryableByName)]
                struct Session {
                    #[diesel(sql_type = diesel::sql_types::BigInt)]
                    id: i64,
                }
                let others: Vec<Session> = diesel::sql_query(
                    "SELECT CAST(id AS SIGNED) AS id FROM information_schema.processlist \
                     WHERE db = DATABASE() AND id <> CONNECTION_ID()",
                )
                .load(&mut killer)
                .unwrap();
                assert!(!others.is_empty(), "the pool's session is not listed");
                for session in others {
                    killer
                        .batch_execute(&format!("KILL CONNECTION {}", session.id))
                        .unwrap();
                }
            },
            claim_on_a_pool,
        );
    }

    #[test]
    fn every_fault_has_its_action() {
        let db = MysqlDb::new("faults");

        // A lock wait timeout, while another session holds the row: 1205.
        let mut holder = db.connect();
        holder
            .batch_execute("BEGIN; SELECT * FROM accounts WHERE id = 1 FOR UPDATE")
            .unwrap();
        let mut waiter = db.connect();
        waiter
            .batch_execute("SET SESSION innodb_lock_wait_timeout = 1")
            .unwrap();
        let locked = run(
            &mut waiter,
            &10,
            "UPDATE accounts SET balance = 1 WHERE id = 1",
        )
        .unwrap_err();
        assert_eq!(body_action(&locked), Action::RetryLater, "{locked:?}");
        holder.batch_execute("ROLLBACK").unwrap();

        // A statement past the server's time limit: MariaDB's 1969 (MySQL's 3024 is
        // `max_execution_time`, for SELECTs only).
        let slow = run(
            &mut db.connect(),
            &11,
            "SET STATEMENT max_statement_time = 0.05 FOR SELECT SLEEP(1)",
        )
        .unwrap_err();
        assert_eq!(body_action(&slow), Action::RetryLater, "{slow:?}");

        // The server ends the session.
        let ended = run(&mut db.connect(), &12, "KILL CONNECTION_ID()").unwrap_err();
        assert_eq!(body_action(&ended), Action::Reconnect, "{ended:?}");

        shared_faults(|| db.connect(), run);
    }

    /// A session the server ended while it sat idle (`wait_timeout`), on a connection the
    /// application kept: the delivery on it is a lost connection, and so is the next one.
    /// Before, the `ROLLBACK` that never reached the server left diesel counting a
    /// transaction, and the next delivery was refused as one called inside a caller's
    /// transaction (a misuse, which halts a pump, with advice to join it).
    #[test]
    fn a_session_ended_while_idle_stays_a_lost_connection() {
        let db = MysqlDb::new("idle_ended");
        let mut conn = db.connect();
        conn.batch_execute("SET SESSION wait_timeout = 1").unwrap();
        assert!(run(&mut conn, &19, "SELECT 1").unwrap().is_processed());
        std::thread::sleep(std::time::Duration::from_millis(2500));
        for id in [20, 21] {
            let error = run(&mut conn, &id, "SELECT 1").unwrap_err();
            assert_eq!(body_action(&error), Action::Reconnect, "{id}: {error:?}");
        }
    }
}
