//! Get-or-create on a business unique key, without the race.
//!
//! "Is this e-mail taken? No — insert it" is two statements with a gap between them. Two
//! requests at once both see nothing, both insert, and the unique index rejects the second
//! with a unique violation (PostgreSQL `23505`, MySQL `1062`, SQLite `2067`) that only shows
//! under load. A transaction around the two does not close the gap: it gives atomicity, not
//! mutual exclusion, and under READ COMMITTED nothing stops another session inserting between
//! the check and the insert. The unique index is not the bug — it is the one thing that
//! caught it. This module builds on it, the way `#[idempotent]` builds on the inbox's index:
//!
//! | need | reach for | statements | backends |
//! |---|---|---|---|
//! | the row's id, new or existing | [`upsert`] | one: `INSERT … ON CONFLICT (key) DO UPDATE … RETURNING id` | all (MySQL: `ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id)`, then `SELECT LAST_INSERT_ID()`) |
//! | insert unless present, no row back | [`insert_if_absent`] | one: `… ON CONFLICT (key) DO NOTHING` | all (MySQL: the plain insert, its `1062` on this key caught) |
//! | the row, new or existing, and which; the insert deep in a larger transaction | [`insert_or_get`] | the insert in a transaction of its own (a savepoint inside the caller's), on *this* key's violation the winner's row re-read | all |
//! | a batch of rows, some repeated | [`collapse`], then [`upsert_all`] | one: the multi-row form of [`upsert`] | PostgreSQL (elsewhere: [`collapse`], then one of the above per row, in one transaction) |
//! | several statements that must run once per key ("create tenant, then its settings") | [`serialize_on`] | a lock on a hash of the key, held to commit | PostgreSQL (`pg_advisory_xact_lock`), MySQL (`GET_LOCK`), SQLite (the write lock) |
//!
//! Every one of them recognises the race by the violation of *this* [`UniqueKey`] — by its
//! name, or on SQLite, which names no index, by its table and columns — and lets every other
//! violation surface with the name the server gave it ([`UniqueError::OtherViolation`]): a
//! primary-key violation from a sequence that fell behind the data, or another unique index,
//! is a bug or a business rule, never "someone else created it first".
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use diesel::connection::SimpleConnection;
//! use diesel::prelude::*;
//! use inbox_diesel::unique::{self, Created, UniqueKey};
//!
//! diesel::table! {
//!     users (id) {
//!         id -> BigInt,
//!         email -> Text,
//!         name -> Text,
//!     }
//! }
//!
//! /// `CREATE UNIQUE INDEX ux_users_email ON users (email)`.
//! const USERS_EMAIL: UniqueKey = UniqueKey::new("users", "ux_users_email", &["email"]);
//!
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! conn.batch_execute(
//!     "CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT NOT NULL, name TEXT NOT NULL);
//!      CREATE UNIQUE INDEX ux_users_email ON users (email);",
//! )?;
//!
//! let register = |conn: &mut SqliteConnection, email: &str, name: &str| {
//!     unique::insert_or_get(
//!         conn,
//!         &USERS_EMAIL,
//!         |c| {
//!             diesel::insert_into(users::table)
//!                 .values((users::email.eq(email), users::name.eq(name)))
//!                 .execute(c)?;
//!             users::table.filter(users::email.eq(email)).select(users::id).first::<i64>(c)
//!         },
//!         |c| users::table.filter(users::email.eq(email)).select(users::id).first(c),
//!     )
//! };
//! let ada = register(&mut conn, "ada@example.com", "Ada")?;
//! let again = register(&mut conn, "ada@example.com", "Ada L.")?;
//! assert!(ada.is_new() && !again.is_new());
//! assert_eq!(ada.into_inner(), again.into_inner());
//!
//! // The one-statement form: the id, whichever request created the row.
//! let id = unique::upsert(
//!     &mut conn,
//!     &USERS_EMAIL,
//!     diesel::insert_into(users::table)
//!         .values((users::email.eq("ada@example.com"), users::name.eq("Ada"))),
//!     users::id,
//! )?;
//! assert_eq!(Some(id), again.existing().copied());
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! What none of them does: retry the caller's transaction. Inside an open transaction a
//! deadlock, a serialization failure or a winner the transaction's snapshot cannot see
//! ([`UniqueError::WinnerNotFound`] under REPEATABLE READ or SERIALIZABLE) is returned, since
//! only the whole transaction can run again; outside one, [`insert_or_get`], [`upsert`],
//! [`upsert_all`] and [`insert_if_absent`] retry such failures themselves
//! ([`UniqueKey::RETRIES`] times). [`serialize_on`] runs its body once and returns what it
//! returns. On SQLite, give every connection a busy timeout (`PRAGMA busy_timeout`), as for
//! any concurrent writer: without one a writer that finds the database locked fails at once.

use std::fmt;

use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::result::Error as DieselError;
use diesel::sql_types::BigInt;
use diesel::sql_types::Nullable;
use diesel::{Column, QueryResult};
use inbox_core::RetryPolicy;

use crate::dialect::Dialect;
use crate::dialect::Sql;
use crate::io::{Blocking, Io, Transactions, complete_now};
use crate::runtime::steps::Body;
use crate::runtime::sync::Immediate;
use crate::schema::Backend;

/// A unique index of a business table, as the race is recognised by: the index's name, its
/// table and its columns, and the predicate of a partial index.
///
/// Declare one per index, next to the `table!` it belongs to:
///
/// ```
/// use inbox_diesel::unique::UniqueKey;
///
/// /// CREATE UNIQUE INDEX ux_users_email ON users (email) WHERE deleted_at IS NULL
/// const LIVE_USERS_EMAIL: UniqueKey =
///     UniqueKey::new("users", "ux_users_email", &["email"]).partial("deleted_at IS NULL");
/// ```
///
/// The name must be the one the server reports: the index's name on PostgreSQL (a
/// `UNIQUE` constraint's index has the constraint's name; an unnamed one is
/// `<table>_<columns>_key`), the key's name on MySQL and MariaDB (`PRIMARY` for the
/// primary key). SQLite reports no name: there the table and the columns, in index order,
/// identify it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UniqueKey {
    table: &'static str,
    name: &'static str,
    columns: &'static [&'static str],
    predicate: Option<&'static str>,
}

impl UniqueKey {
    /// Retries outside a transaction, after a transient failure or a winner that vanished.
    pub const RETRIES: u32 = RetryPolicy::DEFAULT_RETRIES;

    /// The unique index `name` on `table` (unqualified) over `columns`, in index order.
    ///
    /// # Panics
    /// When `columns` is empty — at compile time in a `const`.
    pub const fn new(
        table: &'static str,
        name: &'static str,
        columns: &'static [&'static str],
    ) -> Self {
        assert!(!columns.is_empty(), "a unique key has at least one column");
        UniqueKey {
            table,
            name,
            columns,
            predicate: None,
        }
    }

    /// A partial unique index: `predicate` is its `WHERE` clause, as SQL, exactly as the index
    /// was created with. [`upsert`] and [`insert_if_absent`] repeat it in their conflict
    /// target; without it PostgreSQL and SQLite cannot match the target to the index and
    /// refuse the statement ("there is no unique or exclusion constraint matching the ON
    /// CONFLICT specification" / "ON CONFLICT clause does not match any PRIMARY KEY or UNIQUE
    /// constraint"). MySQL has no partial indexes.
    pub const fn partial(self, predicate: &'static str) -> Self {
        UniqueKey {
            predicate: Some(predicate),
            ..self
        }
    }

    /// The table.
    pub fn table(&self) -> &'static str {
        self.table
    }

    /// The index's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The indexed columns.
    pub fn columns(&self) -> &'static [&'static str] {
        self.columns
    }

    /// Whether `error` is a violation of this index — and not of any other.
    ///
    /// ```
    /// use diesel::result::{DatabaseErrorKind, Error};
    /// use inbox_diesel::unique::UniqueKey;
    ///
    /// const USERS_EMAIL: UniqueKey = UniqueKey::new("users", "ux_users_email", &["email"]);
    /// let sqlite = |message: &str| {
    ///     Error::DatabaseError(DatabaseErrorKind::UniqueViolation, Box::new(message.to_owned()))
    /// };
    /// assert!(USERS_EMAIL.is_violated_by(&sqlite("UNIQUE constraint failed: users.email")));
    /// assert!(!USERS_EMAIL.is_violated_by(&sqlite("UNIQUE constraint failed: users.id")));
    /// ```
    pub fn is_violated_by(&self, error: &DieselError) -> bool {
        crate::classify::with_server_error(error, |server| {
            server
                .violated_index()
                .is_some_and(|index| index.is(self.table, self.name, self.columns))
        })
        .unwrap_or(false)
    }
}

impl fmt::Display for UniqueKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` on {} ({})",
            self.name,
            self.table,
            self.columns.join(", ")
        )
    }
}

/// What [`insert_or_get`] found: the row it inserted, or the one another caller had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Created<T> {
    /// This call inserted the row.
    New(T),
    /// The row existed (or a concurrent caller won the race): the winner's row, re-read.
    Existing(T),
}

impl<T> Created<T> {
    /// Whether this call inserted the row.
    pub fn is_new(&self) -> bool {
        matches!(self, Created::New(_))
    }

    /// The row, new or existing.
    pub fn into_inner(self) -> T {
        match self {
            Created::New(value) | Created::Existing(value) => value,
        }
    }

    /// The row when it existed before this call.
    pub fn existing(&self) -> Option<&T> {
        match self {
            Created::Existing(value) => Some(value),
            Created::New(_) => None,
        }
    }

    /// The row, by reference.
    pub fn as_ref(&self) -> Created<&T> {
        match self {
            Created::New(value) => Created::New(value),
            Created::Existing(value) => Created::Existing(value),
        }
    }
}

/// Why a get-or-create failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum UniqueError {
    /// A unique index other than the key was violated — a primary key whose sequence fell
    /// behind the data, another business rule. Never the race this module resolves.
    OtherViolation {
        /// The index as the server named it (`users_pkey`, `PRIMARY`, `users.id`), when it did.
        constraint: Option<String>,
        /// The error itself.
        source: DieselError,
    },
    /// The key was violated, but the row that won could not be read back: deleted since, or
    /// committed after this transaction's snapshot was taken (REPEATABLE READ, SERIALIZABLE,
    /// MySQL's default REPEATABLE READ after an earlier plain read — there, re-read with
    /// `.for_update()`). Inside a transaction, run the transaction again.
    WinnerNotFound {
        /// The key.
        key: UniqueKey,
    },
    /// [`serialize_on`] on MySQL was not granted the lock: `GET_LOCK` waited
    /// `innodb_lock_wait_timeout` seconds, or failed (it answers NULL on an error).
    LockTimeout {
        /// The key the lock was taken on.
        key: String,
    },
    /// The backend cannot do what was asked (MySQL has no `RETURNING` for [`upsert_all`]).
    Unsupported {
        /// What, and what to use instead.
        what: &'static str,
    },
    /// Any other database error.
    Database(DieselError),
}

impl UniqueError {
    /// The underlying diesel error, where there is one.
    pub fn database_error(&self) -> Option<&DieselError> {
        match self {
            UniqueError::OtherViolation { source, .. } => Some(source),
            UniqueError::Database(error) => Some(error),
            _ => None,
        }
    }

    /// What the error means to a retry: transient failures (deadlocks, serialization
    /// failures, SQLite's busy database), and a winner not yet visible, are worth running the
    /// caller's transaction again.
    pub fn is_transient(&self) -> bool {
        match self {
            UniqueError::WinnerNotFound { .. } | UniqueError::LockTimeout { .. } => true,
            UniqueError::Database(error) => {
                crate::classify(error, &inbox_core::InboxSchema::DEFAULT).is_transient()
            }
            UniqueError::OtherViolation { .. } | UniqueError::Unsupported { .. } => false,
        }
    }

    /// Sorts a diesel error from an insert on `key`: the key's violation is `None` (the race,
    /// for the caller to resolve), another violation keeps its name.
    fn sort(error: DieselError, key: &UniqueKey) -> Option<UniqueError> {
        let violated = crate::classify::with_server_error(&error, |server| {
            let index = server.violated_index()?;
            Some((
                index.is(key.table, key.name, key.columns),
                index.to_string(),
            ))
        })
        .flatten();
        match violated {
            Some((true, _)) => None,
            Some((false, name)) => Some(UniqueError::OtherViolation {
                constraint: Some(name),
                source: error,
            }),
            None if matches!(
                error,
                DieselError::DatabaseError(diesel::result::DatabaseErrorKind::UniqueViolation, _)
            ) =>
            {
                Some(UniqueError::OtherViolation {
                    constraint: None,
                    source: error,
                })
            }
            None => Some(UniqueError::Database(error)),
        }
    }
}

impl fmt::Display for UniqueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The server's message stays in `source()`: MariaDB's quotes the row's values.
            UniqueError::OtherViolation {
                constraint: Some(name),
                ..
            } => write!(f, "unique violation of `{name}`, not of the key"),
            UniqueError::OtherViolation {
                constraint: None, ..
            } => f.write_str("unique violation of another index than the key"),
            UniqueError::WinnerNotFound { key } => write!(
                f,
                "the row that won the unique key {key} cannot be read back: deleted since, or \
                 invisible to this transaction's snapshot; run the transaction again"
            ),
            // The key's value is business data (an e-mail address): in the field, not here.
            UniqueError::LockTimeout { .. } => {
                f.write_str("timed out waiting for the lock on the key")
            }
            UniqueError::Unsupported { what } => f.write_str(what),
            UniqueError::Database(_) => f.write_str("a database error in get-or-create"),
        }
    }
}

impl std::error::Error for UniqueError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.database_error().map(|e| e as _)
    }
}

impl From<DieselError> for UniqueError {
    fn from(error: DieselError) -> Self {
        UniqueError::Database(error)
    }
}

/// Keeps the first of the rows that share a key, in their order: what a batch insert on a
/// unique key needs first, since PostgreSQL refuses to let one `INSERT … ON CONFLICT DO
/// UPDATE` touch the same row twice ("ON CONFLICT DO UPDATE command cannot affect row a second
/// time", a cardinality violation) and a plain multi-row insert fails on its own repeats.
///
/// ```
/// use inbox_diesel::unique::collapse;
///
/// let signups = vec![("ada@example.com", 1), ("bob@example.com", 2), ("ada@example.com", 3)];
/// assert_eq!(
///     collapse(signups, |s| s.0),
///     vec![("ada@example.com", 1), ("bob@example.com", 2)]
/// );
/// ```
pub fn collapse<T, K: Ord>(rows: Vec<T>, key: impl Fn(&T) -> K) -> Vec<T> {
    let mut seen = std::collections::BTreeSet::new();
    rows.into_iter()
        .filter(|row| seen.insert(key(row)))
        .collect()
}

/// `insert` (a diesel `insert_into(…).values(…)` with no `ON CONFLICT` of its own) as one
/// statement that yields the id in `id` of the row with the key, new or existing; built by
/// [`upsert`].
///
/// | backend | statement |
/// |---|---|
/// | PostgreSQL, SQLite | `<insert> ON CONFLICT (<columns>) [WHERE <predicate>] DO UPDATE SET <first column> = excluded.<first column> RETURNING CAST(<id> AS BIGINT)` |
/// | MySQL, MariaDB | `<insert> ON DUPLICATE KEY UPDATE <id> = LAST_INSERT_ID(<id>)`, then `SELECT LAST_INSERT_ID()` |
#[derive(Debug)]
pub struct Upsert<S, Id> {
    key: UniqueKey,
    insert: S,
    id: std::marker::PhantomData<Id>,
}

impl<S: Clone, Id> Clone for Upsert<S, Id> {
    fn clone(&self) -> Self {
        Upsert {
            key: self.key,
            insert: self.insert.clone(),
            id: std::marker::PhantomData,
        }
    }
}

impl<S, Id> QueryId for Upsert<S, Id> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<S, Id> Query for Upsert<S, Id> {
    type SqlType = BigInt;
}

impl<S, Id, C> diesel::RunQueryDsl<C> for Upsert<S, Id> {}

impl<DB, S, Id> QueryFragment<DB> for Upsert<S, Id>
where
    DB: Dialect,
    S: QueryFragment<DB>,
    Id: Column,
    str: diesel::serialize::ToSql<diesel::sql_types::Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.insert.walk_ast(out.reborrow())?;
        if DB::BACKEND == Backend::Mysql {
            out.push_sql(" ON DUPLICATE KEY UPDATE ");
            out.push_identifier(Id::NAME)?;
            out.push_sql(" = LAST_INSERT_ID(");
            out.push_identifier(Id::NAME)?;
            out.push_sql(")");
            return Ok(());
        }
        push_conflict_target(&mut out, &self.key)?;
        let first = self.key.columns[0];
        out.push_sql(" DO UPDATE SET ");
        out.push_identifier(first)?;
        out.push_sql(" = excluded.");
        out.push_identifier(first)?;
        out.push_sql(" RETURNING CAST(");
        out.push_identifier(Id::NAME)?;
        out.push_sql(" AS BIGINT)");
        Ok(())
    }
}

/// `insert` with `ON CONFLICT (<columns>) [WHERE <predicate>] DO NOTHING` on PostgreSQL and
/// SQLite, and as it is on MySQL (whose `ON DUPLICATE KEY` cannot name the key; its
/// duplicate-key error is caught by name instead); built by [`insert_if_absent`].
#[derive(Debug, Clone, Copy)]
pub struct InsertIfAbsent<S> {
    key: UniqueKey,
    insert: S,
}

impl<S> QueryId for InsertIfAbsent<S> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<S, C> diesel::RunQueryDsl<C> for InsertIfAbsent<S> {}

impl<DB, S> QueryFragment<DB> for InsertIfAbsent<S>
where
    DB: Dialect,
    S: QueryFragment<DB>,
    str: diesel::serialize::ToSql<diesel::sql_types::Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.insert.walk_ast(out.reborrow())?;
        if DB::BACKEND != Backend::Mysql {
            push_conflict_target(&mut out, &self.key)?;
            out.push_sql(" DO NOTHING");
        }
        Ok(())
    }
}

/// ` ON CONFLICT (a, b) [WHERE predicate]`.
fn push_conflict_target<DB: diesel::backend::Backend>(
    out: &mut AstPass<'_, '_, DB>,
    key: &UniqueKey,
) -> QueryResult<()> {
    out.push_sql(" ON CONFLICT (");
    for (n, column) in key.columns.iter().enumerate() {
        if n > 0 {
            out.push_sql(", ");
        }
        out.push_identifier(column)?;
    }
    out.push_sql(")");
    if let Some(predicate) = key.predicate {
        out.push_sql(" WHERE ");
        out.push_sql(predicate);
    }
    Ok(())
}

/// The lock of [`serialize_on`]: a stable 64-bit FNV-1a hash of the key, the same in every
/// process and version (the standard library's hasher promises neither).
pub(crate) fn lock_hash(key: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}

/// MySQL's lock name for `key`: at most 64 characters, whatever the key.
pub(crate) fn lock_name(key: &str) -> String {
    format!("inbox:{:016x}", lock_hash(key) as u64)
}

/// What taking a key lock gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyLock {
    /// Held until the transaction ends (MySQL: until released).
    Held,
    /// Not granted: the wait timed out (MySQL).
    NotGranted,
    /// Held, but in a transaction whose snapshot predates it (PostgreSQL above READ
    /// COMMITTED).
    SnapshotTooOld,
}

#[derive(diesel::QueryableByName)]
struct Answer {
    #[diesel(sql_type = Nullable<BigInt>)]
    n: Option<i64>,
}

impl Answer {
    /// The `n` of the one row a query returns.
    fn of(rows: Vec<Answer>) -> QueryResult<Option<i64>> {
        rows.into_iter()
            .next()
            .map(|row| row.n)
            .ok_or(DieselError::NotFound)
    }
}

// The key lock's statements and MySQL's `LAST_INSERT_ID()`, on any connection.

/// Takes the lock on `key`: what [`serialize_on`] holds while its body runs.
async fn lock_key<S: Io>(io: &mut S, key: &str) -> QueryResult<KeyLock> {
    let n = match S::Backend::BACKEND {
        // 1 when the transaction reads each statement's own snapshot, 2 when its snapshot was
        // taken before the lock was granted.
        Backend::Postgres => Answer::of(
            io.load(
                &Sql::new(
                    "SELECT (CASE current_setting('transaction_isolation') \
                     WHEN 'read committed' THEN 1 ELSE 2 END)::BIGINT AS n \
                     FROM (SELECT pg_advisory_xact_lock($1)) AS locked",
                )
                .bind_i64(lock_hash(key)),
            )
            .await?,
        )?,
        // 1 granted, 0 timed out, NULL an error (out of memory, a killed thread).
        Backend::Mysql => Answer::of(
            io.load(
                &Sql::new("SELECT GET_LOCK(?, @@innodb_lock_wait_timeout) AS n")
                    .bind_text(lock_name(key)),
            )
            .await?,
        )?,
        // The write lock of BEGIN IMMEDIATE, already held.
        Backend::Sqlite => Some(1),
    };
    Ok(match n {
        Some(1) => KeyLock::Held,
        Some(2) => KeyLock::SnapshotTooOld,
        _ => KeyLock::NotGranted,
    })
}

/// PostgreSQL: fails with 25P02 when an earlier statement aborted the transaction — whose
/// `COMMIT` would otherwise be a silent rollback. Nothing elsewhere.
async fn probe_transaction<S: Io>(io: &mut S) -> QueryResult<()> {
    if S::Backend::BACKEND == Backend::Postgres {
        io.load::<Answer>(&Sql::new("SELECT CAST(1 AS BIGINT) AS n"))
            .await?;
    }
    Ok(())
}

/// Releases MySQL's session lock; nothing elsewhere, where the transaction's end does.
async fn unlock_key<S: Io>(io: &mut S, key: &str) -> QueryResult<()> {
    if S::Backend::BACKEND == Backend::Mysql {
        io.load::<Answer>(&Sql::new("SELECT RELEASE_LOCK(?) AS n").bind_text(lock_name(key)))
            .await?;
    }
    Ok(())
}

/// MySQL's `LAST_INSERT_ID()`: the id `upsert`'s `ON DUPLICATE KEY UPDATE` left there.
async fn last_insert_id<S: Io>(io: &mut S) -> QueryResult<i64> {
    Answer::of(
        io.load(&Sql::new("SELECT CAST(LAST_INSERT_ID() AS SIGNED) AS n"))
            .await?,
    )?
    .ok_or(DieselError::NotFound)
}

// The steps of each function, written once over `Transactions` for both IO models: the
// sync functions run them on `Blocking` with `complete_now`, the async ones await them on
// `Awaiting`. A caller's closure is a `Body`, called with the connection.

/// Whether a transaction is open on the connection.
fn in_transaction<S: Io>(io: &mut S) -> QueryResult<bool> {
    Ok(io.transaction_status().transaction_depth()?.is_some())
}

async fn insert_or_get_steps<S, T>(
    io: &mut S,
    key: &UniqueKey,
    insert: &mut impl Body<S::Conn, QueryResult<T>>,
    reread: &mut impl Body<S::Conn, QueryResult<T>>,
) -> Result<Created<T>, UniqueError>
where
    S: Transactions,
{
    let nested = in_transaction(io)?;
    let mut attempt = 0;
    loop {
        // A transaction of its own, or a savepoint inside the caller's: `insert` may run more
        // than one statement, and on PostgreSQL a violation must not abort the caller's
        // transaction. The re-read runs after it, in the caller's context.
        io.begin().await?;
        let inserted = insert.call(io.conn()).await;
        let failure = match end(io, inserted, |e| e).await {
            Ok(row) => return Ok(Created::New(row)),
            Err(error) => match UniqueError::sort(error, key) {
                // The race, lost: the winner has committed (the insert waited for it).
                None => match reread.call(io.conn()).await {
                    Ok(row) => return Ok(Created::Existing(row)),
                    Err(DieselError::NotFound) => UniqueError::WinnerNotFound { key: *key },
                    Err(error) => UniqueError::Database(error),
                },
                // A row that collides with the key's row and another index's at once is
                // reported for whichever index the server checked first (SQLite: the last
                // created). The key's row, if there is one, is the answer.
                Some(other @ UniqueError::OtherViolation { .. }) => {
                    match reread.call(io.conn()).await {
                        Ok(row) => return Ok(Created::Existing(row)),
                        Err(DieselError::NotFound) => other,
                        Err(error) => UniqueError::Database(error),
                    }
                }
                Some(failure) => failure,
            },
        };
        retry_or_return(io, failure, nested, &mut attempt).await?;
    }
}

/// One statement on the key, `run`: in a savepoint inside a transaction; `done` maps its
/// result, `key_violated` answers the key's own violation. Another index's violation is
/// tried once more: on PostgreSQL a concurrent insert of the same row can trip a unique index
/// that is not the conflict target (checked while waiting for the other transaction) before
/// the key's conflict is seen; the second try sees the committed row and resolves by the key.
async fn one_statement<S, V, Out>(
    io: &mut S,
    key: &UniqueKey,
    run: &mut impl Body<S::Conn, QueryResult<V>>,
    done: impl Fn(V) -> Result<Out, UniqueError>,
    key_violated: impl Fn() -> Result<Out, UniqueError>,
) -> Result<Out, UniqueError>
where
    S: Transactions,
{
    let nested = in_transaction(io)?;
    let (mut attempt, mut tried_again) = (0, false);
    loop {
        let result = match nested {
            true => {
                io.begin().await?;
                let result = run.call(io.conn()).await;
                end(io, result, |e| e).await
            }
            false => run.call(io.conn()).await,
        };
        let failure = match result {
            Ok(value) => return done(value),
            Err(error) => match UniqueError::sort(error, key) {
                None => return key_violated(),
                Some(failure) => failure,
            },
        };
        if matches!(failure, UniqueError::OtherViolation { .. }) && !tried_again {
            tried_again = true;
            continue;
        }
        retry_or_return(io, failure, nested, &mut attempt).await?;
    }
}

/// `upsert`'s answers: the id, or — its key violated, which the statement itself resolves —
/// a winner that cannot be read.
async fn upsert_steps<S: Transactions>(
    io: &mut S,
    key: &UniqueKey,
    run: &mut impl Body<S::Conn, QueryResult<i64>>,
) -> Result<i64, UniqueError> {
    one_statement(io, key, run, Ok, || {
        Err(UniqueError::WinnerNotFound { key: *key })
    })
    .await
}

/// MySQL has no `RETURNING`: a multi-row upsert cannot yield every row's id.
const NO_UPSERT_ALL_ON_MYSQL: UniqueError = UniqueError::Unsupported {
    what: "MySQL has no RETURNING: a multi-row upsert cannot yield every row's id; call upsert \
           or insert_or_get per row, in one transaction",
};

async fn serialize_on_steps<S, T, E>(
    io: &mut S,
    name: &str,
    body: &mut impl Body<S::Conn, Result<T, E>>,
) -> Result<T, E>
where
    S: Transactions,
    E: From<UniqueError>,
{
    let database = |error: DieselError| E::from(UniqueError::Database(error));
    let nested = in_transaction(io).map_err(database)?;
    // MySQL's GET_LOCK belongs to the session: released by RELEASE_LOCK, not by COMMIT.
    // Taken inside a transaction it would be released before the commit that publishes the
    // rows, and the next caller would not see them; so it is taken before BEGIN and released
    // after COMMIT, and refused inside a transaction.
    let session_lock = S::Backend::BACKEND == Backend::Mysql;
    if session_lock && nested {
        return Err(database(DieselError::AlreadyInTransaction));
    }
    if session_lock {
        lock(io, name, database).await?;
    }
    // A transaction (PostgreSQL: READ COMMITTED, so that each statement sees what the
    // previous holder committed; SQLite: BEGIN IMMEDIATE, whose write lock is the
    // serialisation), or a savepoint inside the caller's.
    let begun = match nested {
        true => io.begin().await,
        false => io.begin_write().await,
    };
    let result = match begun {
        Ok(()) => {
            let locked = match session_lock {
                true => Ok(()),
                false => lock(io, name, database).await,
            };
            let result = match locked {
                Ok(()) => body.call(io.conn()).await,
                Err(error) => Err(error),
            };
            end(io, result, database).await
        }
        Err(error) => Err(database(error)),
    };
    if session_lock {
        // After the commit. A lock that could not be released stays with the session: the
        // connection is marked broken, so that a pool drops it rather than hand the lock to
        // its next user.
        if let Err(error) = unlock_key(io, name).await {
            tracing::warn!(%error, "releasing the key lock failed; the connection is dropped");
            io.transaction_status().set_in_error();
        }
    }
    result
}

/// After a failed attempt: returns the failure inside the caller's transaction (only the
/// whole transaction can run again), when it is not transient, or after the last retry;
/// otherwise waits before the next attempt.
async fn retry_or_return<S: Io>(
    io: &mut S,
    failure: UniqueError,
    nested: bool,
    attempt: &mut u32,
) -> Result<(), UniqueError> {
    if nested || !failure.is_transient() || *attempt == UniqueKey::RETRIES {
        return Err(failure);
    }
    io.sleep(RetryPolicy::default().backoff(*attempt, fastrand::f64()))
        .await;
    *attempt += 1;
    Ok(())
}

/// Takes the key lock: `Ok(())`, or the error converted by `convert`.
async fn lock<S: Io, E: From<UniqueError>>(
    io: &mut S,
    name: &str,
    convert: impl Fn(DieselError) -> E,
) -> Result<(), E> {
    match lock_key(io, name).await {
        Ok(KeyLock::Held) => Ok(()),
        Ok(KeyLock::NotGranted) => Err(E::from(UniqueError::LockTimeout {
            key: name.to_owned(),
        })),
        Ok(KeyLock::SnapshotTooOld) => Err(E::from(UniqueError::Unsupported {
            what: "serialize_on inside a REPEATABLE READ or SERIALIZABLE transaction: its \
                   snapshot predates the lock, so the previous holder's rows stay invisible; \
                   call it outside a transaction or under READ COMMITTED",
        })),
        Err(error) => Err(convert(error)),
    }
}

/// Ends the transaction or savepoint begun for `result`: commits it if `result` is `Ok` (on
/// PostgreSQL after checking that no swallowed error aborted it), rolls it back otherwise. A
/// failed rollback is logged, and the error that caused it returned.
async fn end<S: Transactions, T, E>(
    io: &mut S,
    result: Result<T, E>,
    convert: impl Fn(DieselError) -> E,
) -> Result<T, E> {
    match result {
        Ok(value) => {
            let committed = match probe_transaction(io).await {
                Ok(()) => io.commit().await,
                Err(error) => Err(error),
            };
            match committed {
                Ok(()) => Ok(value),
                Err(error) => {
                    roll_back(io).await;
                    Err(convert(error))
                }
            }
        }
        Err(error) => {
            roll_back(io).await;
            Err(error)
        }
    }
}

async fn roll_back<S: Transactions>(io: &mut S) {
    match io.roll_back().await {
        // A failed COMMIT has already ended the transaction.
        Ok(()) | Err(DieselError::NotInTransaction) => {}
        Err(error) => tracing::warn!(%error, "rolling back after a failure failed"),
    }
}

/// A caller's `FnOnce` body, called once.
fn once<C, R>(body: impl FnOnce(&mut C) -> R) -> Immediate<impl FnMut(&mut C) -> R> {
    let mut body = Some(body);
    Immediate(move |conn: &mut C| (body.take().expect("serialize_on runs its body once"))(conn))
}

/// Inserts a row, or — when a concurrent or earlier caller holds the key — reads back theirs.
///
/// `insert` runs the insert and returns the row (with `RETURNING` where the backend has it, or
/// a read after the insert); `reread` reads the row with the key — the winner's.
/// A violation of `key` leads to the re-read. So does a violation of another unique index,
/// because a row that collides on several indexes is reported for one of them only (SQLite
/// names the index it checked first, which is not always the key's): if the key's row is
/// there it is the answer, and otherwise the other violation is returned,
/// [`UniqueError::OtherViolation`] with the server's name for it — a primary key behind its
/// sequence, another business rule.
///
/// `insert` runs in a transaction of its own, or in a savepoint inside the caller's, so that
/// all its statements commit or none do and, on PostgreSQL, the violation does not abort the
/// caller's transaction: the caller's other writes commit with it. The re-read runs after
/// that, in the caller's transaction if there is one. Outside a transaction, transient
/// failures (deadlocks, SQLite's busy database) are retried.
///
/// On MySQL and MariaDB (REPEATABLE READ by default), when the surrounding transaction has
/// already read something, make `reread` a locking read (`.for_update()`): a plain read sees
/// the snapshot of that first read, without the winner's row.
///
/// `conn` is a backend's connection, or an application's enum of connections
/// (`#[derive(diesel::MultiConnection, inbox_diesel::MultiConnection)]`): `insert` and
/// `reread` are then given the enum, and the savepoint and the violation's reading are the
/// variant's.
///
/// # Errors
/// [`UniqueError::OtherViolation`], [`UniqueError::WinnerNotFound`], or the database's error.
pub fn insert_or_get<C, T>(
    conn: &mut C,
    key: &UniqueKey,
    insert: impl FnMut(&mut C) -> QueryResult<T>,
    reread: impl FnMut(&mut C) -> QueryResult<T>,
) -> Result<Created<T>, UniqueError>
where
    C: crate::HandlerConnection,
{
    // On an application's enum of connections (`#[derive(inbox_diesel::MultiConnection)]`)
    // the statements of the runtime's own run on its variant; `insert` and `reread` are
    // given the enum.
    conn.__inbox_visit(InsertOrGet {
        key,
        insert,
        reread,
        row: std::marker::PhantomData,
    })
}

/// [`insert_or_get`] on the connection an application's connection leads to: itself, or
/// the variant of its enum of connections, whose transactions are the enum's; `insert` and
/// `reread` are given the application's connection.
struct InsertOrGet<'k, I, R, T> {
    key: &'k UniqueKey,
    insert: I,
    reread: R,
    row: std::marker::PhantomData<fn() -> T>,
}

impl<O, T, I, R> crate::backends::Visit<O> for InsertOrGet<'_, I, R, T>
where
    I: FnMut(&mut O) -> QueryResult<T>,
    R: FnMut(&mut O) -> QueryResult<T>,
{
    type Output = Result<Created<T>, UniqueError>;

    fn visit<C: crate::InboxConnection>(
        self,
        outer: &mut O,
        project: fn(&mut O) -> &mut C,
    ) -> Self::Output {
        complete_now(insert_or_get_steps(
            &mut crate::runtime::sync::Projected::new(outer, project),
            self.key,
            &mut Immediate(self.insert),
            &mut Immediate(self.reread),
        ))
    }
}

/// Inserts a row unless its key exists, and returns the id of the row with the key, in one
/// statement — `INSERT … ON CONFLICT (<key>) DO UPDATE SET … RETURNING <id>` on PostgreSQL
/// and SQLite, `INSERT … ON DUPLICATE KEY UPDATE <id> = LAST_INSERT_ID(<id>)` and
/// `SELECT LAST_INSERT_ID()` on MySQL and MariaDB (see [`Upsert`]).
///
/// `insert` is a plain `diesel::insert_into(…).values(…)` of one row; `id` the table's
/// integer id column. On MySQL `id` must be the table's `AUTO_INCREMENT` column and the
/// insert must not set it: `LAST_INSERT_ID()` changes only for a generated value, and would
/// otherwise name the session's previous insert.
///
/// What it costs: on PostgreSQL every duplicate writes a new version of the existing row
/// (the no-op `SET` is still an update: a dead tuple for vacuum, WAL, and every `BEFORE
/// UPDATE` trigger fires); SQLite likewise rewrites the row. Where no id is needed,
/// [`insert_if_absent`] writes nothing on a duplicate. On MySQL `ON DUPLICATE KEY UPDATE`
/// cannot name an index: a collision on *any* unique index (the primary key included) yields
/// that row's id. Use it only on a table whose one unique index besides an auto-increment
/// primary key is the key, and [`insert_or_get`] otherwise. Every form burns a sequence or
/// auto-increment value on a duplicate.
///
/// A partial unique index needs its predicate in the key ([`UniqueKey::partial`]).
///
/// # Errors
/// [`UniqueError::OtherViolation`] for another index (PostgreSQL, SQLite), or the database's
/// error.
pub fn upsert<'q, C, S, Id>(
    conn: &mut C,
    key: &UniqueKey,
    insert: S,
    #[allow(unused_variables)] id: Id,
) -> Result<i64, UniqueError>
where
    C: crate::InboxConnection,
    S: Clone,
    Upsert<S, Id>:
        diesel::query_dsl::LoadQuery<'q, C, i64> + diesel::query_dsl::methods::ExecuteDsl<C>,
{
    use diesel::RunQueryDsl;
    let statement = Upsert {
        key: *key,
        insert,
        id: std::marker::PhantomData::<Id>,
    };
    let mut run = Immediate(|conn: &mut C| match C::BACKEND {
        Backend::Mysql => {
            statement.clone().execute(conn)?;
            complete_now(last_insert_id(&mut Blocking(conn)))
        }
        _ => statement.clone().get_result::<i64>(conn),
    });
    complete_now(upsert_steps(&mut Blocking(conn), key, &mut run))
}

/// The batch form of [`upsert`]: one statement for many rows, the ids of the rows with their
/// keys, new or existing — one id per row of `insert`, in the order PostgreSQL returns them
/// (read the rows back by key where the pairing matters).
///
/// `insert` builds the multi-row `diesel::insert_into(…).values(rows)` from `rows`, which
/// must be [`collapse`]d first: PostgreSQL refuses to let one `ON CONFLICT DO UPDATE` touch a
/// row twice ("ON CONFLICT DO UPDATE command cannot affect row a second time", SQLSTATE
/// `21000`). No rows: no statement, no ids.
///
/// PostgreSQL only, in practice: diesel builds no multi-row insert for SQLite (the call does
/// not compile), and MySQL's `LAST_INSERT_ID()` names one row — there it returns
/// [`UniqueError::Unsupported`]. On those, call [`upsert`] or [`insert_or_get`] per row in one
/// transaction.
///
/// # Errors
/// As [`upsert`], and [`UniqueError::Unsupported`] on MySQL.
pub fn upsert_all<'q, 'r, C, R, S, Id>(
    conn: &mut C,
    key: &UniqueKey,
    rows: &'r [R],
    insert: impl Fn(&'r [R]) -> S,
    #[allow(unused_variables)] id: Id,
) -> Result<Vec<i64>, UniqueError>
where
    C: crate::InboxConnection,
    Upsert<S, Id>: diesel::query_dsl::LoadQuery<'q, C, i64>,
{
    use diesel::RunQueryDsl;
    if C::BACKEND == Backend::Mysql {
        return Err(NO_UPSERT_ALL_ON_MYSQL);
    }
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    // Built again for each attempt: a multi-row insert is not `Clone`.
    let statement = || Upsert {
        key: *key,
        insert: insert(rows),
        id: std::marker::PhantomData::<Id>,
    };
    let mut run = Immediate(|conn: &mut C| statement().get_results::<i64>(conn));
    complete_now(one_statement(
        &mut Blocking(conn),
        key,
        &mut run,
        Ok,
        || Err(UniqueError::WinnerNotFound { key: *key }),
    ))
}

/// Inserts a row unless its key exists; `true` when it inserted. Nothing is written for a
/// duplicate (see [`InsertIfAbsent`]).
///
/// On MySQL and MariaDB the row is inserted as it is and the key's duplicate-key error caught
/// by name. A row that collides on the key and on another unique index at once is reported
/// for the first of them in the server's order (the primary key, then the unique keys as the
/// table declares them): declare the key before the table's other unique keys, or use
/// [`insert_or_get`], which re-reads by the key whatever index was named.
///
/// # Errors
/// [`UniqueError::OtherViolation`] for another index, or the database's error.
pub fn insert_if_absent<C, S>(conn: &mut C, key: &UniqueKey, insert: S) -> Result<bool, UniqueError>
where
    C: crate::InboxConnection,
    S: Clone,
    InsertIfAbsent<S>: diesel::query_dsl::methods::ExecuteDsl<C>,
{
    use diesel::RunQueryDsl;
    let statement = InsertIfAbsent { key: *key, insert };
    // MySQL's plain insert: the key's own violation means "present".
    let mut run = Immediate(|conn: &mut C| statement.clone().execute(conn));
    complete_now(one_statement(
        &mut Blocking(conn),
        key,
        &mut run,
        |rows| Ok(rows > 0),
        || Ok(false),
    ))
}

/// Runs `body` in a transaction that holds a lock on `key` until it ends: one caller at a
/// time creates what belongs to the key ("the tenant, then its schema row, then its
/// settings"); the next finds it there.
///
/// | backend | lock | inside an open transaction |
/// |---|---|---|
/// | PostgreSQL | `pg_advisory_xact_lock(<64-bit hash of key>)`, taken first in a READ COMMITTED transaction, released by its commit or rollback | taken in it and held to its end, the body in a savepoint; refused under REPEATABLE READ or SERIALIZABLE, whose snapshot predates the lock ([`UniqueError::Unsupported`]) |
/// | MySQL, MariaDB | `GET_LOCK('inbox:<hash>', @@innodb_lock_wait_timeout)` before `BEGIN`, `RELEASE_LOCK` after `COMMIT` | refused: the session's lock would be released before the rows are visible (diesel's `AlreadyInTransaction`) |
/// | SQLite | `BEGIN IMMEDIATE`: the database's write lock serialises every writer | the body in a savepoint: serialised only if the caller's transaction began `IMMEDIATE`; otherwise a second writer fails with a busy database rather than duplicate anything |
///
/// A tool for performance and for statements that cannot be one, on top of the unique index,
/// never instead of it: the lock holds only among callers that take it, so the index still
/// catches the code path that forgets. Two keys can share a hash and then wait for each other
/// — slower, never wrong.
///
/// MySQL's lock belongs to the session. If releasing it fails, the connection is marked
/// broken, so that a pool drops it instead of lending the lock to its next user; an async
/// caller that drops the future between `GET_LOCK` and `RELEASE_LOCK` must drop the
/// connection too.
///
/// # Errors
/// The body's error, its writes rolled back; [`UniqueError::LockTimeout`] when MySQL did not
/// grant the lock; the database's errors — each converted into `E`.
pub fn serialize_on<C, T, E>(
    conn: &mut C,
    key: &str,
    body: impl FnOnce(&mut C) -> Result<T, E>,
) -> Result<T, E>
where
    C: crate::HandlerConnection,
    E: From<UniqueError>,
{
    conn.__inbox_visit(SerializeOn {
        key,
        body,
        answer: std::marker::PhantomData,
    })
}

/// [`serialize_on`] on the connection an application's connection leads to ([`InsertOrGet`]).
struct SerializeOn<'k, B, T, E> {
    key: &'k str,
    body: B,
    answer: std::marker::PhantomData<fn() -> (T, E)>,
}

impl<O, T, E, B> crate::backends::Visit<O> for SerializeOn<'_, B, T, E>
where
    B: FnOnce(&mut O) -> Result<T, E>,
    E: From<UniqueError>,
{
    type Output = Result<T, E>;

    fn visit<C: crate::InboxConnection>(
        self,
        outer: &mut O,
        project: fn(&mut O) -> &mut C,
    ) -> Self::Output {
        complete_now(serialize_on_steps(
            &mut crate::runtime::sync::Projected::new(outer, project),
            self.key,
            &mut once(self.body),
        ))
    }
}

#[cfg(feature = "async")]
pub use self::asynchronous::*;

#[cfg(feature = "async")]
mod asynchronous {
    use super::*;
    use crate::AsyncInboxConnection;
    use crate::io::Awaiting;
    use crate::runtime::asynchronous::{AsyncBody, Cloned};
    use std::marker::PhantomData;

    /// [`insert_or_get`](super::insert_or_get) on a diesel-async connection; `insert` and
    /// `reread` are async closures.
    ///
    /// # Errors
    /// As [`insert_or_get`](super::insert_or_get).
    pub async fn insert_or_get_async<C, T, I, R>(
        conn: &mut C,
        key: &UniqueKey,
        insert: I,
        reread: R,
    ) -> Result<Created<T>, UniqueError>
    where
        C: AsyncInboxConnection,
        I: Clone + for<'c> AsyncBody<&'c mut C, QueryResult<T>, Fut: Send>,
        R: Clone + for<'c> AsyncBody<&'c mut C, QueryResult<T>, Fut: Send>,
    {
        insert_or_get_steps(
            &mut Awaiting(conn),
            key,
            &mut Cloned(insert),
            &mut Cloned(reread),
        )
        .await
    }

    /// [`upsert`](super::upsert) on a diesel-async connection.
    ///
    /// Inside a future that must be `Send` (`tokio::spawn`), bind owned values (`String`, not
    /// `&str`) in `insert`: the compiler cannot prove the future `Send` for every lifetime of
    /// a borrowed bind (a limitation of `async fn` today, not of this function's bounds).
    ///
    /// # Errors
    /// As [`upsert`](super::upsert).
    pub async fn upsert_async<'q, C, S, Id>(
        conn: &mut C,
        key: &UniqueKey,
        insert: S,
        #[allow(unused_variables)] id: Id,
    ) -> Result<i64, UniqueError>
    where
        C: AsyncInboxConnection,
        S: Clone + Send + 'q,
        Id: Send + 'q,
        Upsert<S, Id>: diesel_async::methods::LoadQuery<'q, C, i64>
            + diesel_async::methods::ExecuteDsl<C>
            + 'q,
    {
        let statement = Upsert {
            key: *key,
            insert,
            id: std::marker::PhantomData::<Id>,
        };
        let mut run = Statement(statement, PhantomData);
        upsert_steps(&mut Awaiting(conn), key, &mut run).await
    }

    /// [`upsert_all`](super::upsert_all) on a diesel-async connection.
    ///
    /// # Errors
    /// As [`upsert_all`](super::upsert_all).
    pub async fn upsert_all_async<'q, 'r, C, R, S, Id>(
        conn: &mut C,
        key: &UniqueKey,
        rows: &'r [R],
        insert: impl Fn(&'r [R]) -> S,
        #[allow(unused_variables)] id: Id,
    ) -> Result<Vec<i64>, UniqueError>
    where
        C: AsyncInboxConnection,
        S: Send + 'q,
        Id: Send + 'q,
        Upsert<S, Id>: diesel_async::methods::LoadQuery<'q, C, i64> + 'q,
    {
        if C::BACKEND == Backend::Mysql {
            return Err(NO_UPSERT_ALL_ON_MYSQL);
        }
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let statement = || Upsert {
            key: *key,
            insert: insert(rows),
            id: std::marker::PhantomData::<Id>,
        };
        let mut run = Statements(statement, PhantomData);
        one_statement(&mut Awaiting(conn), key, &mut run, Ok, || {
            Err(UniqueError::WinnerNotFound { key: *key })
        })
        .await
    }

    /// [`insert_if_absent`](super::insert_if_absent) on a diesel-async connection.
    ///
    /// # Errors
    /// As [`insert_if_absent`](super::insert_if_absent).
    pub async fn insert_if_absent_async<'q, C, S>(
        conn: &mut C,
        key: &UniqueKey,
        insert: S,
    ) -> Result<bool, UniqueError>
    where
        C: AsyncInboxConnection,
        S: Clone + Send + 'q,
        InsertIfAbsent<S>: diesel_async::methods::ExecuteDsl<C> + 'q,
    {
        let statement = InsertIfAbsent { key: *key, insert };
        let mut run = Statement(statement, PhantomData);
        one_statement(
            &mut Awaiting(conn),
            key,
            &mut run,
            |rows| Ok(rows > 0),
            || Ok(false),
        )
        .await
    }

    /// [`serialize_on`](super::serialize_on) on a diesel-async connection; `body` is an async
    /// closure.
    ///
    /// # Errors
    /// As [`serialize_on`](super::serialize_on).
    pub async fn serialize_on_async<C, T, E, B>(conn: &mut C, key: &str, body: B) -> Result<T, E>
    where
        C: AsyncInboxConnection,
        E: From<UniqueError>,
        B: Clone + for<'c> AsyncBody<&'c mut C, Result<T, E>, Fut: Send>,
    {
        serialize_on_steps(&mut Awaiting(conn), key, &mut Cloned(body)).await
    }

    /// One of this module's statements, run afresh (cloned) by each call of the steps: a
    /// type rather than an async closure, whose borrow of the statement the compiler cannot
    /// prove `Send` for every lifetime. `'q` is the statement's, as the caller bound it.
    struct Statement<'q, Q>(Q, PhantomData<&'q ()>);

    impl<'q, C, S, Id> Body<C, QueryResult<i64>> for Statement<'q, Upsert<S, Id>>
    where
        C: AsyncInboxConnection,
        S: Clone + Send + 'q,
        Id: Send + 'q,
        Upsert<S, Id>: diesel_async::methods::LoadQuery<'q, C, i64>
            + diesel_async::methods::ExecuteDsl<C>
            + 'q,
    {
        async fn call(&mut self, conn: &mut C) -> QueryResult<i64> {
            match C::BACKEND {
                Backend::Mysql => {
                    diesel_async::RunQueryDsl::execute(self.0.clone(), conn).await?;
                    last_insert_id(&mut Awaiting(conn)).await
                }
                _ => diesel_async::RunQueryDsl::get_result(self.0.clone(), conn).await,
            }
        }
    }

    impl<'q, C, S> Body<C, QueryResult<usize>> for Statement<'q, InsertIfAbsent<S>>
    where
        C: AsyncInboxConnection,
        S: Clone + Send + 'q,
        InsertIfAbsent<S>: diesel_async::methods::ExecuteDsl<C> + 'q,
    {
        async fn call(&mut self, conn: &mut C) -> QueryResult<usize> {
            diesel_async::RunQueryDsl::execute(self.0.clone(), conn).await
        }
    }

    /// A multi-row statement, built afresh by each call (it is not `Clone`).
    struct Statements<'q, F>(F, PhantomData<&'q ()>);

    impl<'q, C, F, S, Id> Body<C, QueryResult<Vec<i64>>> for Statements<'q, F>
    where
        C: AsyncInboxConnection,
        F: Fn() -> Upsert<S, Id>,
        S: Send + 'q,
        Id: Send + 'q,
        Upsert<S, Id>: diesel_async::methods::LoadQuery<'q, C, i64> + 'q,
    {
        async fn call(&mut self, conn: &mut C) -> QueryResult<Vec<i64>> {
            diesel_async::RunQueryDsl::get_results((self.0)(), conn).await
        }
    }
}

/// The steps against a scripted connection: what they do on a deadlock, inside and outside a
/// transaction, and on the key's own violation — without a server, in the order they do it.
#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use std::time::Duration;

    use diesel::connection::{TransactionDepthChange, TransactionManagerStatus};
    use diesel::result::DatabaseErrorKind;

    use super::*;
    use crate::dialect::Row;

    const EMAIL: UniqueKey = UniqueKey::new("users", "ux_users_email", &["email"]);

    /// SQLite's dialect, whose key lock and probe send no statement: the script is what
    /// the steps did with the transaction, and what the caller's closures did.
    #[derive(Default)]
    struct Script {
        status: TransactionManagerStatus,
        did: Vec<&'static str>,
    }

    impl Script {
        fn depth(&mut self, change: TransactionDepthChange) -> QueryResult<()> {
            match &mut self.status {
                TransactionManagerStatus::Valid(status) => status.change_transaction_depth(change),
                TransactionManagerStatus::InError => Err(DieselError::BrokenTransactionManager),
            }
        }
    }

    impl Io for Script {
        type Backend = diesel::sqlite::Sqlite;

        async fn execute(&mut self, _: &Sql) -> QueryResult<usize> {
            unreachable!("no statement on SQLite's path")
        }

        async fn load<R: Row>(&mut self, _: &Sql) -> QueryResult<Vec<R>> {
            unreachable!("no query on SQLite's path")
        }

        async fn batch(&mut self, _: &str) -> QueryResult<()> {
            unreachable!("not claim mode")
        }

        async fn execute_claim(
            &mut self,
            _: crate::dialect::claim::ClaimSql<'_, Self::Backend>,
        ) -> QueryResult<usize> {
            unreachable!("not claim mode")
        }

        async fn read_claim(
            &mut self,
            _: crate::dialect::claim::ClaimRead<'_, Self::Backend>,
        ) -> QueryResult<Vec<crate::dialect::claim::ClaimRow>> {
            unreachable!("not claim mode")
        }

        fn transaction_status(&mut self) -> &mut TransactionManagerStatus {
            &mut self.status
        }

        async fn sleep(&mut self, _: Duration) {
            self.did.push("sleep");
        }
    }

    impl Transactions for Script {
        type Conn = Vec<&'static str>;

        fn conn(&mut self) -> &mut Vec<&'static str> {
            &mut self.did
        }

        async fn begin(&mut self) -> QueryResult<()> {
            self.did.push("begin");
            self.depth(TransactionDepthChange::IncreaseDepth)
        }

        async fn begin_write(&mut self) -> QueryResult<()> {
            self.did.push("begin write");
            self.depth(TransactionDepthChange::IncreaseDepth)
        }

        async fn commit(&mut self) -> QueryResult<()> {
            self.did.push("commit");
            self.depth(TransactionDepthChange::DecreaseDepth)
        }

        async fn roll_back(&mut self) -> QueryResult<()> {
            self.did.push("roll back");
            self.depth(TransactionDepthChange::DecreaseDepth)
        }
    }

    fn server_error(kind: DatabaseErrorKind, message: &str) -> DieselError {
        DieselError::DatabaseError(kind, Box::new(message.to_owned()))
    }

    fn deadlock() -> DieselError {
        server_error(DatabaseErrorKind::Unknown, "deadlock detected")
    }

    fn the_keys_violation() -> DieselError {
        server_error(
            DatabaseErrorKind::UniqueViolation,
            "UNIQUE constraint failed: users.email",
        )
    }

    /// An insert that answers `answers` in turn.
    fn insert(
        mut answers: Vec<QueryResult<i64>>,
    ) -> Immediate<impl FnMut(&mut Vec<&'static str>) -> QueryResult<i64>> {
        answers.reverse();
        Immediate(move |did: &mut Vec<&'static str>| {
            did.push("insert");
            answers.pop().expect("no more attempts than answers")
        })
    }

    fn reread(row: i64) -> Immediate<impl FnMut(&mut Vec<&'static str>) -> QueryResult<i64>> {
        Immediate(move |did: &mut Vec<&'static str>| {
            did.push("re-read");
            Ok(row)
        })
    }

    #[test]
    fn a_deadlock_outside_a_transaction_is_retried_in_a_fresh_one() {
        let mut script = Script::default();
        let created = complete_now(insert_or_get_steps(
            &mut script,
            &EMAIL,
            &mut insert(vec![Err(deadlock()), Ok(7)]),
            &mut reread(0),
        ));
        assert_eq!(created.unwrap(), Created::New(7));
        assert_eq!(
            script.did,
            [
                "begin",
                "insert",
                "roll back",
                "sleep",
                "begin",
                "insert",
                "commit"
            ]
        );
    }

    #[test]
    fn a_deadlock_inside_the_callers_transaction_is_returned_after_its_savepoint() {
        let mut script = Script::default();
        script.depth(TransactionDepthChange::IncreaseDepth).unwrap();
        let created = complete_now(insert_or_get_steps(
            &mut script,
            &EMAIL,
            &mut insert(vec![Err(deadlock()), Ok(7)]),
            &mut reread(0),
        ));
        assert!(
            matches!(created, Err(ref e) if e.is_transient()),
            "{created:?}"
        );
        assert_eq!(script.did, ["begin", "insert", "roll back"]);
        // The caller's transaction is still open, for the caller to roll back and run again.
        assert_eq!(in_transaction(&mut script).ok(), Some(true));
    }

    #[test]
    fn the_keys_violation_reads_the_winners_row_after_the_rollback() {
        let mut script = Script::default();
        let created = complete_now(insert_or_get_steps(
            &mut script,
            &EMAIL,
            &mut insert(vec![Err(the_keys_violation())]),
            &mut reread(42),
        ));
        assert_eq!(created.unwrap(), Created::Existing(42));
        assert_eq!(script.did, ["begin", "insert", "roll back", "re-read"]);
    }

    #[test]
    fn retries_stop_after_the_last_one() {
        let mut script = Script::default();
        let answers = (0..=UniqueKey::RETRIES).map(|_| Err(deadlock())).collect();
        let created = complete_now(insert_or_get_steps(
            &mut script,
            &EMAIL,
            &mut insert(answers),
            &mut reread(0),
        ));
        assert!(created.is_err());
        let sleeps = script.did.iter().filter(|&&d| d == "sleep").count();
        assert_eq!(sleeps, UniqueKey::RETRIES as usize);
    }

    #[test]
    fn serialize_on_runs_its_body_in_the_write_transaction_and_commits() {
        let mut script = Script::default();
        let mut body = once(|did: &mut Vec<&'static str>| {
            did.push("body");
            Ok::<_, UniqueError>(1)
        });
        let result = complete_now(serialize_on_steps(&mut script, "tenant:acme", &mut body));
        assert_eq!(result.unwrap(), 1);
        assert_eq!(script.did, ["begin write", "body", "commit"]);
    }
}
