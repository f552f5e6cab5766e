//! The backend suite on PostgreSQL, plus what only PostgreSQL does: the deterministic
//! lock wait, aborted transactions, serialization failures. Needs `INBOX_TEST_PG`.

type Db = inbox_tests::postgres::PgDb;
type DbConnection = diesel::PgConnection;

include!("behaviour/transaction.rs");
/// The batch form.
mod batch_form {
    type Db = inbox_tests::postgres::PgDb;

    include!("behaviour/batch.rs");
}
/// Get-or-create.
mod get_or_create {
    type Db = inbox_tests::postgres::PgDb;
    type Conn = diesel::PgConnection;
    const TABLES: &str = inbox_tests::unique::POSTGRES_TABLES;
    const SETUP: &str = "SELECT 1";
    const PK: &str = "signups_pkey";
    const HANDLE: &str = "ux_signups_handle";

    include!("behaviour/unique.rs");
}
/// Get-or-create on a partial unique index.
mod partial_index {
    type Db = inbox_tests::postgres::PgDb;
    const ID_SQL: &str = "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY";
    const NO_MATCH: &str =
        "there is no unique or exclusion constraint matching the ON CONFLICT specification";

    include!("behaviour/unique_partial.rs");
}
include!("behaviour/server.rs");
/// `transaction = "caller"`: a job runner's transaction joined.
mod joined {
    type Db = inbox_tests::postgres::PgDb;
    type DbConnection = diesel::PgConnection;
    /// The next job, skipping those another worker holds (where the backend can).
    const TAKE_JOB: &str =
        "SELECT id, message FROM jobs ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED";

    include!("behaviour/joined.rs");
}
/// `inbox_diesel::testing`, as a user's suite uses it.
mod testing_kit {
    type Db = inbox_tests::postgres::PgDb;
    type DbConnection = diesel::PgConnection;
    /// Locks account 1 until the transaction ends.
    const LOCK_ROW: &str = "SELECT balance FROM accounts WHERE id = 1 FOR UPDATE";

    include!("behaviour/testing.rs");
}
/// An application's enum of connections (diesel's `MultiConnection`) as the handler's.
mod multi_connection {
    type Db = inbox_tests::postgres::PgDb;
    const TABLES: &str = inbox_tests::unique::POSTGRES_TABLES;
    const SETUP: &str = "SELECT 1";

    include!("behaviour/multi.rs");
}
/// Composite keys: a tuple of parameters, a `format!` with inline arguments.
mod composite {
    type Db = inbox_tests::postgres::PgDb;
    type DbConnection = diesel::PgConnection;

    include!("behaviour/composite.rs");
}
/// Stored results: a duplicate answers with the value its first delivery stored.
mod stored {
    type Db = inbox_tests::postgres::PgDb;
    type DbConnection = diesel::PgConnection;
    const BACKEND: inbox_diesel::schema::Backend = inbox_diesel::schema::Backend::Postgres;

    include!("behaviour/stored.rs");

    #[test]
    fn a_snapshot_older_than_the_markers_commit_reads_the_stored_result() {
        a_snapshot_older_than_the_markers_commit_reads_the_result();
    }

    /// `pay_checked`, whose body waits at `held` until the test lets it go on.
    #[idempotent(consumer = "pay", key = msg.id, store_result = true, fingerprint = msg.amount.to_string())]
    fn pay_held(
        conn: &mut DbConnection,
        msg: &Credit,
        ran: &AtomicUsize,
        held: &Barrier,
    ) -> Result<Receipt, AppError> {
        held.wait();
        held.wait();
        pay_body(conn, msg, ran)
    }

    /// Waits until a session of `db` waits for a lock: the delivery sent to wait did.
    fn until_one_waits(db: &Db) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while db.waiting_for_a_lock() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no session waits for a lock"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// A connection that ran the startup check and `pay` (whose statements are prepared on
    /// it; `pay_checked`'s are others), and its count of bodies run.
    fn warmed(db: &Db) -> (DbConnection, AtomicUsize) {
        let (mut conn, ran) = (db.connect(), AtomicUsize::new(0));
        let first = pay(&mut conn, &Credit::new(1), &ran).unwrap();
        assert!(first.is_processed(), "{first:?}");
        (conn, ran)
    }

    /// A transaction the caller opened as SQL, met by a handler whose statements this
    /// session has not prepared yet (another handler ran on it first): refused before
    /// anything runs — the preparation that follows a missing statement rolls back what is
    /// open, so the refusal must come first — and nothing of the handler's committed.
    #[test]
    fn a_callers_transaction_is_refused_before_the_statements_are_prepared() {
        let db = with_result("stored_cold_caller");
        let (mut conn, ran) = warmed(&db);
        conn.batch_execute("BEGIN; UPDATE accounts SET balance = balance + 100 WHERE id = 2")
            .unwrap();
        let msg = Credit::new(2);
        let refused = pay_checked(&mut conn, &msg, &ran);
        assert!(refused.is_err(), "{refused:?}");
        conn.batch_execute("ROLLBACK").unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the body never ran");
        assert_eq!(credits_of(&mut conn, &msg), 0);
        assert_eq!(markers(&mut conn), 1, "only the first message's");
        // The caller's transaction ended, the connection goes on.
        assert!(pay_checked(&mut conn, &msg, &ran).unwrap().is_processed());
    }

    /// A preparation cut off half-way — the table locked by a migration past the session's
    /// `lock_timeout`, after the checks (which read no table) were prepared — leaves nothing
    /// behind that the next preparation fails on: once the lock is gone, the handler
    /// processes on the same connection.
    #[test]
    fn a_preparation_cut_off_half_way_is_done_again() {
        let db = with_result("stored_cut_preparation");
        let (mut conn, ran) = warmed(&db);
        conn.batch_execute("SET lock_timeout = '300ms'").unwrap();
        let mut migration = db.connect();
        migration
            .batch_execute("BEGIN; LOCK TABLE inbox IN ACCESS EXCLUSIVE MODE")
            .unwrap();
        let msg = Credit::new(2);
        let cut = pay_checked(&mut conn, &msg, &ran);
        assert!(cut.is_err(), "{cut:?}");
        migration.batch_execute("ROLLBACK").unwrap();
        let again = pay_checked(&mut conn, &msg, &ran);
        assert!(matches!(again, Ok(Outcome::Processed(_))), "{again:?}");
        assert_eq!(credits_of(&mut conn, &msg), 1);
    }

    /// The marker of a handler that keeps its result and fingerprint is written once, with
    /// both, at the commit: one version of its row (an insert then an update in the same
    /// transaction would leave the row at its second place in the page).
    #[test]
    fn a_stored_result_and_fingerprint_are_one_version_of_the_markers_row() {
        let db = with_result("stored_one_version");
        let mut conn = db.connect();
        let (msg, ran) = (Credit::new(1), AtomicUsize::new(0));
        let first = pay_checked(&mut conn, &msg, &ran).unwrap();
        assert!(matches!(first, Outcome::Processed(_)), "{first:?}");
        #[derive(QueryableByName)]
        struct Place {
            #[diesel(sql_type = diesel::sql_types::Text)]
            place: String,
            #[diesel(sql_type = diesel::sql_types::Bool)]
            kept: bool,
        }
        let row = diesel::sql_query(
            "SELECT ctid::text AS place, result IS NOT NULL AND fingerprint IS NOT NULL AS kept \
             FROM inbox",
        )
        .get_result::<Place>(&mut conn)
        .unwrap();
        assert_eq!((row.place.as_str(), row.kept), ("(0,1)", true));
        let again = pay_checked(&mut conn, &msg, &ran).unwrap();
        assert!(
            matches!(&again, Outcome::Duplicate { stored: Some(r), .. } if r.balance == 10),
            "{again:?}"
        );
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    /// A retry sent while the first delivery's body runs waits for the key's lock, not for
    /// a marker (none is written before the commit), and replays what the first stored;
    /// its body never runs.
    #[test]
    fn a_retry_waits_for_the_first_delivery_and_replays_its_result() {
        let db = with_result("stored_retry_waits");
        let (msg, ran, held) = (Credit::new(3), AtomicUsize::new(0), Barrier::new(2));
        let (first, retry) = std::thread::scope(|scope| {
            let mut conn = db.connect();
            let (msg, ran, held) = (&msg, &ran, &held);
            let first = scope.spawn(move || pay_held(&mut conn, msg, ran, held));
            held.wait();
            let mut conn = db.connect();
            let retry = scope.spawn(move || pay_checked(&mut conn, msg, ran));
            until_one_waits(&db);
            held.wait();
            (first.join().unwrap(), retry.join().unwrap())
        });
        let Ok(Outcome::Processed(receipt)) = first else {
            panic!("{first:?}")
        };
        assert!(
            matches!(&retry, Ok(Outcome::Duplicate { stored: Some(r), .. }) if *r == receipt),
            "{retry:?}"
        );
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the retry's body never ran");
        assert_eq!(credits_of(&mut db.connect(), &msg), 1);
        assert_eq!(markers(&mut db.connect()), 1);
    }

    /// A marker written without the key's lock (a process of an older version inserts it
    /// first) is still the arbiter: the deferred insert waits for it and is refused once it
    /// commits, the body's work is rolled back, and the delivery is a duplicate.
    #[test]
    fn a_marker_committed_without_the_lock_rolls_the_body_back() {
        let db = with_result("stored_older_process");
        let (msg, ran) = (Credit::new(5), AtomicUsize::new(0));
        let mut older = db.connect();
        older
            .batch_execute(&format!(
                "BEGIN; INSERT INTO inbox (message_id, consumer, received_at, processed_at) \
                 VALUES ('{}', 'pay', now(), now())",
                msg.id
            ))
            .unwrap();
        let outcome = std::thread::scope(|scope| {
            let mut conn = db.connect();
            let (msg, ran) = (&msg, &ran);
            let delivery = scope.spawn(move || pay_checked(&mut conn, msg, ran));
            until_one_waits(&db);
            older.batch_execute("COMMIT").unwrap();
            delivery.join().unwrap()
        });
        assert!(
            matches!(&outcome, Ok(Outcome::Duplicate { .. })),
            "{outcome:?}"
        );
        assert_eq!(
            ran.load(Ordering::SeqCst),
            1,
            "the body ran before the commit"
        );
        assert_eq!(
            credits_of(&mut db.connect(), &msg),
            0,
            "the body's work rolled back"
        );
        assert_eq!(markers(&mut db.connect()), 1);
    }
}
/// Claim mode, sync.
mod claim_mode {
    use inbox_diesel::schema::postgres::inbox;

    type Db = inbox_tests::postgres::PgDb;
    type DbConnection = diesel::PgConnection;
    /// Makes inserts into the inbox wait until the transaction ends (`SHARE` conflicts with the `ROW EXCLUSIVE` an insert takes).
    const HOLD_INBOX_INSERTS: &str = "LOCK TABLE inbox IN SHARE MODE";

    include!("behaviour/claim.rs");
}

use inbox_diesel::Error as InboxError;
use inbox_tests::postgres::PgDb;

/// The body catches a failed statement and returns `Ok`: PostgreSQL had already aborted
/// the transaction and would answer `COMMIT` with a silent rollback. The handler runs it
/// again (the retries), then reports it, and leaves neither marker nor credit.
#[test]
fn swallowed_error_is_reported_never_processed() {
    let db = PgDb::new("swallowed_error");
    let mut conn = db.connect();
    let msg = Credit::new(1);
    let mut runs = 0;
    let result = credit_then(&mut conn, &msg, &mut |conn| {
        runs += 1;
        let swallowed = diesel::sql_query("SELECT 1/0").execute(conn);
        assert!(swallowed.is_err());
        Ok(())
    });
    match &result {
        // Each run counted, as a retried deadlock's or timeout's are.
        Err(AppError::Inbox(aborted @ InboxError::TransactionAborted { .. })) => {
            assert_eq!((aborted.attempts(), runs), (4, 4), "{aborted}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(count_markers(&mut conn), 0);
    assert_eq!(count_credits(&mut conn, &msg), 0);
    // The connection is usable again, and the redelivery processes.
    assert_eq!(credit(&mut conn, &msg).unwrap(), Outcome::Processed(()));
    assert_eq!(balance(&mut conn, 1), 10);
}

/// The same body, swallowing the error on its first run only — as a body that swallows a
/// deadlock or a lock timeout would: the runtime runs it again in a fresh transaction, as
/// it retries a deadlock, and it is processed once, instead of being reported (`Alert`, a
/// halted pump) for a failure a redelivery would get past.
#[test]
fn an_error_swallowed_once_is_retried_and_processed() {
    let db = PgDb::new("swallowed_once");
    let mut conn = db.connect();
    let msg = Credit::new(1);
    let mut runs = 0;
    let result = credit_then(&mut conn, &msg, &mut |conn| {
        runs += 1;
        if runs == 1 {
            let swallowed = diesel::sql_query("SELECT 1/0").execute(conn);
            assert!(swallowed.is_err());
        }
        Ok(())
    });
    assert_eq!(result.unwrap(), Outcome::Processed(()));
    assert_eq!(runs, 2);
    assert_eq!(count_markers(&mut conn), 1);
    assert_eq!(count_credits(&mut conn, &msg), 1);
}

#[idempotent(consumer = "credit", key = msg.id, retries = 0)]
fn credit_then_unretried(
    conn: &mut DbConnection,
    msg: &Credit,
    then: &mut dyn FnMut(&mut DbConnection) -> Result<(), AppError>,
) -> Result<(), AppError> {
    apply_credit(conn, msg)?;
    then(conn)
}

/// The same body with `retries = 0`, or with its retries spent on other failures: the
/// swallowed error was never met by a fresh transaction, and nothing committed — reported
/// as the transient failure it most often is (`RetryLater`: the redelivery is that fresh
/// transaction), not as an alert that halts the pump. One that comes back in every fresh
/// transaction is reported as it is (above).
#[test]
fn an_error_swallowed_with_no_retry_left_is_redelivered_not_an_alert() {
    let db = PgDb::new("swallowed_unretried");
    let mut conn = db.connect();
    let msg = Credit::new(1);
    let mut runs = 0;
    let mut swallow_first = |conn: &mut DbConnection| {
        runs += 1;
        if runs == 1 {
            let swallowed = diesel::sql_query("SELECT 1/0").execute(conn);
            assert!(swallowed.is_err());
        }
        Ok(())
    };
    let result = credit_then_unretried(&mut conn, &msg, &mut swallow_first);
    let Err(AppError::Inbox(error)) = result else {
        panic!("{result:?}")
    };
    assert_eq!(
        error.class(),
        inbox_diesel::ErrorClass::Transient(inbox_diesel::TransientKind::Deadlock),
        "{error:?}"
    );
    assert_eq!(error.class().action(), inbox_diesel::Action::RetryLater);
    assert_eq!(count_markers(&mut conn), 0);
    assert_eq!(count_credits(&mut conn, &msg), 0);
    // The redelivery.
    let again = credit_then_unretried(&mut conn, &msg, &mut swallow_first);
    assert_eq!(again.unwrap(), Outcome::Processed(()));
    assert_eq!(runs, 2);
    assert_eq!(count_credits(&mut conn, &msg), 1);
}

#[idempotent(consumer = "credit", key = msg.id, isolation = "serializable")]
fn credit_serializable(
    conn: &mut DbConnection,
    msg: &Credit,
    then: &mut dyn FnMut(&mut DbConnection) -> Result<(), AppError>,
) -> Result<(), AppError> {
    apply_credit(conn, msg)?;
    then(conn)
}

/// Two SERIALIZABLE handlers credit one account: B's update waits for A's row lock and,
/// when A commits, fails with a serialization failure inside B's body. The runtime finds
/// the diesel error in B's `AppError` and retries B in a fresh transaction, which succeeds.
#[test]
fn serialization_failure_in_the_body_is_retried() {
    let db = PgDb::new("serialization_failure");
    let b_attempts = AtomicUsize::new(0);
    let (a, b) = a_holds_b_waits(
        &db,
        |conn, hold| {
            credit_serializable(conn, &Credit::new(1), &mut |_| {
                hold();
                Ok(())
            })
        },
        |conn| {
            credit_serializable(conn, &Credit::new(2), &mut |_| {
                b_attempts.fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
        },
    );
    assert_eq!(a.unwrap(), Outcome::Processed(()));
    assert_eq!(b.unwrap(), Outcome::Processed(()));
    // B's first attempt failed in its UPDATE, before the hook: the hook ran once, in the retry.
    assert_eq!(b_attempts.load(Ordering::Relaxed), 1);
    let mut conn = db.connect();
    assert_eq!(count_markers(&mut conn), 2);
    assert_eq!(balance(&mut conn, 1), 20);
}

/// The same serialization failure, in a body whose error type is `anyhow::Error` (and an
/// application error built on it, with a blanket `From`): the runtime finds the diesel error
/// in it and retries B, which then succeeds. Without that, B's failure is returned after one
/// attempt.
#[test]
fn serialization_failure_in_an_anyhow_body_is_retried() {
    #[idempotent(consumer = "credit", key = msg.id, isolation = "serializable")]
    fn credit_anyhow(
        conn: &mut DbConnection,
        msg: &Credit,
        then: &mut dyn FnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        apply_credit(conn, msg)?;
        then()
    }

    let db = PgDb::new("serialization_anyhow");
    let b_attempts = AtomicUsize::new(0);
    let as_handler = |result: anyhow::Result<Outcome<()>>| result.map_err(|_| AppError::Rejected);
    let (a, b) = a_holds_b_waits(
        &db,
        |conn, hold| {
            as_handler(credit_anyhow(conn, &Credit::new(1), &mut || {
                hold();
                Ok(())
            }))
        },
        |conn| {
            as_handler(credit_anyhow(conn, &Credit::new(2), &mut || {
                b_attempts.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }))
        },
    );
    assert_eq!(a.unwrap(), Outcome::Processed(()));
    assert_eq!(b.unwrap(), Outcome::Processed(()), "B was retried");
    assert_eq!(b_attempts.load(Ordering::Relaxed), 1);
    assert_eq!(count_markers(&mut db.connect()), 2);
}

/// `retries = 0`: the same serialization failure is returned, classified, not retried.
#[test]
fn serialization_failure_without_retries_is_returned() {
    #[idempotent(consumer = "credit", key = msg.id, isolation = "serializable", retries = 0)]
    fn credit_once(
        conn: &mut DbConnection,
        msg: &Credit,
        then: &mut dyn FnMut(&mut DbConnection) -> Result<(), AppError>,
    ) -> Result<(), AppError> {
        apply_credit(conn, msg)?;
        then(conn)
    }
    let db = PgDb::new("serialization_no_retry");
    let (a, b) = a_holds_b_waits(
        &db,
        |conn, hold| {
            credit_once(conn, &Credit::new(1), &mut |_| {
                hold();
                Ok(())
            })
        },
        |conn| credit_once(conn, &Credit::new(2), &mut |_| Ok(())),
    );
    assert!(a.unwrap().is_processed());
    let Err(AppError::Db(error)) = b else {
        panic!("expected B's serialization failure, got {b:?}");
    };
    assert_eq!(
        inbox_diesel::classify(&error, &inbox_diesel::InboxSchema::DEFAULT),
        ErrorClass::Transient(inbox_diesel::TransientKind::SerializationFailure)
    );
    let mut conn = db.connect();
    assert_eq!(count_markers(&mut conn), 1);
}

/// `classify` against errors raised by this PostgreSQL server.
#[test]
fn classify_real_postgres_errors() {
    use diesel::connection::SimpleConnection;
    let db = PgDb::new("classify_real_errors");
    let mut conn = db.connect();
    let schema = inbox_diesel::InboxSchema::DEFAULT;
    let marker = "INSERT INTO inbox (message_id, consumer) VALUES ('00000000-0000-0000-0000-000000000001', 'credit')";
    conn.batch_execute(marker).unwrap();
    assert_eq!(
        inbox_diesel::classify(&conn.batch_execute(marker).unwrap_err(), &schema),
        ErrorClass::InboxDuplicate
    );
    conn.batch_execute("INSERT INTO users (email) VALUES ('a@example.com')")
        .unwrap();
    let business = conn
        .batch_execute("INSERT INTO users (email) VALUES ('a@example.com')")
        .unwrap_err();
    assert_eq!(
        inbox_diesel::classify(&business, &schema),
        ErrorClass::UniqueViolation {
            constraint: Some("ux_users_email".into())
        }
    );
    let pk = conn
        .batch_execute("INSERT INTO accounts (id, balance) VALUES (1, 0)")
        .unwrap_err();
    assert_eq!(
        inbox_diesel::classify(&pk, &schema),
        ErrorClass::UniqueViolation {
            constraint: Some("accounts_pkey".into())
        }
    );

    conn.batch_execute("BEGIN; SELECT 1/0;").unwrap_err();
    let aborted = conn.batch_execute("SELECT 1").unwrap_err();
    assert_eq!(
        inbox_diesel::classify(&aborted, &schema),
        ErrorClass::TransactionAborted
    );
    conn.batch_execute("ROLLBACK").unwrap();
}

/// A body that violates an index of another table that happens to carry the inbox index's
/// name (`archive.inbox_copy`, made by copying the inbox's DDL): the handler returns the
/// error, and `classify` must not call it the inbox's duplicate — a pump that acked on that
/// would lose the message. PostgreSQL names the table beside the constraint.
#[test]
fn an_index_named_like_the_inboxs_on_another_table_is_not_a_duplicate() {
    use diesel::connection::SimpleConnection;
    use inbox_diesel::{Uuid, idempotent};

    #[idempotent(consumer = "archiver", key = *id)]
    fn archive(conn: &mut diesel::PgConnection, id: &Uuid) -> diesel::QueryResult<()> {
        diesel::sql_query(
            "INSERT INTO archive.inbox_copy (message_id, consumer) VALUES ($1, 'credit')",
        )
        .bind::<diesel::sql_types::Uuid, _>(id)
        .execute(conn)?;
        Ok(())
    }

    let db = PgDb::new("twin_index");
    let mut conn = db.connect();
    conn.batch_execute(
        "CREATE SCHEMA archive;
         CREATE TABLE archive.inbox_copy (message_id UUID NOT NULL, consumer TEXT NOT NULL,
             CONSTRAINT ux_inbox_message_consumer UNIQUE (message_id, consumer));
         INSERT INTO archive.inbox_copy VALUES ('00000000-0000-0000-0000-000000000007', 'credit');",
    )
    .unwrap();
    let error = archive(&mut conn, &inbox_diesel::Uuid::from_u128(7)).unwrap_err();
    assert_eq!(
        inbox_diesel::classify(&error, &inbox_diesel::InboxSchema::DEFAULT),
        ErrorClass::UniqueViolation {
            constraint: Some("ux_inbox_message_consumer".into())
        }
    );
    let markers = inbox_tests::server::count(&mut conn, "SELECT count(*) AS n FROM inbox");
    assert_eq!(markers, 0, "the failed delivery left no marker");
}

/// A real deadlock: two sessions lock two accounts in opposite orders.
#[test]
fn classify_real_postgres_deadlock() {
    use diesel::connection::SimpleConnection;
    use std::sync::Barrier;
    let db = PgDb::new("classify_deadlock");
    let barrier = Barrier::new(2);
    let errors: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = [(1, 2), (2, 1)]
            .into_iter()
            .map(|(first, second)| {
                let mut conn = db.connect();
                let barrier = &barrier;
                scope.spawn(move || {
                    conn.batch_execute("BEGIN").unwrap();
                    conn.batch_execute(&format!(
                        "UPDATE accounts SET balance = 1 WHERE id = {first}"
                    ))
                    .unwrap();
                    barrier.wait();
                    let result = conn.batch_execute(&format!(
                        "UPDATE accounts SET balance = 1 WHERE id = {second}"
                    ));
                    conn.batch_execute("ROLLBACK").unwrap();
                    result.err()
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect()
    });
    assert_eq!(
        errors.len(),
        1,
        "exactly one session is chosen as the deadlock victim"
    );
    assert_eq!(
        inbox_diesel::classify(&errors[0], &inbox_diesel::InboxSchema::DEFAULT),
        ErrorClass::Transient(inbox_diesel::TransientKind::Deadlock)
    );
}

/// The batch form: one `INSERT … ON CONFLICT DO UPDATE … RETURNING` for many rows. Repeated
/// keys make PostgreSQL refuse the statement (a row touched twice); collapsed, the batch
/// yields one id per key, the existing row's among them.
#[test]
fn upsert_all_is_one_statement_for_a_collapsed_batch() {
    use diesel::connection::SimpleConnection;
    use inbox_diesel::unique::{self, UniqueError};
    use inbox_tests::unique::{POSTGRES_TABLES, SIGNUPS_EMAIL, signups};

    let db = PgDb::new("unique_upsert_all");
    let mut conn = db.connect();
    conn.batch_execute(POSTGRES_TABLES).unwrap();
    let carol = unique::upsert(
        &mut conn,
        &SIGNUPS_EMAIL,
        diesel::insert_into(signups::table).values((
            signups::email.eq("carol@example.com"),
            signups::handle.eq("carol"),
        )),
        signups::id,
    )
    .unwrap();
    let batch = vec![
        ("ada@example.com", "ada"),
        ("bob@example.com", "bob"),
        ("ada@example.com", "ada-again"),
        ("carol@example.com", "carol-again"),
    ];
    let rows = |batch: &[(&'static str, &'static str)]| {
        batch
            .iter()
            .map(|&(email, handle)| (signups::email.eq(email), signups::handle.eq(handle)))
            .collect::<Vec<_>>()
    };
    let repeated = rows(&batch);
    let refused = unique::upsert_all(
        &mut conn,
        &SIGNUPS_EMAIL,
        &repeated,
        |rows| diesel::insert_into(signups::table).values(rows),
        signups::id,
    );
    match refused {
        Err(UniqueError::Database(error)) => assert!(
            error
                .to_string()
                .contains("ON CONFLICT DO UPDATE command cannot affect row a second time"),
            "{error}"
        ),
        other => panic!("expected the cardinality violation, got {other:?}"),
    }
    let distinct = rows(&unique::collapse(batch, |row| row.0));
    let mut ids = unique::upsert_all(
        &mut conn,
        &SIGNUPS_EMAIL,
        &distinct,
        |rows| diesel::insert_into(signups::table).values(rows),
        signups::id,
    )
    .unwrap();
    let none = unique::upsert_all(
        &mut conn,
        &SIGNUPS_EMAIL,
        &distinct[..0],
        |rows| diesel::insert_into(signups::table).values(rows),
        signups::id,
    );
    assert!(none.unwrap().is_empty(), "no rows, no statement");
    assert_eq!(ids.len(), 3);
    assert!(ids.contains(&carol), "{ids:?}");
    ids.sort_unstable();
    let mut stored: Vec<i64> = signups::table.select(signups::id).load(&mut conn).unwrap();
    stored.sort_unstable();
    assert_eq!(ids, stored);
}

/// The key lock inside a REPEATABLE READ transaction would wait for the previous holder and
/// still not see its rows: refused, with the reason.
#[test]
fn the_key_lock_refuses_a_snapshot_older_than_the_lock() {
    use inbox_diesel::unique::{self, UniqueError};

    let db = PgDb::new("unique_lock_snapshot");
    let mut conn = db.connect();
    let result = conn
        .build_transaction()
        .repeatable_read()
        .run(|c| unique::serialize_on(c, "tenant:acme", |_| Ok::<_, UniqueError>(())));
    assert!(
        matches!(&result, Err(UniqueError::Unsupported { what }) if what.contains("REPEATABLE READ")),
        "{result:?}"
    );
    // Under READ COMMITTED, inside a transaction, it runs.
    let inside =
        conn.transaction(|c| unique::serialize_on(c, "tenant:acme", |_| Ok::<_, UniqueError>(7)));
    assert_eq!(inside.unwrap(), 7);
}

/// A retention below a second is rounded up, never down: a purge of rows older than 900 ms
/// run right after a message committed keeps its marker, and the redelivery is a duplicate.
/// And a purge of rows older than any age PostgreSQL's interval arithmetic can count runs
/// and removes nothing, instead of failing on every run (and letting the inbox grow).
#[test]
fn purge_ages_are_rounded_up_and_bounded() {
    use inbox_diesel::purge::{Purge, purge};
    use inbox_diesel::{Uuid, idempotent};

    #[idempotent(consumer = "credit", key = *id)]
    fn credit(conn: &mut diesel::PgConnection, id: &Uuid) -> diesel::QueryResult<()> {
        diesel::RunQueryDsl::execute(diesel::sql_query("SELECT 1"), conn).map(drop)
    }

    let db = PgDb::new("purge_ages");
    let mut conn = db.connect();
    let id = Uuid::from_u128(9);
    assert!(credit(&mut conn, &id).unwrap().is_processed());
    let schema = inbox_diesel::InboxSchema::DEFAULT;
    let sub_second = Purge::older_than(std::time::Duration::from_millis(900));
    assert_eq!(purge(&mut conn, &schema, &sub_second).unwrap().removed, 0);
    assert!(credit(&mut conn, &id).unwrap().is_duplicate());
    let forever = Purge::older_than(std::time::Duration::MAX);
    assert_eq!(purge(&mut conn, &schema, &forever).unwrap().removed, 0);
}

/// A batch of 100 000 messages: more markers than PostgreSQL takes bind parameters in one
/// statement (65 535, two per marker). The markers are inserted in chunks inside the one
/// transaction; the redelivered batch finds every one.
#[test]
fn a_batch_larger_than_one_statement_takes() {
    use diesel::connection::SimpleConnection;
    use inbox_diesel::idempotent;
    use inbox_tests::Credit;

    #[idempotent(consumer = "big", batch = msgs, key = |msg| msg.id)]
    fn count(conn: &mut diesel::PgConnection, msgs: &[Credit]) -> diesel::QueryResult<usize> {
        conn.batch_execute("SELECT 1")?;
        Ok(msgs.len())
    }

    let db = PgDb::new("big_batch");
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
