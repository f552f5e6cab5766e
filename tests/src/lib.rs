//! Fixtures of the database suites: a fresh database per test, the business schema the
//! handlers write to, and what the behaviour files share. The behaviour files
//! (`tests/tests/behaviour/*.rs`) are the tests every backend must pass, written once as
//! plain Rust and included by each backend's suite beside its `Db` and connection type.

use std::fmt;

pub use inbox_diesel::Uuid;

pub mod claim;

/// The windows the job runner of `behaviour/joined.rs` and `joined_async.rs` dies in, in
/// the order a job passes them: job taken, inside the body after its write, as the handler
/// returns its work to the runner's transaction (the kit's `BeforeCommit`), after the
/// effect, after the row's deletion, after the commit.
pub const JOB_WINDOWS: [inbox_diesel::testing::Crash; 6] = {
    use inbox_diesel::testing::Crash;
    [
        Crash::At("job-taken"),
        Crash::At("in-the-body"),
        Crash::BeforeCommit,
        Crash::At("effect-written"),
        Crash::At("job-deleted"),
        Crash::At("committed"),
    ]
};
pub mod sqlite;
pub mod tripwire;
pub mod unique;

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod server;

#[cfg(feature = "postgres")]
pub mod postgres;

#[cfg(feature = "mysql")]
pub mod mysql;

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod private;

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
        let words = source.to_string();
        if !chain.ends_with(&words) {
            chain.push_str(": ");
            chain.push_str(&words);
        }
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

/// Account `id`'s balance, in the suites' business table.
pub fn balance<C: diesel::connection::LoadConnection>(conn: &mut C, id: i32) -> i64
where
    C::Backend: diesel::sql_types::HasSqlType<diesel::sql_types::BigInt> + 'static,
    i64: diesel::deserialize::FromSql<diesel::sql_types::BigInt, C::Backend>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    count(
        conn,
        &format!("SELECT balance AS n FROM accounts WHERE id = {id}"),
    )
}

/// The `n` of a `SELECT count(*) AS n …`.
pub fn count<C: diesel::connection::LoadConnection>(conn: &mut C, sql: &str) -> i64
where
    C::Backend: diesel::sql_types::HasSqlType<diesel::sql_types::BigInt> + 'static,
    i64: diesel::deserialize::FromSql<diesel::sql_types::BigInt, C::Backend>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    use diesel::RunQueryDsl;
    diesel::sql_query(sql).get_result::<Count>(conn).unwrap().n
}
