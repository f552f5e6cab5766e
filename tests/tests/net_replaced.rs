//! The net replaced without a word: an application installs the net, then sets a default
//! instrumentation of its own (a query logger, as Vaultwarden does when its query log is
//! on) — every connection opened since has no net, and a helper's write on its own
//! connection committed once per delivery, with no error and no log line. The handler's own
//! connection shows it: its handler is refused before the body runs (`Error::NetMissing`,
//! an alert). `net::install_around(logger)` keeps both. A process of its own: the
//! default instrumentation is global.

use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::connection::{Instrumentation, InstrumentationEvent, SimpleConnection};
use diesel::prelude::*;
use inbox_diesel::tripwire::net;
use inbox_diesel::{Action, Error, idempotent};
use inbox_tests::sqlite::SqliteDb as Db;

static LOGGED: AtomicUsize = AtomicUsize::new(0);

/// The application's query logger.
struct Logger;

impl Instrumentation for Logger {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        if let InstrumentationEvent::StartQuery { .. } = event {
            LOGGED.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The handler's helper writes an audit row on a connection of its own.
#[idempotent(consumer = "audited", key = *id)]
fn audited(conn: &mut SqliteConnection, id: &u64, audit_url: &str) -> Result<(), Error> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")?;
    audit(audit_url)?;
    Ok(())
}

fn audit(url: &str) -> QueryResult<()> {
    SqliteConnection::establish(url)
        .map_err(|e| diesel::result::Error::QueryBuilderError(Box::new(e)))?
        .batch_execute("INSERT INTO audit VALUES ('credited')")
}

fn count(conn: &mut SqliteConnection, sql: &str) -> i64 {
    inbox_tests::count(conn, sql)
}

#[test]
fn a_net_replaced_by_the_applications_own_default_is_refused() {
    net::install().unwrap();
    // The application's pool setup, after `install()`: its query logger as the default.
    diesel::connection::set_default_instrumentation(|| Some(Box::new(Logger))).unwrap();
    let db = Db::new("net_replaced");
    let dir = tempfile::tempdir().unwrap();
    let audit_url = dir.path().join("audit.sqlite").display().to_string();
    SqliteConnection::establish(&audit_url)
        .unwrap()
        .batch_execute("CREATE TABLE audit (what TEXT NOT NULL)")
        .unwrap();

    let mut conn = db.connect();
    let error = audited(&mut conn, &1, &audit_url).unwrap_err();
    assert!(
        matches!(error, Error::NetMissing(ref missing) if missing.consumer == "audited"),
        "{error:?}"
    );
    assert_eq!(error.action(), Action::Alert);
    let text = error.to_string();
    assert!(text.contains("install_around"), "{text}");
    assert_eq!(count(&mut conn, "SELECT count(*) AS n FROM inbox"), 0);
    let mut audits = SqliteConnection::establish(&audit_url).unwrap();
    assert_eq!(
        count(&mut audits, "SELECT count(*) AS n FROM audit"),
        0,
        "nothing ran"
    );

    // Both, as the README says: the logger inside the net.
    net::install_around(|| Some(Box::new(Logger))).unwrap();
    let mut conn = db.connect();
    let before = LOGGED.load(Ordering::SeqCst);
    let stopped = audited(&mut conn, &1, &audit_url).unwrap_err();
    assert!(
        matches!(stopped, Error::WriteOutsideTransaction(_)),
        "{stopped:?}"
    );
    assert!(
        LOGGED.load(Ordering::SeqCst) > before,
        "the logger still sees the queries"
    );
    assert_eq!(count(&mut audits, "SELECT count(*) AS n FROM audit"), 0);
    assert_eq!(count(&mut conn, "SELECT count(*) AS n FROM inbox"), 0);
}
