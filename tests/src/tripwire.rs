//! Fixtures of the tripwire suites: an audit database of its own for the helpers that check
//! a connection out of a pool, an error type that tells a refusal from the rest, and a log
//! capture for the hooks that only report.

use std::fmt;
use std::sync::{Arc, Mutex};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::tripwire::{CheckoutError, InsideHandler};

diesel::table! {
    /// What the helpers write, one row per call that reached the database.
    audit (id) {
        id -> Integer,
        message -> Text,
    }
}

/// The database a helper's pool connects to. A file of its own, so that what the helper
/// writes commits or not independently of the handler's transaction, as a write on another
/// connection to the handler's database would on a server — and SQLite's database lock,
/// held by the handler's transaction, plays no part.
pub struct AuditDb {
    _dir: tempfile::TempDir,
    url: String,
}

impl AuditDb {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = dir.path().join("audit.sqlite").display().to_string();
        let db = Self { _dir: dir, url };
        db.connect()
            .batch_execute(
                "PRAGMA journal_mode = WAL;
                 CREATE TABLE audit (id INTEGER PRIMARY KEY, message TEXT NOT NULL);",
            )
            .unwrap();
        db
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn connect(&self) -> SqliteConnection {
        SqliteConnection::establish(&self.url).expect("open the audit database")
    }

    /// The rows committed to `audit`, read on a connection of its own.
    pub fn rows(&self) -> i64 {
        audit::table
            .count()
            .get_result(&mut self.connect())
            .unwrap()
    }
}

impl Default for AuditDb {
    fn default() -> Self {
        Self::new()
    }
}

/// The rows committed to `table` of the handler's database, read on a connection of its own.
pub fn rows(conn: &mut SqliteConnection, table: &str) -> i64 {
    diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!(
        "(SELECT COUNT(*) FROM {table})"
    )))
    .get_result(conn)
    .unwrap()
}

/// The error of the handlers under test.
#[derive(Debug)]
pub enum TripError {
    /// A guarded pool refused the checkout.
    Refused(InsideHandler),
    /// A pool's own error.
    Pool(String),
    Db(diesel::result::Error),
    Inbox(inbox_diesel::Error),
    /// The body's own failure, after its writes.
    Failed,
}

impl fmt::Display for TripError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for TripError {}

impl<E: fmt::Display> From<CheckoutError<E>> for TripError {
    fn from(e: CheckoutError<E>) -> Self {
        match e {
            CheckoutError::InsideHandler(inside) => TripError::Refused(inside),
            CheckoutError::Failed(e) => TripError::Pool(e.to_string()),
        }
    }
}

impl From<diesel::r2d2::PoolError> for TripError {
    fn from(e: diesel::r2d2::PoolError) -> Self {
        TripError::Pool(e.to_string())
    }
}

impl From<diesel_async::pooled_connection::deadpool::PoolError> for TripError {
    fn from(e: diesel_async::pooled_connection::deadpool::PoolError) -> Self {
        TripError::Pool(e.to_string())
    }
}

impl From<diesel_async::pooled_connection::bb8::RunError> for TripError {
    fn from(e: diesel_async::pooled_connection::bb8::RunError) -> Self {
        TripError::Pool(e.to_string())
    }
}

impl From<diesel::result::Error> for TripError {
    fn from(e: diesel::result::Error) -> Self {
        TripError::Db(e)
    }
}

impl From<inbox_diesel::Error> for TripError {
    fn from(e: inbox_diesel::Error) -> Self {
        TripError::Inbox(e)
    }
}

/// What a hook logged at error level on this thread, from [`Logged::capture`] until it is
/// dropped: one line per event, its level, its fields and its message.
///
/// One global subscriber writes each event into the capture of the thread that emitted it:
/// a subscriber set per thread (`set_default`) loses events when tests run in parallel,
/// because tracing caches each call site's interest across threads. Written here rather than
/// taken from `tracing-subscriber`, whose types would change how rustc names types in the
/// UI tests' expected errors.
pub struct Logged(Arc<Mutex<String>>);

thread_local! {
    static CAPTURE: std::cell::RefCell<Option<Arc<Mutex<String>>>> =
        const { std::cell::RefCell::new(None) };
}

impl Logged {
    pub fn capture() -> Logged {
        static INSTALL: std::sync::Once = std::sync::Once::new();
        INSTALL.call_once(|| {
            tracing::subscriber::set_global_default(ThreadCapture)
                .expect("no other global subscriber in the tripwire tests");
        });
        let buffer = Arc::new(Mutex::new(String::new()));
        CAPTURE.with(|capture| *capture.borrow_mut() = Some(buffer.clone()));
        Logged(buffer)
    }

    pub fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        CAPTURE.with(|capture| capture.borrow_mut().take());
    }
}

/// Writes each error event into the capture of the current thread, if it has one.
struct ThreadCapture;

impl tracing::Subscriber for ThreadCapture {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() == tracing::Level::ERROR
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::ERROR)
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = format!("{} ", event.metadata().level());
        event.record(&mut Fields(&mut line));
        line.push('\n');
        CAPTURE.with(|capture| {
            if let Some(buffer) = &*capture.borrow() {
                buffer.lock().unwrap().push_str(&line);
            }
        });
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// An event's fields as `name="value"` (strings) or `name=value`, the message last.
struct Fields<'l>(&'l mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

/// The message of a panic caught by `catch_unwind` or a `JoinError`.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}
