//! The lowest layer: which backend, the SQL text that differs between backends, and a
//! statement as text and binds. [`Dialect`] is implemented for each diesel backend in
//! `backends/`; everything above it — the purge's batches, the startup check, the claim —
//! is written once over it.

use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

pub(crate) mod catalog;
pub(crate) mod claim;
#[cfg(feature = "testing")]
pub(crate) mod clock;
pub(crate) mod ddl;
pub(crate) mod keys;
pub(crate) mod layout;
pub(crate) mod marker;
mod outbox;
mod sql;

pub(crate) use claim::execute_claim;
#[cfg(feature = "async")]
pub(crate) use claim::execute_claim_async;
pub(crate) use sql::execute;
#[cfg(feature = "async")]
pub(crate) use sql::execute_async;
pub use sql::{BindId, Binds, Row, Rows, Sql};

/// `fragment` as the SQL text sent on backend `DB` (the binds left out).
#[cfg(all(test, any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
fn sql_text<DB>(fragment: &dyn diesel::query_builder::QueryFragment<DB>) -> String
where
    DB: diesel::backend::Backend<QueryBuilder: Default> + Default,
{
    let mut builder = DB::QueryBuilder::default();
    fragment.to_sql(&mut builder, &DB::default()).unwrap();
    diesel::query_builder::QueryBuilder::finish(builder)
}

/// What [`Dialect::OPEN_TRANSACTION_PROBE`] fails with on PostgreSQL, quoted in the server's
/// error whatever its language.
pub(crate) const OPEN_TRANSACTION: &str = "inbox: a transaction is open on this session";

/// Whether the probe's error says a transaction is open: PostgreSQL's own (its text, or the
/// session's transaction aborted, 25P02), SQLite's refusal of `BEGIN` inside one.
pub(crate) fn open_transaction(error: &diesel::result::Error) -> bool {
    crate::classify::with_server_error(error, |server| {
        server.message.contains(OPEN_TRANSACTION)
            || server.message.contains("within a transaction")
            || server.message.contains("current transaction is aborted")
    })
    .unwrap_or(false)
}

/// What [`HandlerSpec::POSTGRES_STILL_OURS`](crate::spec::HandlerSpec::POSTGRES_STILL_OURS)
/// fails with, quoted in the server's error whatever its language.
pub(crate) const ENDED_IN_BODY: &str = "inbox: the handler's transaction was ended in its body";

/// Whether `error` is [`ENDED_IN_BODY`]'s: the transaction open is not the one the handler
/// began, or none is.
pub(crate) fn ended_in_body(error: &diesel::result::Error) -> bool {
    crate::classify::with_server_error(error, |server| server.message.contains(ENDED_IN_BODY))
        .unwrap_or(false)
}

/// A diesel backend the runtime writes SQL for. Public only in name, so that the sealed
/// connection traits can require it: it is not reachable from outside the crate.
pub trait Dialect: Binds + Rows + claim::ReadsClaims {
    /// Which backend this is, for what is decided by value (quoting, the migration's SQL).
    const BACKEND: Backend;

    /// The current time, as the backend writes it.
    const NOW: &'static str;
    /// What follows the marker's `VALUES (…)`: how a duplicate is reported.
    const ON_CONFLICT: &'static str;
    /// What follows a claim's `VALUES (…)`: how a duplicate is reported, without `RETURNING`.
    const CLAIM_ON_CONFLICT: &'static str;
    /// The current time as `claimed_until` is written and compared (sub-second).
    const LEASE_NOW: &'static str;
    /// The current time plus a bound number of milliseconds: the SQL before and after the
    /// bind.
    const LEASE_UNTIL: (&'static str, &'static str);
    /// The milliseconds from [`LEASE_NOW`](Self::LEASE_NOW) to `claimed_until`, an integer.
    const LEASE_LEFT_MS: &'static str;
    /// The type a 64-bit integer is cast to.
    const BIGINT: &'static str;
    /// Claim mode: a statement (simple protocol) that fails where a transaction is open on
    /// the session that diesel did not open — `BEGIN` sent as SQL and left open — whose
    /// claim would then commit only with it, or roll back with the connection after the
    /// side effect ran. `None` where the claim's insert asks the server itself (MariaDB's
    /// `@@in_transaction`), or nothing can (MySQL). Recognised by [`OPEN_TRANSACTION`].
    const OPEN_TRANSACTION_PROBE: Option<&'static str>;

    /// Claim mode's precheck, where a plain read may see a marker that is not committed: the
    /// read's head (its first column, whose `CASE` answers 4 where the session reads
    /// uncommitted rows) and what follows its condition (a locking read, which waits for an
    /// uncommitted marker, or with `nowait` fails at once and the transaction decides).
    /// `None` where a read sees committed rows only.
    fn precheck_read(_mariadb: bool, _nowait: bool) -> Option<(&'static str, &'static str)> {
        None
    }

    /// Claim mode: a statement that keeps the server from ending a session idle for
    /// `kept_ms` (the side effect runs between the claim and the stamp with the session
    /// idle), on every claim, as a pool's checkout hook may have shortened it since; sent
    /// with [`OPEN_TRANSACTION_PROBE`](Dialect::OPEN_TRANSACTION_PROBE) in one round trip
    /// where there is one. `None` where the server ends no idle session.
    fn keep_session(_kept_ms: u64) -> Option<String> {
        None
    }

    /// Appended to [`read_marker`](Dialect::read_marker) for a read that must see the
    /// latest committed marker inside a caller's transaction, where a plain read sees the
    /// transaction's snapshot (MySQL's and MariaDB's `REPEATABLE READ`): a locking read.
    const LATEST_READ: &'static str = "";

    // The outbox and its relay; `table` is quoted.

    /// Whether an append can wake a relay in the same statement (PostgreSQL's `NOTIFY`).
    const NOTIFIES: bool = false;

    /// The append of one message to `table`: five binds — id, destination, ordering key,
    /// headers, payload — and, with `notify` (where [`NOTIFIES`](Dialect::NOTIFIES)), the
    /// channel a sixth.
    fn outbox_insert_sql(table: &str, notify: bool) -> String;

    /// One batch of the purge of rows sent before a cutoff, bound as the (negative) age in
    /// milliseconds: by `seq` through a subquery of the oldest.
    fn outbox_purge_sql(table: &str, batch: u32) -> String {
        let (before, after) = Self::LEASE_UNTIL;
        let cutoff = format!("{before}{p}{after}", p = Self::BACKEND.placeholder(1));
        format!(
            "DELETE FROM {table} WHERE seq IN (SELECT seq FROM {table} \
             WHERE sent_at < {cutoff} ORDER BY sent_at LIMIT {batch})"
        )
    }

    /// The relay's lock on the candidates it reads (alias `o`) before claiming them, so that
    /// relays side by side take different ones without waiting (`FOR UPDATE SKIP LOCKED`);
    /// empty where there is one writer.
    const SKIP_LOCKED: &'static str;

    /// Whether an `UPDATE` may read its own table in a subquery: then the relay claims in
    /// one `UPDATE … RETURNING`, else in a transaction of reads and an update by `seq`.
    const UPDATES_FROM_OWN_SUBQUERY: bool;

    /// Whether every writer waits for one database lock, even a claim that finds nothing
    /// (SQLite): a relay then reads before it claims.
    const SINGLE_WRITER: bool;

    /// An outbox id column read as text.
    fn outbox_id_text(column: &str) -> String {
        column.to_owned()
    }

    /// "Now plus the bound milliseconds" for a claim's lease where it is taken row by row,
    /// from the moment each row is claimed where the server can tell:
    /// [`LEASE_UNTIL`](Dialect::LEASE_UNTIL) elsewhere.
    const LEASE_PER_ROW: (&'static str, &'static str) = Self::LEASE_UNTIL;

    // Get-or-create (`unique`).

    /// How an insert meets the row its key duplicates.
    const CONFLICTS: keys::Conflicts;

    /// Takes get-or-create's lock on `key`, answering `n`: 1 held, 2 held in a transaction
    /// whose snapshot predates it, 0 or NULL not granted. `None` where the transaction's
    /// own begin holds the lock (SQLite's `BEGIN IMMEDIATE`).
    fn lock_key(key: &str) -> Option<Sql>;

    /// Releases the lock of [`Dialect::lock_key`], where it is the session's rather than the
    /// transaction's (MySQL's `GET_LOCK`): taken before `BEGIN`, released after `COMMIT`.
    /// `None` where the transaction's end releases it.
    fn unlock_key(_key: &str) -> Option<Sql> {
        None
    }

    /// A statement that fails when an earlier statement aborted the transaction, whose
    /// `COMMIT` would otherwise be a silent rollback (PostgreSQL's 25P02); `None` where
    /// a failed statement leaves the transaction usable.
    const ABORTED_PROBE: Option<&'static str> = None;

    // Stored results (`store_result`); `table` is quoted.

    /// Writes a marker's stored result, and with `fingerprint` the request's fingerprint in
    /// the same statement. Binds: the result's JSON text, with `fingerprint` its bytes, the
    /// message id ([`Dialect::bind_message_id`]), the consumer, and with `fenced` the
    /// claim's attempt (claim mode: a claim taken over keeps its new holder's result).
    /// Written with `?` placeholders (MySQL, MariaDB, SQLite); PostgreSQL numbers them.
    fn store_result(table: &str, fingerprint: bool, fenced: bool) -> String {
        let fingerprint = match fingerprint {
            true => ", fingerprint = ?",
            false => "",
        };
        let fence = match fenced {
            true => " AND attempts = ? AND processed_at IS NULL",
            false => "",
        };
        format!(
            "UPDATE {table} SET result = ?{fingerprint} WHERE message_id = ? AND consumer = ?{fence}"
        )
    }

    /// `result` (a marker's stored result as text) and `fingerprint`, each NULL when none
    /// was stored or, without `result` or `fingerprint`, not read. Binds: the message id,
    /// the consumer.
    /// Written with `?` placeholders (MySQL, MariaDB, SQLite); PostgreSQL numbers them.
    fn read_marker(table: &str, result: bool, fingerprint: bool) -> String {
        let result = if result { Self::RESULT_AS_TEXT } else { "NULL" };
        let fingerprint = if fingerprint { "fingerprint" } else { "NULL" };
        format!(
            "SELECT {result} AS result, {fingerprint} AS fingerprint FROM {table} \
             WHERE message_id = ? AND consumer = ?"
        )
    }

    /// The `result` column, read as text by [`Dialect::read_marker`].
    const RESULT_AS_TEXT: &'static str = "result";

    /// Writes a marker's fingerprint. Binds: the fingerprint's bytes, the message id, the
    /// consumer.
    fn store_fingerprint(table: &str) -> String {
        format!("UPDATE {table} SET fingerprint = ? WHERE message_id = ? AND consumer = ?")
    }

    /// Binds the message id as [`Dialect::store_result`] and [`Dialect::read_marker`] compare
    /// it: its 16 bytes (PostgreSQL: its text, cast to `uuid`).
    fn bind_message_id(sql: Sql, id: &Uuid) -> Sql {
        sql.bind_bytes(id.as_bytes().to_vec())
    }

    // The purge. Binds: the age in seconds, then (for the delete and the list) the number of
    // rows; `table` is quoted.

    /// Deletes one batch of completed rows.
    fn delete_batch(table: &str) -> String;

    /// `n`: the open claims older than the age.
    fn count_stale(table: &str) -> String;

    /// Rows as `purge::StaleRow`, oldest first.
    fn list_stale(table: &str) -> String;

    /// A query returning `n` = 1 when this session got the purge lock of `table`, held until
    /// [`Dialect::unlock`], binding the lock's name twice; `None` where there is no session
    /// lock.
    fn try_lock(table: &str) -> Option<String>;

    /// Releases the lock of [`Dialect::try_lock`], binding its name.
    fn unlock(table: &str) -> Option<String>;

    /// A query of `n`, the seconds the session holding the purge lock has been idle, binding
    /// the lock's name; no row when it is running a statement. `None` where there is no
    /// session lock.
    fn lock_holder_idle(_table: &str) -> Option<String> {
        None
    }

    /// SQLite: a query of `n`, 0 when `table` has no `id` column (the lean design), binding
    /// its qualifier (empty for `main`) and its name. `None` elsewhere: every table has it.
    fn has_id(_table: &str) -> Option<String> {
        None
    }

    /// The batch of a table keyed by `(message_id, consumer)` alone: deletes the next
    /// completed rows in key order after a cursor, returning their keys (`purge::KeyRow`).
    /// Binds: the cursor's id and consumer, the age in seconds, the batch size.
    fn delete_batch_by_key(_table: &str) -> Option<String> {
        None
    }

    /// Where each batch takes the lock itself, for the length of its own statement: a
    /// `SELECT` of `locked` (1 or 0) and `n` (rows removed) binding the age, the batch size
    /// and the lock's name, which replaces `delete_batch` and the session lock.
    fn locked_delete_batch(_table: &str) -> Option<String> {
        None
    }
}

/// A database backend, for the SQL that differs between them. Available whatever features
/// are enabled: the migration generator writes SQL for backends it does not connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// PostgreSQL.
    Postgres,
    /// MySQL and MariaDB (InnoDB).
    Mysql,
    /// SQLite.
    Sqlite,
}

impl Backend {
    /// The `n`th placeholder of a statement: `$n` on PostgreSQL, `?` elsewhere.
    pub(crate) fn placeholder(self, n: usize) -> String {
        match self {
            Backend::Postgres => format!("${n}"),
            Backend::Mysql | Backend::Sqlite => "?".to_owned(),
        }
    }

    /// The backend a database URL names, as the diesel CLI reads it: `postgres://` or
    /// `postgresql://`, `mysql://`; anything else is a SQLite file.
    pub fn from_database_url(url: &str) -> Self {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else if url.starts_with("mysql://") {
            Backend::Mysql
        } else {
            Backend::Sqlite
        }
    }

    /// An identifier as this backend's SQL writes it, quoted — as the runtime writes it — so
    /// that a name that is a keyword (`order`) or has capitals (`Inbox` on PostgreSQL) means the
    /// same table in the migration, the handlers, the startup check and the purge. Names are
    /// validated ([`InboxSchema::validate_identifier`](crate::InboxSchema::validate_identifier)): letters, digits and `_` only.
    pub fn quote(self, identifier: &str) -> String {
        match self {
            Backend::Mysql => format!("`{identifier}`"),
            Backend::Postgres | Backend::Sqlite => format!("\"{identifier}\""),
        }
    }

    /// A table name, optionally qualified (`billing.inbox`), quoted part by part.
    pub fn quote_table(self, table: &str) -> String {
        table
            .split('.')
            .map(|part| self.quote(part))
            .collect::<Vec<_>>()
            .join(".")
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
            Backend::Sqlite => "sqlite",
        })
    }
}

/// A name that is not `postgres`, `mysql` or `sqlite`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownBackend(pub String);

impl fmt::Display for UnknownBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown backend `{}`: the backends are postgres, mysql (also for MariaDB) and sqlite",
            self.0
        )
    }
}

impl std::error::Error for UnknownBackend {}

impl FromStr for Backend {
    type Err = UnknownBackend;

    /// `postgres` (or `postgresql`, `pg`), `mysql` (or `mariadb`), `sqlite`.
    fn from_str(name: &str) -> Result<Self, UnknownBackend> {
        match name.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" | "pg" => Ok(Backend::Postgres),
            "mysql" | "mariadb" => Ok(Backend::Mysql),
            "sqlite" => Ok(Backend::Sqlite),
            _ => Err(UnknownBackend(name.to_owned())),
        }
    }
}
