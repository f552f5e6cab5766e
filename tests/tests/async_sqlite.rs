//! The async suite on SQLite through diesel-async's `SyncConnectionWrapper`.

type Db = inbox_tests::sqlite::SqliteDb;
type AsyncConnection =
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;

include!("behaviour/transaction_async.rs");
/// The same suite on SQLite's lean table design (`--lean`).
mod lean {
    type Db = inbox_tests::sqlite::LeanSqliteDb;
    type AsyncConnection =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;

    include!("behaviour/transaction_async.rs");
}
/// The batch form.
mod async_batch_form {
    type Db = inbox_tests::sqlite::SqliteDb;

    include!("behaviour/batch_async.rs");
}
/// Get-or-create, async.
mod async_get_or_create {
    type Db = inbox_tests::sqlite::SqliteDb;
    type AsyncConnection =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;
    const TABLES: &str = inbox_tests::unique::SQLITE_TABLES;
    const SETUP: &str = "PRAGMA busy_timeout = 10000";
    const PK: &str = "signups.id";

    include!("behaviour/unique_async.rs");
}
/// `transaction = "caller"`, async: a job runner's transaction joined.
mod joined_async {
    type Db = inbox_tests::sqlite::SqliteDb;
    type AsyncConnection =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;
    /// The next job, skipping those another worker holds (where the backend can).
    const TAKE_JOB: &str = "SELECT id, message FROM jobs ORDER BY id LIMIT 1";

    include!("behaviour/joined_async.rs");
}
/// `inbox_diesel::testing`'s async helpers.
mod async_testing_kit {
    type Db = inbox_tests::sqlite::SqliteDb;
    type AsyncConnection =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;

    include!("behaviour/testing_async.rs");
}
/// Stored results and fingerprints, async.
mod async_stored {
    type Db = inbox_tests::sqlite::SqliteDb;
    type AsyncConnection =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;
    const BACKEND: inbox_diesel::schema::Backend = inbox_diesel::schema::Backend::Sqlite;

    include!("behaviour/stored_async.rs");
}
/// Claim mode, async.
mod async_claim_mode {
    use inbox_diesel::schema::sqlite::inbox;

    type Db = inbox_tests::sqlite::SqliteDb;
    type AsyncConnection =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;

    include!("behaviour/claim_async.rs");
}

use diesel::connection::SimpleConnection;
use inbox_tests::sqlite::SqliteDb;

#[idempotent(consumer = "credit", key = msg.id, busy_timeout_ms = 20, retries = 0)]
async fn credit_impatient_once(conn: &mut AsyncConnection, msg: &Credit) -> Result<(), AppError> {
    apply_credit(conn, msg).await?;
    Ok(())
}

#[idempotent(consumer = "credit", key = msg.id, busy_timeout_ms = 20, retries = 20)]
async fn credit_impatient(conn: &mut AsyncConnection, msg: &Credit) -> Result<(), AppError> {
    apply_credit(conn, msg).await?;
    Ok(())
}

/// Another writer holds the database past the busy timeout: without retries the handler
/// reports a transient `SQLITE_BUSY`; with retries it waits it out in fresh transactions.
#[tokio::test(flavor = "multi_thread")]
async fn async_busy_database_is_retried() {
    let db = SqliteDb::new("async_busy");
    let mut writer = db.connect();
    writer.batch_execute("BEGIN IMMEDIATE").unwrap();
    let mut conn = db.connect_async().await;

    let busy = credit_impatient_once(&mut conn, &Credit::new(1)).await;
    let Err(AppError::Inbox(error)) = busy else {
        panic!("expected SQLITE_BUSY, got {busy:?}");
    };
    assert_eq!(
        error.class(),
        ErrorClass::Transient(inbox_diesel::TransientKind::Busy)
    );

    let release = tokio::task::spawn_blocking(move || {
        std::thread::sleep(std::time::Duration::from_millis(150));
        writer.batch_execute("COMMIT").unwrap();
    });
    let outcome = credit_impatient(&mut conn, &Credit::new(1)).await;
    release.await.unwrap();
    assert_eq!(outcome.unwrap(), Outcome::Processed(()));
    assert_eq!(count_markers(&mut conn).await, 1);
}

/// While A holds its uncommitted marker, B's `BEGIN IMMEDIATE` waits on the busy timeout;
/// A's commit makes B a duplicate, A's rollback lets B process.
#[tokio::test(flavor = "multi_thread")]
async fn async_lock_wait_on_sqlite() {
    for a_rejects in [false, true] {
        let db = SqliteDb::new("async_lock_wait");
        let msg = Credit::new(1);
        let (holding, go) = (
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(tokio::sync::Notify::new()),
        );
        let hook = Hook {
            hold: Some((holding.clone(), go.clone())),
            reject: a_rejects,
            ..Hook::default()
        };
        let (mut conn_a, mut conn_b) = (db.connect_async().await, db.connect_async().await);
        let nothing = Hook::default();
        let a = credit(&mut conn_a, &msg, &hook);
        let b = async {
            holding.notified().await;
            let b = credit(&mut conn_b, &msg, &nothing);
            let release = async {
                // SQLite shows no lock waits to observe: give B time to reach its BEGIN.
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                go.notify_one();
            };
            tokio::join!(b, release).0
        };
        let (a, b) = tokio::join!(a, b);
        let b = b.unwrap();
        if a_rejects {
            assert!(matches!(a, Err(AppError::Rejected)));
            assert_eq!(b, Outcome::Processed(()));
        } else {
            assert_eq!(a.unwrap(), Outcome::Processed(()));
            assert!(b.is_duplicate());
        }
        let mut conn = db.connect_async().await;
        assert_eq!(count_markers(&mut conn).await, 1);
        assert_eq!(count_credits(&mut conn, &msg).await, 1);
    }
}

/// The first delivery on a diesel-async connection meets another connection's exclusive
/// lock: the startup check waits with the handler's busy timeout, as the sync one does.
#[tokio::test(flavor = "multi_thread")]
async fn async_first_delivery_on_a_connection_waits_for_a_writers_lock() {
    let db = SqliteDb::new("async_check_waits");
    db.connect()
        .batch_execute("PRAGMA journal_mode = DELETE")
        .unwrap();
    let mut holder = db.connect();
    holder.batch_execute("BEGIN EXCLUSIVE").unwrap();
    let release = tokio::task::spawn_blocking(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        holder.batch_execute("COMMIT").unwrap();
    });
    let mut conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper::new(
        <diesel::SqliteConnection as diesel::Connection>::establish(db.url()).unwrap(),
    );
    let nothing = Hook::default();
    let outcome = credit(&mut conn, &Credit::new(1), &nothing).await;
    release.await.unwrap();
    assert!(outcome.unwrap().is_processed());
    assert_eq!(count_markers(&mut conn).await, 1);
}
