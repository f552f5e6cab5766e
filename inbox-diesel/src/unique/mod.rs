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
use crate::dialect::keys::Conflicts;
use crate::io::{Blocking, Io, Transactions, complete_now};
use crate::runtime::steps::Body;
use crate::runtime::sync::Immediate;

#[cfg(feature = "async")]
mod asynchronous;
mod blocking;
mod statement;
mod steps;
#[cfg(all(test, feature = "sqlite"))]
mod tests;

#[cfg(feature = "async")]
pub use asynchronous::*;
pub use blocking::{insert_if_absent, insert_or_get, serialize_on, upsert, upsert_all};
pub use statement::{InsertIfAbsent, Upsert};
use steps::*;

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

impl<S, Id> Upsert<S, Id> {
    /// [`upsert`]'s statement: `insert` on `key`, yielding the id in `Id`.
    fn new(key: &UniqueKey, insert: S) -> Self {
        Upsert {
            key: *key,
            insert,
            id: std::marker::PhantomData,
        }
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
