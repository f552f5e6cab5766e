// An application's enum of connections — diesel's `MultiConnection`, one type for several
// backends chosen by the URL, as Vaultwarden's `DbConnInner` — as the handler's connection:
// the runtime runs on the variant, the body's DSL on the enum, in one transaction. Included
// by each backend's suite into a module that names `Db` (the fixture), and `TABLES` and
// `SETUP` (get-or-create's tables, and SQL run on each connection).
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use diesel::prelude::*;
use inbox_diesel::handler::{Handler, run_once};
use inbox_diesel::outbox::{Message, Outbox};
use inbox_diesel::{InboxSchema, Outcome, guarded, idempotent};
use inbox_tests::{AppError, Credit, accounts, credits};

/// The application's connection, as Vaultwarden declares it: a variant per backend its
/// build enables. PostgreSQL and MariaDB first: their URLs are refused at once by the
/// others' `establish`, where SQLite would take any text for a file name.
#[derive(diesel::MultiConnection, inbox_diesel::MultiConnection)]
enum AppDb {
    #[cfg(feature = "postgres")]
    Pg(diesel::PgConnection),
    #[cfg(feature = "mysql")]
    Mysql(diesel::MysqlConnection),
    Sqlite(diesel::SqliteConnection),
}

fn connect(db: &Db) -> AppDb {
    AppDb::establish(db.url()).expect("the enum connects to the test's database")
}

/// The credit, written with the DSL on the enum (diesel's `MultiBackend`), as the
/// application's models are.
fn write_credit(conn: &mut AppDb, msg: &Credit) -> QueryResult<i64> {
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
    accounts::table
        .find(msg.account)
        .select(accounts::balance)
        .first(conn)
}

#[idempotent(consumer = "multi", key = msg.id)]
fn credit(conn: &mut AppDb, msg: &Credit) -> Result<i64, AppError> {
    Ok(write_credit(conn, msg)?)
}

/// The credit, then a failure of the body's own.
#[idempotent(consumer = "multi", key = msg.id)]
fn credit_then_fail(conn: &mut AppDb, msg: &Credit) -> Result<i64, AppError> {
    write_credit(conn, msg)?;
    Err(AppError::Rejected)
}

/// The credit in a nested transaction of the body's (a savepoint), then a failure.
#[idempotent(consumer = "multi", key = msg.id)]
fn credit_nested_then_fail(conn: &mut AppDb, msg: &Credit) -> Result<i64, AppError> {
    conn.transaction(|conn| write_credit(conn, msg))?;
    Err(AppError::Rejected)
}

/// Joins the caller's transaction where one is open, on the enum.
#[idempotent(consumer = "multi-joined", key = msg.id, transaction = "caller_or_own")]
fn credit_joined(conn: &mut AppDb, msg: &Credit) -> Result<i64, AppError> {
    Ok(write_credit(conn, msg)?)
}

/// A batch on the enum.
#[idempotent(consumer = "multi-batch", batch = msgs, key = |msg| msg.id)]
fn credit_batch(conn: &mut AppDb, msgs: &[Credit]) -> Result<usize, AppError> {
    for msg in msgs {
        write_credit(conn, msg)?;
    }
    Ok(msgs.len())
}

/// Claim mode on the enum: the claim's statements on its variant.
#[idempotent(consumer = "multi-claim", key = msg.id, mode = "claim")]
fn send(conn: &mut AppDb, msg: &Credit, sent: &AtomicUsize) -> Result<(), AppError> {
    sent.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

fn credits_of(db: &Db, msg: &Credit) -> i64 {
    inbox_tests::count(
        &mut db.connect(),
        &format!(
            "SELECT COUNT(*) AS n FROM credits WHERE message = '{}'",
            msg.id
        ),
    )
}

fn markers(db: &Db, consumer: &str) -> i64 {
    inbox_tests::count(
        &mut db.connect(),
        &format!("SELECT COUNT(*) AS n FROM inbox WHERE consumer = '{consumer}'"),
    )
}

#[test]
fn the_enums_variant_runs_the_handler() {
    let db = Db::new("multi_once");
    let mut conn = connect(&db);
    let msg = Credit::new(1);
    assert_eq!(credit(&mut conn, &msg).unwrap().processed(), Some(10));
    assert!(credit(&mut conn, &msg).unwrap().is_duplicate());
    assert_eq!(credits_of(&db, &msg), 1);
    assert_eq!(markers(&db, "multi"), 1);
    assert_eq!(inbox_tests::balance(&mut db.connect(), 1), 10);
}

#[test]
fn a_failed_body_on_the_enum_leaves_nothing() {
    let db = Db::new("multi_failed");
    let mut conn = connect(&db);
    let msg = Credit::new(2);
    assert!(matches!(
        credit_then_fail(&mut conn, &msg),
        Err(AppError::Rejected)
    ));
    // A savepoint of the body's own, released, goes with the handler's transaction.
    assert!(matches!(
        credit_nested_then_fail(&mut conn, &msg),
        Err(AppError::Rejected)
    ));
    assert_eq!(credits_of(&db, &msg), 0);
    assert_eq!(markers(&db, "multi"), 0);
    // The connection is clean: the redelivery runs and commits.
    assert!(credit(&mut conn, &msg).unwrap().is_processed());
    assert_eq!(credits_of(&db, &msg), 1);
    assert_eq!(inbox_tests::balance(&mut db.connect(), 1), 10);
}

/// Deliveries of one message on four connections at once, released together: one
/// applies it, the others are duplicates proven by the inbox's index.
#[test]
fn deliveries_at_once_on_the_enum_apply_once() {
    let db = Db::new("multi_race");
    let msg = Credit::new(3);
    let barrier = Arc::new(Barrier::new(4));
    let outcomes: Vec<Outcome<i64>> = std::thread::scope(|scope| {
        let racers: Vec<_> = (0..4)
            .map(|_| {
                let barrier = Arc::clone(&barrier);
                let (db, msg) = (&db, &msg);
                scope.spawn(move || {
                    let mut conn = connect(db);
                    barrier.wait();
                    credit(&mut conn, msg).unwrap()
                })
            })
            .collect();
        racers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let processed = outcomes.iter().filter(|o| o.is_processed()).count();
    assert_eq!((processed, outcomes.len() - processed), (1, 3));
    assert_eq!(credits_of(&db, &msg), 1);
    assert_eq!(markers(&db, "multi"), 1);
    assert_eq!(inbox_tests::balance(&mut db.connect(), 1), 10);
}

/// The application's own transaction on the enum, joined: rolled back with it, committed
/// with it; where none is open, the handler's own.
#[test]
fn the_callers_transaction_on_the_enum_is_joined() {
    let db = Db::new("multi_joined");
    let mut conn = connect(&db);
    let msg = Credit::new(4);
    let rolled_back = conn.transaction::<(), AppError, _>(|conn| {
        assert!(credit_joined(conn, &msg)?.is_processed());
        Err(AppError::Rejected)
    });
    assert!(matches!(rolled_back, Err(AppError::Rejected)));
    assert_eq!(
        (credits_of(&db, &msg), markers(&db, "multi-joined")),
        (0, 0)
    );
    conn.transaction::<(), AppError, _>(|conn| {
        assert!(credit_joined(conn, &msg)?.is_processed());
        Ok(())
    })
    .unwrap();
    assert_eq!(
        (credits_of(&db, &msg), markers(&db, "multi-joined")),
        (1, 1)
    );
    // No transaction open: its own.
    assert!(credit_joined(&mut conn, &msg).unwrap().is_duplicate());
    let other = Credit::new(5);
    assert!(credit_joined(&mut conn, &other).unwrap().is_processed());
    assert_eq!(markers(&db, "multi-joined"), 2);
}

#[test]
fn a_batch_and_a_claim_run_on_the_enum() {
    let db = Db::new("multi_batch_claim");
    let mut conn = connect(&db);
    let msgs: Vec<Credit> = (10..13).map(Credit::new).collect();
    let outcome = credit_batch(&mut conn, &msgs).unwrap();
    assert_eq!((outcome.value, outcome.processed), (Some(3), vec![0, 1, 2]));
    let again = credit_batch(&mut conn, &msgs).unwrap();
    assert_eq!((again.value, again.duplicates), (None, vec![0, 1, 2]));
    for msg in &msgs {
        assert_eq!(credits_of(&db, msg), 1);
    }

    let sent = AtomicUsize::new(0);
    assert!(send(&mut conn, &msgs[0], &sent).unwrap().is_processed());
    assert!(send(&mut conn, &msgs[0], &sent).unwrap().is_duplicate());
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    assert_eq!(markers(&db, "multi-claim"), 1);
}

static LIKES: std::sync::LazyLock<Handler> =
    std::sync::LazyLock::new(|| Handler::new("multi-likes").unwrap());

#[test]
fn the_function_api_takes_the_enum() {
    let db = Db::new("multi_function");
    let mut conn = connect(&db);
    let msg = Credit::new(20);
    let like = |conn: &mut AppDb| -> QueryResult<Outcome<i64>> {
        run_once(
            conn,
            &LIKES,
            "like-20",
            guarded!(|tx| write_credit(tx, &msg)),
        )
    };
    assert!(like(&mut conn).unwrap().is_processed());
    assert!(like(&mut conn).unwrap().is_duplicate());
    assert_eq!(credits_of(&db, &msg), 1);
}

/// The credit and a message to publish, in one transaction on the enum.
#[idempotent(consumer = "multi-outbox", key = msg.id)]
fn credit_and_publish(conn: &mut AppDb, msg: &Credit, outbox: &Outbox) -> Result<(), AppError> {
    write_credit(conn, msg)?;
    outbox.publish(conn, Message::new("credits", msg.id.to_string()))?;
    Ok(())
}

/// The library's other entry points on the enum: the startup check, the outbox, the
/// purge, the test kit's clock.
#[test]
fn the_check_the_outbox_and_the_purge_take_the_enum() {
    static OUTBOX: Outbox = Outbox::new("outbox");
    let db = Db::new("multi_entry_points");
    let backend = match connect(&db) {
        #[cfg(feature = "postgres")]
        AppDb::Pg(_) => inbox_diesel::schema::Backend::Postgres,
        #[cfg(feature = "mysql")]
        AppDb::Mysql(_) => inbox_diesel::schema::Backend::Mysql,
        AppDb::Sqlite(_) => inbox_diesel::schema::Backend::Sqlite,
    };
    diesel::connection::SimpleConnection::batch_execute(
        &mut db.connect(),
        &OUTBOX.create_table_sql(backend),
    )
    .unwrap();
    let mut conn = connect(&db);
    inbox_diesel::schema::verify(&mut conn, &InboxSchema::DEFAULT).unwrap();
    let outbox = &OUTBOX;
    let msg = Credit::new(30);
    assert!(
        credit_and_publish(&mut conn, &msg, outbox)
            .unwrap()
            .is_processed()
    );
    assert!(
        credit_and_publish(&mut conn, &msg, outbox)
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(
        inbox_tests::count(&mut db.connect(), "SELECT COUNT(*) AS n FROM outbox"),
        1
    );
    inbox_diesel::testing::pass_time(
        &mut conn,
        &InboxSchema::DEFAULT,
        std::time::Duration::from_secs(30 * 86_400),
    );
    let purged = inbox_diesel::purge::purge(
        &mut conn,
        &InboxSchema::DEFAULT,
        &inbox_diesel::purge::Purge::older_than(std::time::Duration::from_secs(7 * 86_400)),
    )
    .unwrap();
    assert_eq!(purged.removed, 1);
    assert_eq!(markers(&db, "multi-outbox"), 0);
}

/// Get-or-create on the enum: four connections at once, behind a barrier, sign up one
/// address with the DSL on the enum — one creates the row, three get its id; one row.
#[test]
fn get_or_create_takes_the_enum() {
    use diesel::connection::SimpleConnection;
    use inbox_diesel::unique::{self, Created};
    use inbox_tests::unique::{SIGNUPS_EMAIL, signups};

    const CALLERS: usize = 4;
    let db = Db::new("multi_unique");
    connect(&db).batch_execute(TABLES).unwrap();
    let id_of = |conn: &mut AppDb| {
        signups::table
            .filter(signups::email.eq("ann@example.com"))
            .select(signups::id)
            .first::<i64>(conn)
    };
    let barrier = Barrier::new(CALLERS);
    let answers: Vec<Created<i64>> = std::thread::scope(|scope| {
        let callers: Vec<_> = (0..CALLERS)
            .map(|n| {
                let mut conn = connect(&db);
                conn.batch_execute(SETUP).unwrap();
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    unique::insert_or_get(
                        &mut conn,
                        &SIGNUPS_EMAIL,
                        |conn| {
                            diesel::insert_into(signups::table)
                                .values((
                                    signups::email.eq("ann@example.com"),
                                    signups::handle.eq(format!("ann{n}")),
                                ))
                                .execute(conn)?;
                            id_of(conn)
                        },
                        id_of,
                    )
                    .unwrap()
                })
            })
            .collect();
        callers.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let id = id_of(&mut connect(&db)).unwrap();
    assert_eq!(
        answers.iter().filter(|a| a.is_new()).count(),
        1,
        "{answers:?}"
    );
    assert!(
        answers.iter().all(|a| *a.as_ref().into_inner() == id),
        "{answers:?}"
    );
    assert_eq!(
        inbox_tests::count(&mut db.connect(), "SELECT COUNT(*) AS n FROM signups"),
        1
    );
}

/// The key lock on the enum: four connections at once create a tenant, on a table without
/// a unique index, by reading then inserting under `serialize_on` — one row.
#[test]
fn the_key_lock_takes_the_enum() {
    use diesel::connection::SimpleConnection;
    use inbox_diesel::unique::{self, UniqueError};
    use inbox_tests::unique::tenants;

    const CALLERS: usize = 4;
    let db = Db::new("multi_lock");
    connect(&db).batch_execute(TABLES).unwrap();
    let barrier = Barrier::new(CALLERS);
    std::thread::scope(|scope| {
        for _ in 0..CALLERS {
            let mut conn = connect(&db);
            conn.batch_execute(SETUP).unwrap();
            let barrier = &barrier;
            scope.spawn(move || {
                barrier.wait();
                unique::serialize_on(&mut conn, "tenant:acme", |conn: &mut AppDb| {
                    let present: i64 = tenants::table
                        .filter(tenants::name.eq("acme"))
                        .count()
                        .get_result(conn)?;
                    if present == 0 {
                        diesel::insert_into(tenants::table)
                            .values(tenants::name.eq("acme"))
                            .execute(conn)?;
                    }
                    Ok::<_, UniqueError>(())
                })
                .unwrap();
            });
        }
    });
    assert_eq!(
        inbox_tests::count(&mut db.connect(), "SELECT COUNT(*) AS n FROM tenants"),
        1
    );
}
