//! The net under every diesel connection (`tripwire::net`), installed before any connection
//! of this test process is made: writes the compiler cannot see — in a helper's own
//! connection, through a function value, behind a trait object, from a pool without a
//! wrapper — stopped before they reach the server, the handler rolled back; reads allowed;
//! and its limits, shown as they are.

use std::sync::Once;
use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::connection::{Instrumentation, InstrumentationEvent, SimpleConnection};
use diesel::prelude::*;
use diesel::r2d2::ConnectionManager;
use inbox_diesel::tripwire::net::{self, Net};
use inbox_diesel::{Action, Error, idempotent, tripwire};
use inbox_tests::sqlite::SqliteDb as Db;

fn install() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| net::install().unwrap());
}

/// A database of the business, and an audit database of its own (SQLite has one writer
/// per file: a write beside the handler's transaction needs another file).
fn db() -> (Db, Audit) {
    install();
    let db = Db::new("net");
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("audit.sqlite").display().to_string();
    SqliteConnection::establish(&url)
        .unwrap()
        .batch_execute("CREATE TABLE audit (what TEXT NOT NULL)")
        .unwrap();
    (db, Audit { url, _dir: dir })
}

fn count(conn: &mut SqliteConnection, sql: &str) -> i64 {
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query(sql).get_result::<N>(conn).unwrap().n
}

fn balance(db: &Db) -> i64 {
    count(
        &mut db.connect(),
        "SELECT balance AS n FROM accounts WHERE id = 1",
    )
}

fn audits(audit: &Audit) -> i64 {
    audit.seen().unwrap()
}

/// The handler's error: a write stopped by the net.
fn stopped<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match result {
        Err(error @ Error::WriteOutsideTransaction(_)) => {
            assert_eq!(error.action(), Action::Alert);
            error.to_string()
        }
        other => panic!("expected the net to stop a write, got {other:?}"),
    }
}

/// Where the helpers write: their own connection to the same file.
struct Audit {
    url: String,
    _dir: tempfile::TempDir,
}

impl Audit {
    /// A helper's own connection, established inside the handler.
    fn record(&self, what: &str) -> QueryResult<usize> {
        let mut own = SqliteConnection::establish(&self.url).expect("open");
        diesel::sql_query("INSERT INTO audit (what) VALUES (?)")
            .bind::<diesel::sql_types::Text, _>(what)
            .execute(&mut own)
    }

    fn seen(&self) -> QueryResult<i64> {
        let mut own = SqliteConnection::establish(&self.url).expect("open");
        Ok(count(&mut own, "SELECT count(*) AS n FROM audit"))
    }
}

/// The application's own trait, behind which a connection hides.
trait AuditSink {
    fn record(&mut self, what: &str) -> QueryResult<usize>;
}

struct ConnectionSink(SqliteConnection);

impl AuditSink for ConnectionSink {
    fn record(&mut self, what: &str) -> QueryResult<usize> {
        diesel::sql_query("INSERT INTO audit (what) VALUES (?)")
            .bind::<diesel::sql_types::Text, _>(what)
            .execute(&mut self.0)
    }
}

/// How the write out of sight is made.
enum Via<'a> {
    Helper(&'a Audit),
    FunctionValue(fn(&Audit, &str) -> QueryResult<usize>, &'a Audit),
    TraitObject(std::cell::RefCell<&'a mut dyn AuditSink>),
    Pool(&'a Context),
    /// Containers the compile-time guard does not look into.
    Optional(std::cell::RefCell<Option<&'a mut SqliteConnection>>),
    Shared(std::sync::Arc<std::sync::Mutex<SqliteConnection>>),
    Checkouts(std::cell::RefCell<Vec<Checkout>>),
    /// A helper that catches the stop's unwind and goes on as if its write had failed.
    Swallowed(&'a Audit),
    /// A batch whose first statement reads and whose second writes.
    Batch(&'a Audit),
    /// Another connection put in the transaction's place by a helper, written to through
    /// the handler's own `conn`, and put back.
    Swapped(std::cell::RefCell<SqliteConnection>),
    Read(&'a Audit),
    Allowed(&'a Audit),
}

/// What a service hands its handlers: a pool without a wrapper among other things.
struct Context {
    pool: diesel::r2d2::Pool<ConnectionManager<SqliteConnection>>,
}

type Checkout = diesel::r2d2::PooledConnection<ConnectionManager<SqliteConnection>>;

/// A best-effort audit: writes when it was given a connection.
fn best_effort(audit: Option<&mut SqliteConnection>) -> QueryResult<usize> {
    match audit {
        Some(conn) => {
            diesel::sql_query("INSERT INTO audit (what) VALUES ('optional')").execute(conn)
        }
        None => Ok(0),
    }
}

/// A helper that locks a shared connection.
fn locked(shared: &std::sync::Mutex<SqliteConnection>) -> QueryResult<usize> {
    let mut conn = shared.lock().unwrap();
    diesel::sql_query("INSERT INTO audit (what) VALUES ('shared')").execute(&mut *conn)
}

/// A helper given several checkouts.
fn to_each(checkouts: &mut [Checkout]) -> QueryResult<usize> {
    let mut written = 0;
    for conn in checkouts {
        written += diesel::sql_query("INSERT INTO audit (what) VALUES ('each')").execute(conn)?;
    }
    Ok(written)
}

/// A helper that guards against panics in what it calls, and logs and goes on.
fn best_effort_audit(audit: &Audit) {
    let caught =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| audit.record("swallowed")));
    assert!(caught.is_err(), "the write was stopped");
}

/// A helper that sends a batch of statements on its own connection.
fn audit_batch(audit: &Audit) -> QueryResult<()> {
    SqliteConnection::establish(&audit.url)
        .expect("open")
        .batch_execute("BEGIN; INSERT INTO audit (what) VALUES ('batch'); COMMIT;")
}

/// A helper that trades the connection it is given for a spare one (a "failover").
fn trade(conn: &mut SqliteConnection, spare: &std::cell::RefCell<SqliteConnection>) {
    std::mem::swap(conn, &mut spare.borrow_mut());
}

/// A helper that checks a connection out of the context's pool.
fn from_the_pool(context: &Context) -> QueryResult<usize> {
    let mut checkout = context.pool.get().expect("checkout");
    diesel::sql_query("INSERT INTO audit (what) VALUES ('pool')").execute(&mut checkout)
}

#[idempotent(consumer = "credit", key = *id)]
fn credit(conn: &mut SqliteConnection, id: &u64, via: &Via<'_>) -> Result<(), Error> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    match via {
        Via::Helper(audit) => audit.record("helper").map(drop)?,
        Via::FunctionValue(write, audit) => write(audit, "function value").map(drop)?,
        Via::TraitObject(sink) => sink.borrow_mut().record("trait object").map(drop)?,
        Via::Pool(pool) => from_the_pool(pool).map(drop)?,
        Via::Optional(audit) => best_effort(audit.borrow_mut().as_deref_mut()).map(drop)?,
        Via::Shared(shared) => locked(shared).map(drop)?,
        Via::Checkouts(checkouts) => to_each(&mut checkouts.borrow_mut()).map(drop)?,
        Via::Swallowed(audit) => best_effort_audit(audit),
        Via::Batch(audit) => audit_batch(audit)?,
        Via::Swapped(spare) => {
            trade(conn, spare);
            let written =
                diesel::sql_query("INSERT INTO audit (what) VALUES ('swapped')").execute(conn);
            trade(conn, spare);
            written.map(drop)?
        }
        Via::Read(audit) => assert_eq!(audit.seen()?, 0),
        Via::Allowed(audit) => {
            tripwire::allow_outside_transaction("the audit trail records attempts", || {
                audit.record("allowed")
            })
            .map(drop)?
        }
    }
    Ok(())
}

#[test]
fn writes_out_of_the_compilers_sight_are_stopped_and_rolled_back() {
    let (db, audit) = db();
    let mut sink = ConnectionSink(SqliteConnection::establish(&audit.url).unwrap());
    let context = Context {
        pool: diesel::r2d2::Pool::builder()
            .max_size(1)
            .build(ConnectionManager::<SqliteConnection>::new(&audit.url))
            .unwrap(),
    };
    let mut conn = db.connect();
    let mut optional = SqliteConnection::establish(&audit.url).unwrap();
    let pool = diesel::r2d2::Pool::builder()
        .max_size(2)
        .build(ConnectionManager::<SqliteConnection>::new(&audit.url))
        .unwrap();
    let checkouts = vec![pool.get().unwrap(), pool.get().unwrap()];
    let cases = [
        Via::Helper(&audit),
        Via::FunctionValue(Audit::record, &audit),
        Via::TraitObject(std::cell::RefCell::new(&mut sink)),
        Via::Pool(&context),
        Via::Optional(std::cell::RefCell::new(Some(&mut optional))),
        Via::Shared(std::sync::Arc::new(std::sync::Mutex::new(
            SqliteConnection::establish(&audit.url).unwrap(),
        ))),
        Via::Checkouts(std::cell::RefCell::new(checkouts)),
        Via::Swallowed(&audit),
        Via::Batch(&audit),
    ];
    for (id, via) in (1..).zip(&cases) {
        let text = stopped(credit(&mut conn, &id, via));
        assert!(
            text.contains("`credit`") && text.contains("INSERT INTO audit"),
            "{text}"
        );
    }
    assert_eq!(audits(&audit), 0, "a write reached the server");
    assert_eq!(balance(&db), 0, "a stopped handler's work committed");
    // The stopped deliveries were not recorded: each applies on its redelivery.
    assert!(
        credit(&mut conn, &1, &Via::Read(&audit))
            .unwrap()
            .is_processed()
    );
    assert_eq!(balance(&db), 1);
}

/// Another connection put in the transaction's place (through a container the compiler does
/// not look into) and written to through the handler's own `conn`: stopped. The stop unwinds
/// past the helper's swap back, so `conn` is left holding the spare connection, and the
/// handler's connection — still in its transaction — is in the spare's cell: dropped with it,
/// it rolls back.
#[test]
fn a_connection_swapped_into_the_transactions_place_is_stopped() {
    let (db, audit) = db();
    let mut conn = db.connect();
    let spare = std::cell::RefCell::new(SqliteConnection::establish(&audit.url).unwrap());
    let text = stopped(credit(&mut conn, &1, &Via::Swapped(spare)));
    assert!(text.contains("INSERT INTO audit"), "{text}");
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM audit"),
        0,
        "`conn` is the spare now, and the write did not reach it"
    );
    assert_eq!(audits(&audit), 0, "a write reached the server");
    assert_eq!(balance(&db), 0, "a stopped handler's work committed");
    assert!(
        credit(&mut db.connect(), &1, &Via::Read(&audit))
            .unwrap()
            .is_processed()
    );
    assert_eq!(balance(&db), 1);
}

#[test]
fn reads_elsewhere_and_allowed_writes_go_through() {
    let (db, audit) = db();
    let mut conn = db.connect();
    assert!(
        credit(&mut conn, &1, &Via::Read(&audit))
            .unwrap()
            .is_processed()
    );
    assert!(
        credit(&mut conn, &2, &Via::Allowed(&audit))
            .unwrap()
            .is_processed()
    );
    assert_eq!(audits(&audit), 1);
    assert_eq!(balance(&db), 2);
    // Outside any handler, nothing is stopped.
    audit.record("outside").unwrap();
    assert_eq!(audits(&audit), 2);
}

/// An instrumentation of the application's own, kept by `Net::around`.
struct Counting(&'static AtomicUsize);

impl Instrumentation for Counting {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        if let InstrumentationEvent::StartQuery { .. } = event {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A connection whose instrumentation the application set itself has no net; with
/// `Net::around` it keeps both.
#[test]
fn an_instrumentation_of_ones_own_keeps_the_net_with_net_around() {
    static QUERIES: AtomicUsize = AtomicUsize::new(0);
    let (db, audit) = db();
    let mut own = SqliteConnection::establish(&audit.url).unwrap();
    own.set_instrumentation(Counting(&QUERIES));
    let mut conn = db.connect();
    let mut sink = ConnectionSink(own);
    let escaped = credit(
        &mut conn,
        &1,
        &Via::TraitObject(std::cell::RefCell::new(&mut sink)),
    );
    assert!(escaped.unwrap().is_processed(), "replaced: no net");
    assert_eq!(audits(&audit), 1);

    let mut own = SqliteConnection::establish(&audit.url).unwrap();
    own.set_instrumentation(Net::around(Counting(&QUERIES)));
    let before = QUERIES.load(Ordering::SeqCst);
    let mut sink = ConnectionSink(own);
    stopped(credit(
        &mut conn,
        &2,
        &Via::TraitObject(std::cell::RefCell::new(&mut sink)),
    ));
    assert_eq!(audits(&audit), 1);
    sink.record("outside").unwrap();
    assert!(
        QUERIES.load(Ordering::SeqCst) > before,
        "the inner instrumentation saw nothing"
    );
}

/// Claim mode: the body has no connection, and a write on any other one is stopped; the
/// claim is released, so that the redelivery runs the body again.
#[test]
fn a_claim_mode_bodys_write_is_stopped_and_its_claim_released() {
    #[idempotent(consumer = "mail", key = *id, mode = "claim")]
    fn mail(
        conn: &mut SqliteConnection,
        id: &u64,
        audit: &Audit,
        sent: &AtomicUsize,
    ) -> Result<(), Error> {
        if sent.fetch_add(1, Ordering::SeqCst) == 0 {
            audit.record("mail")?;
        }
        Ok(())
    }
    let (db, audit) = db();
    let sent = AtomicUsize::new(0);
    let mut conn = db.connect();
    stopped(mail(&mut conn, &1, &audit, &sent));
    assert_eq!(audits(&audit), 0);
    assert!(mail(&mut conn, &1, &audit, &sent).unwrap().is_processed());
    assert_eq!(sent.load(Ordering::SeqCst), 2);
}

/// A write handed to another thread leaves the mark behind: not seen (a limit the module
/// documents).
#[test]
fn a_write_on_another_thread_is_not_seen() {
    #[idempotent(consumer = "credit", key = *id)]
    fn credit_threaded(conn: &mut SqliteConnection, id: &u64, audit: &Audit) -> Result<(), Error> {
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)?;
        std::thread::scope(|scope| scope.spawn(|| audit.record("thread")).join().unwrap())?;
        Ok(())
    }
    let (db, audit) = db();
    assert!(
        credit_threaded(&mut db.connect(), &1, &audit)
            .unwrap()
            .is_processed()
    );
    assert_eq!(audits(&audit), 1);
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::{Error, idempotent, install, stopped};
    use diesel::QueryResult;
    use diesel_async::RunQueryDsl as _;
    use inbox_tests::postgres::PgDb;

    type Pool = deadpool::managed::Pool<
        diesel_async::pooled_connection::AsyncDieselConnectionManager<
            diesel_async::AsyncPgConnection,
        >,
    >;

    /// What a service hands its handlers: a pool without a wrapper.
    struct Context {
        pool: Pool,
    }

    #[idempotent(consumer = "credit-async", key = *id)]
    async fn credit_async(
        conn: &mut diesel_async::AsyncPgConnection,
        id: &u64,
        context: &Context,
        write: bool,
    ) -> Result<(), Error> {
        diesel_async::RunQueryDsl::execute(
            diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1"),
            conn,
        )
        .await?;
        from_the_pool(context, write).await?;
        Ok(())
    }

    /// A helper that checks a connection out of a pool without a wrapper.
    async fn from_the_pool(context: &Context, write: bool) -> QueryResult<usize> {
        let mut other = context.pool.get().await.expect("checkout");
        let sql = if write {
            "INSERT INTO users (email) VALUES ('pool@example.com')"
        } else {
            "SELECT 1"
        };
        diesel::sql_query(sql).execute(&mut other).await
    }

    /// An `async fn` handler, a deadpool pool without a wrapper: the checkout's write is
    /// stopped and the handler rolled back; its reads go through.
    #[tokio::test]
    async fn an_async_handlers_write_on_an_unguarded_pool_is_stopped() {
        install();
        let db = PgDb::new("net_async");
        let manager = diesel_async::pooled_connection::AsyncDieselConnectionManager::new(db.url());
        let context = Context {
            pool: deadpool::managed::Pool::builder(manager)
                .max_size(2)
                .build()
                .unwrap(),
        };
        let mut conn = db.connect_async().await;
        stopped(credit_async(&mut conn, &1, &context, true).await);
        let mut check = db.connect();
        let users = inbox_tests::server::count(&mut check, "SELECT count(*) AS n FROM users");
        assert_eq!(users, 0);
        let balance = inbox_tests::server::count(
            &mut check,
            "SELECT balance::int8 AS n FROM accounts WHERE id = 1",
        );
        assert_eq!(balance, 0);
        assert!(
            credit_async(&mut conn, &2, &context, false)
                .await
                .unwrap()
                .is_processed()
        );
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::{Error, idempotent, install, stopped};
    use diesel::prelude::*;
    use inbox_tests::mysql::MysqlDb;
    use inbox_tests::server::count;

    /// A helper with its own connection to the server, established inside the handler.
    fn record(url: &str, email: &str) -> QueryResult<usize> {
        let mut own = MysqlConnection::establish(url).expect("connect");
        diesel::sql_query("INSERT INTO users (email) VALUES (?)")
            .bind::<diesel::sql_types::Text, _>(email)
            .execute(&mut own)
    }

    #[idempotent(consumer = "credit-mysql", key = *id)]
    fn credit(conn: &mut MysqlConnection, id: &u64, url: &str, write: bool) -> Result<(), Error> {
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)?;
        if write {
            record(url, "helper@example.com")?;
        }
        Ok(())
    }

    #[idempotent(consumer = "credit-mysql-async", key = *id)]
    async fn credit_async(
        conn: &mut diesel_async::AsyncMysqlConnection,
        id: &u64,
        url: &str,
    ) -> Result<(), Error> {
        diesel_async::RunQueryDsl::execute(
            diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1"),
            conn,
        )
        .await?;
        record_async(url).await?;
        Ok(())
    }

    /// The async helper, with a connection of its own.
    async fn record_async(url: &str) -> QueryResult<usize> {
        let mut own =
            <diesel_async::AsyncMysqlConnection as diesel_async::AsyncConnection>::establish(url)
                .await
                .expect("connect");
        diesel_async::RunQueryDsl::execute(
            diesel::sql_query("INSERT INTO users (email) VALUES ('async@example.com')"),
            &mut own,
        )
        .await
    }

    fn rows(db: &MysqlDb) -> (i64, i64) {
        let mut check = db.connect();
        (
            count(&mut check, "SELECT count(*) AS n FROM users"),
            count(
                &mut check,
                "SELECT CAST(balance AS SIGNED) AS n FROM accounts WHERE id = 1",
            ),
        )
    }

    /// MySQL and MariaDB, sync: a helper's own connection writes inside the handler; the net
    /// stops the write before the server sees it and the handler rolls back. Without the
    /// write, the redelivery applies.
    #[test]
    fn a_helpers_write_on_its_own_mysql_connection_is_stopped() {
        install();
        let db = MysqlDb::new("net_mysql");
        let mut conn = db.connect();
        let text = stopped(credit(&mut conn, &1, db.url(), true));
        assert!(
            text.contains("`credit-mysql`") && text.contains("INSERT INTO users"),
            "{text}"
        );
        assert_eq!(rows(&db), (0, 0), "a stopped handler's work committed");
        assert!(
            credit(&mut conn, &1, db.url(), false)
                .unwrap()
                .is_processed()
        );
        assert_eq!(rows(&db), (0, 1));
    }

    /// The same from an `async fn` handler on diesel-async's MySQL connection.
    #[tokio::test]
    async fn an_async_handlers_write_on_its_own_mysql_connection_is_stopped() {
        install();
        let db = MysqlDb::new("net_mysql_async");
        let mut conn = db.connect_async().await;
        stopped(credit_async(&mut conn, &1, db.url()).await);
        assert_eq!(rows(&db), (0, 0), "a stopped handler's work committed");
    }
}

/// diesel-async's `SyncConnectionWrapper` runs its statements on a blocking thread: with the
/// net's `Blocking` as the spawner of the application's other wrapped connections, the mark
/// goes there, and a write on one of them is stopped and the handler rolled back.
mod blocking {
    use super::{Audit, Error, balance, db, idempotent, stopped};
    use diesel::SqliteConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use diesel_async::{AsyncConnection, RunQueryDsl};
    use inbox_diesel::tripwire::net::Blocking;

    type Conn = SyncConnectionWrapper<SqliteConnection>;
    type Other = SyncConnectionWrapper<SqliteConnection, Blocking>;

    /// A helper with a wrapped connection of its own.
    async fn record(url: &str, write: bool) -> diesel::QueryResult<usize> {
        let mut own = Other::establish(url).await.expect("open");
        let sql = match write {
            true => "INSERT INTO audit (what) VALUES ('blocking')",
            false => "SELECT 1",
        };
        diesel::sql_query(sql).execute(&mut own).await
    }

    #[idempotent(consumer = "credit-blocking", key = *id)]
    async fn credit(conn: &mut Conn, id: &u64, audit: &Audit, write: bool) -> Result<(), Error> {
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)
            .await?;
        record(&audit.url, write).await?;
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_on_another_wrapped_connection_is_stopped() {
        let (db, audit) = db();
        let mut conn = Conn::establish(db.url()).await.unwrap();
        let text = stopped(credit(&mut conn, &1, &audit, true).await);
        assert!(text.contains("INSERT INTO audit"), "{text}");
        assert_eq!(super::audits(&audit), 0, "a write reached the server");
        assert_eq!(balance(&db), 0, "a stopped handler's work committed");
        assert!(
            credit(&mut conn, &1, &audit, false)
                .await
                .unwrap()
                .is_processed()
        );
        assert_eq!(balance(&db), 1);
    }
}
