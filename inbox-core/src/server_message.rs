//! Reading database errors: the one place that knows what each server writes.
//!
//! A database driver reports an error as a kind (unique violation, serialization failure, …),
//! sometimes the name of the violated constraint (only PostgreSQL fills it), and a message.
//! [`ServerError::classify`] turns those into an [`ErrorClass`]. Where the constraint name is
//! missing, it is read from the message:
//!
//! | server | unique-violation message |
//! |---|---|
//! | SQLite | `UNIQUE constraint failed: inbox.message_id, inbox.consumer` (columns), or `UNIQUE constraint failed: index 'name'` (expression index) |
//! | MySQL ≥ 8.0.19 | ``Duplicate entry '…' for key 'inbox.ux_inbox_message_consumer'`` |
//! | MariaDB, MySQL < 8.0.19 | ``Duplicate entry '…' for key 'ux_inbox_message_consumer'`` |
//!
//! The value in a MySQL message is not escaped (it may contain quotes) and may be cut short,
//! so the key name is read from the end of the message.
//!
//! ```
//! use inbox_core::server_message::{ServerError, ServerErrorKind};
//! use inbox_core::{ErrorClass, InboxSchema};
//!
//! let mariadb = ServerError {
//!     kind: ServerErrorKind::UniqueViolation,
//!     constraint: None,
//!     table: None,
//!     message: "Duplicate entry 'it's-credit' for key 'ux_inbox_message_consumer'",
//! };
//! assert_eq!(mariadb.classify(&InboxSchema::DEFAULT), ErrorClass::InboxDuplicate);
//!
//! let business = ServerError {
//!     kind: ServerErrorKind::UniqueViolation,
//!     constraint: None,
//!     table: None,
//!     message: "UNIQUE constraint failed: accounts.email",
//! };
//! assert_eq!(
//!     business.classify(&InboxSchema::DEFAULT),
//!     ErrorClass::UniqueViolation { constraint: Some("accounts.email".into()) }
//! );
//! ```

use crate::{ErrorClass, InboxSchema, TransientKind};

/// The parts of a database error the classifier reads, as a driver reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerError<'a> {
    /// The driver's kind of error.
    pub kind: ServerErrorKind,
    /// The violated constraint or index, when the driver reports it (PostgreSQL).
    pub constraint: Option<&'a str>,
    /// The table of the violated constraint, when the driver reports it (PostgreSQL), without
    /// its schema.
    pub table: Option<&'a str>,
    /// The server's message.
    pub message: &'a str,
}

/// The kinds of database error a driver distinguishes (diesel's `DatabaseErrorKind`, minus
/// the kinds that need no decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerErrorKind {
    /// A unique or primary-key violation.
    UniqueViolation,
    /// A serialization failure.
    SerializationFailure,
    /// The connection was closed or a command could not be sent.
    ConnectionLost,
    /// The session or transaction can only read (PostgreSQL `25006`, MySQL and MariaDB
    /// `1792`), named by the driver's code.
    ReadOnly,
    /// A `NOT NULL` column given `NULL` (PostgreSQL `23502`, MySQL and MariaDB `1048`,
    /// `1364`), named by the driver's code.
    NotNullViolation,
    /// Any other kind; the message decides.
    Other,
}

/// A unique violation as SQLite reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqliteUnique<'a> {
    /// `UNIQUE constraint failed: t.a, t.b`: the table and the columns of the violated index.
    Columns {
        /// The table.
        table: &'a str,
        /// The indexed columns, in the order SQLite lists them.
        columns: Vec<&'a str>,
    },
    /// `UNIQUE constraint failed: index 'name'`: an index on expressions, named.
    Index(&'a str),
}

/// Reads SQLite's `UNIQUE constraint failed: …` message.
///
/// ```
/// use inbox_core::server_message::{sqlite_unique_violation, SqliteUnique};
///
/// assert_eq!(
///     sqlite_unique_violation("UNIQUE constraint failed: inbox.message_id, inbox.consumer"),
///     Some(SqliteUnique::Columns { table: "inbox", columns: vec!["message_id", "consumer"] })
/// );
/// ```
pub fn sqlite_unique_violation(message: &str) -> Option<SqliteUnique<'_>> {
    let rest = message.strip_prefix("UNIQUE constraint failed: ")?;
    if let Some(index) = rest.strip_prefix("index '") {
        return index.strip_suffix('\'').map(SqliteUnique::Index);
    }
    let mut table = None;
    let mut columns = Vec::new();
    for qualified in rest.split(", ") {
        let (t, column) = qualified.rsplit_once('.')?;
        if *table.get_or_insert(t) != t {
            return None;
        }
        columns.push(column);
    }
    Some(SqliteUnique::Columns {
        table: table?,
        columns,
    })
}

/// A duplicate-key index as MySQL or MariaDB names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MysqlKey<'a> {
    /// The table, when the server qualifies the key with it (MySQL ≥ 8.0.19).
    pub table: Option<&'a str>,
    /// The index name (`PRIMARY` for the primary key).
    pub name: &'a str,
}

/// Reads the key name from MySQL's or MariaDB's `Duplicate entry '…' for key '…'` (error 1062).
///
/// ```
/// use inbox_core::server_message::{mysql_duplicate_key, MysqlKey};
///
/// let mysql8 = "Duplicate entry 'a' for key 'inbox.ux_inbox_message_consumer'";
/// assert_eq!(
///     mysql_duplicate_key(mysql8),
///     Some(MysqlKey { table: Some("inbox"), name: "ux_inbox_message_consumer" })
/// );
/// ```
pub fn mysql_duplicate_key(message: &str) -> Option<MysqlKey<'_>> {
    if !message.starts_with("Duplicate entry '") {
        return None;
    }
    let (_, key) = message.rsplit_once(" for key '")?;
    let key = key.strip_suffix('\'')?;
    Some(match key.rsplit_once('.') {
        Some((table, name)) => MysqlKey {
            table: Some(table),
            name,
        },
        None => MysqlKey {
            table: None,
            name: key,
        },
    })
}

impl ServerError<'_> {
    /// What the error means for an idempotent handler using `schema`.
    pub fn classify(&self, schema: &InboxSchema) -> ErrorClass {
        match self.kind {
            ServerErrorKind::UniqueViolation => self.classify_unique(schema),
            // diesel reports MySQL's deadlock (1213) as a serialization failure.
            ServerErrorKind::SerializationFailure if is_deadlock(self.message) => {
                ErrorClass::Transient(TransientKind::Deadlock)
            }
            ServerErrorKind::SerializationFailure => {
                ErrorClass::Transient(TransientKind::SerializationFailure)
            }
            ServerErrorKind::ConnectionLost => ErrorClass::ConnectionLost,
            ServerErrorKind::ReadOnly => ErrorClass::ReadOnly,
            ServerErrorKind::NotNullViolation => ErrorClass::Other,
            // Some paths report a unique violation without its kind (diesel's MySQL
            // `batch_execute`); `violated_index` reads it from the message.
            ServerErrorKind::Other => match self.violated_index() {
                Some(index) => Self::classify_index(index, schema),
                None => classify_message(self.message),
            },
        }
    }

    fn classify_unique(&self, schema: &InboxSchema) -> ErrorClass {
        match self.violated_index() {
            Some(index) => Self::classify_index(index, schema),
            None => ErrorClass::UniqueViolation { constraint: None },
        }
    }

    /// The violation of `index`: the inbox's duplicate, or a business constraint by name.
    fn classify_index(index: ViolatedIndex<'_>, schema: &InboxSchema) -> ErrorClass {
        if index.is(
            schema.table_name(),
            schema.constraint(),
            &InboxSchema::KEY_COLUMNS,
        ) {
            return ErrorClass::InboxDuplicate;
        }
        let constraint = match index {
            // Another key of the inbox table itself: its name alone, as the server knows it.
            ViolatedIndex::Named {
                table: Some(table),
                name,
                ..
            } if table == schema.table_name() => name.to_owned(),
            other => other.to_string(),
        };
        ErrorClass::UniqueViolation {
            constraint: Some(constraint),
        }
    }

    /// The unique index a unique violation names, as far as the server says: by name
    /// (PostgreSQL's constraint name, MySQL's key name, SQLite's expression index) or by table
    /// and columns (SQLite). `None` when the error is no unique violation or names nothing.
    ///
    /// ```
    /// use inbox_core::server_message::{ServerError, ServerErrorKind};
    ///
    /// let sqlite = ServerError {
    ///     kind: ServerErrorKind::UniqueViolation,
    ///     constraint: None,
    ///     table: None,
    ///     message: "UNIQUE constraint failed: users.email",
    /// };
    /// let index = sqlite.violated_index().unwrap();
    /// assert!(index.is("users", "ux_users_email", &["email"]));
    /// assert_eq!(index.to_string(), "users.email");
    /// ```
    pub fn violated_index(&self) -> Option<ViolatedIndex<'_>> {
        let unique = match self.kind {
            ServerErrorKind::UniqueViolation => true,
            ServerErrorKind::Other => {
                mysql_duplicate_key(self.message).is_some()
                    || sqlite_unique_violation(self.message).is_some()
            }
            _ => false,
        };
        if !unique {
            return None;
        }
        if let Some(name) = self.constraint {
            return Some(ViolatedIndex::Named {
                table: None,
                name,
                on: self.table,
            });
        }
        if let Some(key) = mysql_duplicate_key(self.message) {
            return Some(ViolatedIndex::Named {
                table: key.table,
                name: key.name,
                on: None,
            });
        }
        match sqlite_unique_violation(self.message)? {
            SqliteUnique::Columns { table, columns } => {
                Some(ViolatedIndex::Columns { table, columns })
            }
            SqliteUnique::Index(name) => Some(ViolatedIndex::Named {
                table: None,
                name,
                on: None,
            }),
        }
    }
}

/// A violated unique index, as the server named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViolatedIndex<'a> {
    /// By name; with its table where the server qualifies it (MySQL ≥ 8.0.19).
    Named {
        /// The table, when the server qualifies the name with it.
        table: Option<&'a str>,
        /// The index or constraint (MySQL: `PRIMARY` for the primary key).
        name: &'a str,
        /// The table, when the server reports it beside the name (PostgreSQL): checked, not
        /// shown.
        on: Option<&'a str>,
    },
    /// By table and indexed columns (SQLite, which does not name the index).
    Columns {
        /// The table.
        table: &'a str,
        /// The indexed columns, in index order.
        columns: Vec<&'a str>,
    },
}

impl ViolatedIndex<'_> {
    /// Whether this is the unique index `name` on `table` (qualified or not), whose columns
    /// are `columns` — the name decides where the server gives one, checked against the table
    /// where the server names that too (PostgreSQL always, MySQL ≥ 8.0.19); the table and the
    /// columns where it names no index (SQLite). Servers name a table without its schema, so
    /// `billing.inbox` and `archive.inbox` with indexes of the same name are not told apart.
    pub fn is(&self, table: &str, name: &str, columns: &[&str]) -> bool {
        let table = table.rsplit('.').next().unwrap_or(table);
        match self {
            // PostgreSQL reports the table beside the name and compares names exactly; MySQL,
            // MariaDB and SQLite compare index names without regard to case (their catalogs
            // find `UX_INBOX_MESSAGE_CONSUMER` for `ux_inbox_message_consumer`), and so does
            // this. Table names keep their case: MySQL on Linux compares them exactly.
            ViolatedIndex::Named {
                table: t,
                name: n,
                on: Some(on),
            } => *n == name && t.unwrap_or(on) == table,
            ViolatedIndex::Named {
                table: t,
                name: n,
                on: None,
            } => n.eq_ignore_ascii_case(name) && t.is_none_or(|t| t == table),
            ViolatedIndex::Columns {
                table: t,
                columns: c,
            } => *t == table && c == columns,
        }
    }
}

/// `name`, `table.name`, or `table.a, b` for columns.
impl std::fmt::Display for ViolatedIndex<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ViolatedIndex::Named {
                table: Some(table),
                name,
                ..
            } => write!(f, "{table}.{name}"),
            ViolatedIndex::Named {
                table: None, name, ..
            } => f.write_str(name),
            ViolatedIndex::Columns { table, columns } => {
                write!(f, "{table}.{}", columns.join(", "))
            }
        }
    }
}

/// MariaDB's deadlock (1213) in each language it ships (`errmsg-utf8.txt`, 10.11; the text
/// before its first punctuation): MariaDB writes a deadlock in the *server's* language
/// (`--lc-messages`), whatever the session set, and its text protocol gives no error number.
/// The runtime also knows it by the transaction the server ended; this reads it in an error
/// whoever classifies it — an application's own error type that carries the diesel error.
const MARIADB_DEADLOCK: [&str; 14] = [
    "试图锁定时发现僵局",
    "Lukustamisel tekkis tupik (deadlock)",
    "Deadlock découvert en essayant d'obtenir les verrous",
    "Beim Versuch, eine Sperre anzufordern, ist ein Deadlock aufgetreten",
    "ჩიხი ბლოკის მიღების მცდელობისას",
    "Trovato deadlock durante il lock",
    "ロック取得中にデッドロックが検出されました",
    "Deadlock gevonden tijdens lock-aanvraag poging",
    "Encontrado um travamento fatal (deadlock) quando tentava obter uma trava",
    "Возникла тупиковая ситуация в процессе получения блокировки",
    "Unakrsno zaključavanje pronađeno kada sam pokušao da dobijem pravo na zaključavanje",
    "Encontrado estancamiento (deadlock) al intentar obtener el bloqueo",
    "Fick 'DEADLOCK' vid låsförsök av block/rad",
    "Взаємне блокування знайдено під час спроби отримати блокування",
];

fn is_deadlock(message: &str) -> bool {
    message.contains("deadlock detected") || message.contains("Deadlock found")
}

/// Errors that drivers report without a kind of their own, recognised by the server's
/// English message: `inbox-diesel`'s startup check sets each session's messages to English
/// (`lc_messages`), since diesel reports no code for these. Checked against messages
/// captured from the servers in the tests.
fn classify_message(message: &str) -> ErrorClass {
    const TRANSIENT: [(&str, TransientKind); 14] = [
        // MariaDB 1020 with `innodb_snapshot_isolation` (the default from 11.6): a row read
        // by the transaction changed under it — MariaDB's serialization failure.
        (
            "Record has changed since last read",
            TransientKind::SerializationFailure,
        ),
        // PostgreSQL 40P01 (diesel reports no kind for it).
        ("deadlock detected", TransientKind::Deadlock),
        // MySQL / MariaDB 1213.
        (
            "Deadlock found when trying to get lock",
            TransientKind::Deadlock,
        ),
        // MySQL / MariaDB 1205.
        ("Lock wait timeout exceeded", TransientKind::LockWaitTimeout),
        // PostgreSQL 55P03: `lock_timeout`, and a row or table locked under `NOWAIT`.
        (
            "canceling statement due to lock timeout",
            TransientKind::LockWaitTimeout,
        ),
        ("could not obtain lock on ", TransientKind::LockWaitTimeout),
        // MySQL 3572: `FOR UPDATE NOWAIT` on a locked row.
        (
            "lock(s) could not be acquired immediately and NOWAIT is set",
            TransientKind::LockWaitTimeout,
        ),
        // PostgreSQL 57014, by `statement_timeout` or by `pg_cancel_backend`.
        (
            "canceling statement due to statement timeout",
            TransientKind::StatementTimeout,
        ),
        (
            "canceling statement due to user request",
            TransientKind::Canceled,
        ),
        // MariaDB 1969 (`max_statement_time`), MySQL 3024 (`max_execution_time`).
        (
            "max_statement_time exceeded",
            TransientKind::StatementTimeout,
        ),
        (
            "maximum statement execution time exceeded",
            TransientKind::StatementTimeout,
        ),
        // MySQL / MariaDB 1317 (`KILL QUERY`), after the timeouts that share its text.
        ("Query execution was interrupted", TransientKind::Canceled),
        // SQLite SQLITE_BUSY, and SQLITE_LOCKED ("database table is locked: t").
        ("database is locked", TransientKind::Busy),
        ("table is locked", TransientKind::Busy),
    ];
    if let Some((_, kind)) = TRANSIENT.iter().find(|(m, _)| message.contains(m)) {
        return ErrorClass::Transient(*kind);
    }
    if MARIADB_DEADLOCK.iter().any(|m| message.contains(m)) {
        return ErrorClass::Transient(TransientKind::Deadlock);
    }
    // PostgreSQL 25P02: a statement ran after an earlier one failed in the same transaction.
    if message.starts_with("current transaction is aborted") {
        return ErrorClass::TransactionAborted;
    }
    const CONNECTION_LOST: [&str; 21] = [
        // PostgreSQL 57P01 (a terminated backend), libpq and tokio-postgres.
        "terminating connection due to administrator command",
        // PostgreSQL 25P03 (14+): the session sat idle in its transaction past
        // `idle_in_transaction_session_timeout`.
        "terminating connection due to idle-in-transaction timeout",
        "server closed the connection unexpectedly",
        "connection to server was lost",
        "no connection to the server",
        "connection closed",
        "error communicating with the server",
        // MySQL / MariaDB 2006, 2013, 1927 (a killed connection), 2002/2003.
        "server has gone away",
        "Lost connection to",
        "Connection was killed",
        // MariaDB Galera 1047 on a node outside the cluster's primary component (partitioned,
        // or `wsrep_reject_queries`), and a commit's replication refused there: another node
        // takes the message.
        "WSREP has not yet prepared node for application use",
        "Not connected to Primary Component",
        // MySQL / MariaDB 1053; PostgreSQL 57P02 (another backend crashed) and 57P03 (a
        // server starting, stopping or recovering).
        "Server shutdown in progress",
        "terminating connection because of crash of another server process",
        "the database system is ",
        "Can't connect to",
        // mysql_async: a reset, a broken pipe, and a session the server ended (`KILL`) read
        // on its next statement.
        "Connection reset by peer",
        "broken pipe",
        "Connection to the server is closed",
        // mysql_async: a packet the connection could not read, or an answer that does not
        // fit the statement sent — its protocol out of step, a statement cut off in the
        // middle by a cancelled future: the connection must go.
        "Input/output error: ",
        "Driver error: `Statement takes ",
    ];
    // Before the schema's "does not exist": PostgreSQL 26000 reads `prepared statement "…"
    // does not exist`; MySQL and MariaDB 1243. PostgreSQL 42P05, `prepared statement "…"
    // already exists`: a server connection shared behind a transaction-mode pooler, where
    // another client's statement took the name diesel's cache gives its own. PostgreSQL
    // 0A000 `cached plan must not change result type`: a column a statement diesel cached
    // reads changed its type since (a migration while consumers run) — the same statement
    // unprepared runs. MySQL / MariaDB 1412 `Table definition has changed, please retry
    // transaction`: a table the transaction's snapshot reads was rebuilt since the snapshot
    // began (`OPTIMIZE TABLE`, `ALTER … FORCE`, a copying `ALTER`, `TRUNCATE`, an online
    // schema change's `RENAME` cut-over) — the statement diesel cached for it then waits,
    // executed again on the session, for an answer that never comes; and 1615 `Prepared
    // statement needs to be re-prepared`. PostgreSQL 08P01 `bind message supplies 3
    // parameters, but prepared statement "__diesel_stmt_4" requires 2`: behind a
    // transaction-mode pooler with diesel's statement cache on, another client's statement
    // of that name on the server connection. The attempt runs again, its statements
    // unprepared. Each of the three names diesel's statement (`__diesel_stmt_<n>`), in
    // whatever language the server speaks (its quotes are the language's: `»…«`, `"…"`):
    // nothing else names one, so the name is enough where the text is not English — a
    // pooler's server session the check never set English on, a reset (`DISCARD ALL`)
    // that dropped both the statements and the English (an operator's trial: a Japanese
    // server, every delivery an alert).
    if message.contains("__diesel_stmt_")
        || (message.starts_with("prepared statement \"")
            && (message.ends_with("\" does not exist") || message.ends_with("\" already exists")))
        || (message.starts_with("bind message supplies ")
            && message.contains(" parameters, but prepared statement \""))
        || message.starts_with("Unknown prepared statement handler")
        || message.starts_with("cached plan must not change result type")
        || message.starts_with("Table definition has changed, please retry transaction")
        || message.starts_with("Prepared statement needs to be re-prepared")
    {
        return ErrorClass::StatementLost;
    }
    const READ_ONLY: [&str; 4] = [
        // PostgreSQL 25006: a replica, `default_transaction_read_only`, `SET TRANSACTION
        // READ ONLY`.
        "in a read-only transaction",
        // MySQL and MariaDB 1792.
        "Cannot execute statement in a READ ONLY transaction",
        // MySQL and MariaDB 1290 (`--read-only`, `--super-read-only`).
        "server is running with the --read-only option",
        "server is running with the --super-read-only option",
    ];
    if READ_ONLY.iter().any(|m| message.contains(m)) {
        return ErrorClass::ReadOnly;
    }
    const PERMISSION_DENIED: [&str; 8] = [
        // PostgreSQL 42501 (`permission denied for table inbox`, `… for schema …`).
        "permission denied for ",
        // MySQL and MariaDB 1142, 1143, 1044; 1227, a privilege the statement needs.
        " command denied to user ",
        "Access denied for user",
        "Access denied; you need",
        // MariaDB and MySQL 1820: the account's password expired while it was connected
        // (`ALTER USER … PASSWORD EXPIRE`, a password lifetime): every statement but the
        // password's change is refused until an operator sets one.
        "You must SET PASSWORD before executing this statement",
        "You must reset your password using ALTER USER",
        // SQLite SQLITE_READONLY: a file the process may not write, or opened read-only.
        "attempt to write a readonly database",
        // SQLite SQLITE_AUTH.
        "not authorized",
    ];
    if PERMISSION_DENIED.iter().any(|m| message.contains(m)) {
        return ErrorClass::PermissionDenied;
    }
    const RESOURCE_EXHAUSTED: [&str; 11] = [
        // PostgreSQL 53200 (memory; the lock table, `max_locks_per_transaction`), 53100
        // (disk: "could not extend file …: No space left on device"), 53400 (a role's or
        // database's `temp_file_limit`).
        "out of shared memory",
        "out of memory",
        "No space left on device",
        "temporary file size exceeds temp_file_limit",
        // MariaDB 1290 under `max_session_mem_used`; MySQL and MariaDB 1197, a transaction
        // larger than `max_binlog_cache_size`.
        "--max-session-mem-used",
        "bytes of storage; increase this",
        // MySQL and MariaDB 1226: the account's `MAX_QUERIES_PER_HOUR`,
        // `MAX_UPDATES_PER_HOUR` spent, until the hour ends or an operator raises it.
        "' resource (current value: ",
        // MySQL and MariaDB 1041 ("Out of memory; …"), 1038 ("Out of sort memory"), 1021
        // ("Disk full"), 1114 ("The table '…' is full").
        "Out of memory",
        "Out of sort memory",
        "Disk full",
        // MySQL and MariaDB 1461: the server's prepared statements at
        // `max_prepared_stmt_count`, every session's together ("Can't create more than
        // max_prepared_stmt_count statements (current value: 16382)").
        "max_prepared_stmt_count statements",
    ];
    if RESOURCE_EXHAUSTED.iter().any(|m| message.contains(m))
        || (message.starts_with("The table '") && message.ends_with("' is full"))
    {
        return ErrorClass::ResourceExhausted;
    }
    // MySQL and MariaDB 1665 (`binlog_format = STATEMENT` under `READ COMMITTED` or `READ
    // UNCOMMITTED`), 1662–1664 and 1666 (a statement or engine the binary log's format
    // cannot take): "Cannot execute statement: impossible to write to binary log since …".
    // PgBouncer in statement mode (`pool_mode = statement`), which allows no transaction and
    // closes the client: its `FATAL`, in English whatever the server speaks.
    if message.contains("impossible to write to binary log")
        || message.contains("transaction blocks not allowed in statement pooling mode")
    {
        return ErrorClass::ServerSetting;
    }
    let lower = message.to_ascii_lowercase();
    if CONNECTION_LOST
        .iter()
        .any(|m| lower.contains(&m.to_ascii_lowercase()))
    {
        return ErrorClass::ConnectionLost;
    }
    const SCHEMA: [&str; 9] = [
        // PostgreSQL 42P01, 42703; 42P10, an `ON CONFLICT` without its unique index.
        "does not exist",
        "no unique or exclusion constraint matching the ON CONFLICT",
        // MySQL / MariaDB 1146, 1054.
        "doesn't exist",
        "Unknown column",
        // SQLite (an insert names a column the table lacks: "has no column named").
        "no such table",
        "no such column",
        "has no column named",
        "ON CONFLICT clause does not match any PRIMARY KEY or UNIQUE constraint",
        // PostgreSQL 55000: a table a publication publishes updates or deletes of, without a
        // replica identity (no primary key, `REPLICA IDENTITY NOTHING`).
        "does not have a replica identity",
    ];
    if SCHEMA.iter().any(|m| message.contains(m)) {
        return ErrorClass::Schema;
    }
    ErrorClass::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unique(message: &str) -> ErrorClass {
        ServerError {
            kind: ServerErrorKind::UniqueViolation,
            constraint: None,
            table: None,
            message,
        }
        .classify(&InboxSchema::DEFAULT)
    }

    #[test]
    fn sqlite_needs_exactly_the_inbox_columns_of_the_inbox_table() {
        assert_eq!(
            unique("UNIQUE constraint failed: inbox.message_id, inbox.consumer"),
            ErrorClass::InboxDuplicate
        );
        assert_eq!(
            unique("UNIQUE constraint failed: inbox.id"),
            ErrorClass::UniqueViolation {
                constraint: Some("inbox.id".into())
            }
        );
        assert_eq!(
            unique("UNIQUE constraint failed: inbox.message_id"),
            ErrorClass::UniqueViolation {
                constraint: Some("inbox.message_id".into())
            }
        );
        assert_eq!(
            unique("UNIQUE constraint failed: inbox_archive.message_id, inbox_archive.consumer"),
            ErrorClass::UniqueViolation {
                constraint: Some("inbox_archive.message_id, consumer".into())
            }
        );
        assert_eq!(
            unique("UNIQUE constraint failed: index 'ux_inbox_message_consumer'"),
            ErrorClass::InboxDuplicate
        );
    }

    #[test]
    fn mysql_key_names_are_read_from_the_end() {
        // The value may contain the text of a key clause and quotes of its own.
        let tricky = "Duplicate entry 'x' for key 'ux_inbox_message_consumer'-credit' \
                      for key 'accounts.ux_accounts_email'";
        assert_eq!(
            unique(tricky),
            ErrorClass::UniqueViolation {
                constraint: Some("accounts.ux_accounts_email".into())
            }
        );
        // MySQL 8 qualifies with the table: another table's index of the same name is not ours.
        assert_eq!(
            unique("Duplicate entry 'a-b' for key 'archive.ux_inbox_message_consumer'"),
            ErrorClass::UniqueViolation {
                constraint: Some("archive.ux_inbox_message_consumer".into())
            }
        );
        assert_eq!(
            unique("Duplicate entry '42' for key 'PRIMARY'"),
            ErrorClass::UniqueViolation {
                constraint: Some("PRIMARY".into())
            }
        );
        assert_eq!(mysql_duplicate_key("Duplicate entry 'a' for key"), None);
    }

    #[test]
    fn postgres_constraint_name_wins_over_the_message() {
        let pg = ServerError {
            kind: ServerErrorKind::UniqueViolation,
            constraint: Some("accounts_email_key"),
            table: None,
            message: "duplicate key value violates unique constraint \"accounts_email_key\"",
        };
        assert_eq!(
            pg.classify(&InboxSchema::DEFAULT),
            ErrorClass::UniqueViolation {
                constraint: Some("accounts_email_key".into())
            }
        );
        assert_eq!(
            unique("no recognisable text"),
            ErrorClass::UniqueViolation { constraint: None }
        );
    }

    #[test]
    fn custom_schema_names_are_matched() {
        let schema = InboxSchema::new("billing.events_inbox", "ux_events").unwrap();
        let sqlite = ServerError {
            kind: ServerErrorKind::UniqueViolation,
            constraint: None,
            table: None,
            message: "UNIQUE constraint failed: events_inbox.message_id, events_inbox.consumer",
        };
        assert_eq!(sqlite.classify(&schema), ErrorClass::InboxDuplicate);
        let pg_default_name = ServerError {
            constraint: Some("ux_inbox_message_consumer"),
            ..sqlite
        };
        assert!(matches!(
            pg_default_name.classify(&schema),
            ErrorClass::UniqueViolation { .. }
        ));
    }

    #[test]
    fn unique_violations_reported_without_their_kind() {
        let other = ServerError {
            kind: ServerErrorKind::Other,
            constraint: None,
            table: None,
            message: "Duplicate entry 'x' for key 'ux_inbox_message_consumer'",
        };
        assert_eq!(
            other.classify(&InboxSchema::DEFAULT),
            ErrorClass::InboxDuplicate
        );
    }

    #[test]
    fn messages_without_a_kind() {
        let other = |message| {
            ServerError {
                kind: ServerErrorKind::Other,
                constraint: None,
                table: None,
                message,
            }
            .classify(&InboxSchema::DEFAULT)
        };
        assert_eq!(
            other("deadlock detected"),
            ErrorClass::Transient(TransientKind::Deadlock)
        );
        assert_eq!(
            other("Deadlock found when trying to get lock; try restarting transaction"),
            ErrorClass::Transient(TransientKind::Deadlock)
        );
        // MariaDB's deadlock in the server's language, as the server writes it.
        for translation in MARIADB_DEADLOCK {
            let message = format!("{translation}; try restarting the transaction");
            assert_eq!(
                other(Box::leak(message.into_boxed_str())),
                ErrorClass::Transient(TransientKind::Deadlock),
                "{translation}"
            );
        }
        assert_eq!(
            other("Lock wait timeout exceeded; try restarting transaction"),
            ErrorClass::Transient(TransientKind::LockWaitTimeout)
        );
        assert_eq!(
            other("database is locked"),
            ErrorClass::Transient(TransientKind::Busy)
        );
        assert_eq!(
            other("database table is locked: inbox"),
            ErrorClass::Transient(TransientKind::Busy)
        );
        assert_eq!(
            other(
                "current transaction is aborted, commands ignored until end of transaction block"
            ),
            ErrorClass::TransactionAborted
        );
        assert_eq!(
            other("Query execution was interrupted (max_statement_time exceeded)"),
            ErrorClass::Transient(TransientKind::StatementTimeout)
        );
        assert_eq!(
            other("Query execution was interrupted, maximum statement execution time exceeded"),
            ErrorClass::Transient(TransientKind::StatementTimeout)
        );
        // The inbox's unique index gone under a connection that had checked the table.
        assert_eq!(
            other(
                "there is no unique or exclusion constraint matching the ON CONFLICT specification"
            ),
            ErrorClass::Schema
        );
        assert_eq!(
            other("ON CONFLICT clause does not match any PRIMARY KEY or UNIQUE constraint"),
            ErrorClass::Schema
        );
        assert_eq!(
            other("syntax error at or near \"SELEC\""),
            ErrorClass::Other
        );
        // Captured from PostgreSQL 15 and MariaDB 10.11; 1290 and 1243 as MySQL writes them.
        for (message, class) in [
            (
                "cannot execute INSERT in a read-only transaction",
                ErrorClass::ReadOnly,
            ),
            (
                "Cannot execute statement in a READ ONLY transaction",
                ErrorClass::ReadOnly,
            ),
            (
                "The MySQL server is running with the --read-only option so it cannot \
                 execute this statement",
                ErrorClass::ReadOnly,
            ),
            (
                "The MariaDB server is running with the --read-only option so it cannot \
                 execute this statement",
                ErrorClass::ReadOnly,
            ),
            (
                "Cannot execute statement: impossible to write to binary log since \
                 BINLOG_FORMAT = STATEMENT and at least one table uses a storage engine \
                 limited to row-based logging. InnoDB is limited to row-logging when \
                 transaction isolation level is READ COMMITTED or READ UNCOMMITTED.",
                ErrorClass::ServerSetting,
            ),
            (
                "permission denied for table inbox",
                ErrorClass::PermissionDenied,
            ),
            (
                "You must SET PASSWORD before executing this statement",
                ErrorClass::PermissionDenied,
            ),
            (
                "You must reset your password using ALTER USER statement before executing \
                 this statement.",
                ErrorClass::PermissionDenied,
            ),
            (
                "INSERT command denied to user 'app'@'127.0.0.1' for table `test`.`inbox`",
                ErrorClass::PermissionDenied,
            ),
            (
                "attempt to write a readonly database",
                ErrorClass::PermissionDenied,
            ),
            (
                "prepared statement \"__diesel_stmt_3\" does not exist",
                ErrorClass::StatementLost,
            ),
            (
                "Unknown prepared statement handler (7) given to mysqld_stmt_execute",
                ErrorClass::StatementLost,
            ),
            // 26000, 42P05 and 08P01 in other languages: diesel's statement named.
            (
                "vorbereitete Anweisung »__diesel_stmt_1« existiert nicht",
                ErrorClass::StatementLost,
            ),
            (
                "準備された文\"__diesel_stmt_1\"は存在しません",
                ErrorClass::StatementLost,
            ),
            (
                "la instrucción preparada «__diesel_stmt_0» ya existe",
                ErrorClass::StatementLost,
            ),
            (
                "Record has changed since last read in table 'accounts'",
                ErrorClass::Transient(TransientKind::SerializationFailure),
            ),
            // Not a statement: a table, which is the schema's.
            ("relation \"inbox\" does not exist", ErrorClass::Schema),
            // Faults a redelivery processes: PostgreSQL 55P03 under NOWAIT, 57014 by
            // `pg_cancel_backend`, 42P05 behind a transaction-mode pooler; MySQL 3572 and
            // 1317 (`KILL QUERY`).
            (
                "could not obtain lock on row in relation \"accounts\"",
                ErrorClass::Transient(TransientKind::LockWaitTimeout),
            ),
            (
                "canceling statement due to user request",
                ErrorClass::Transient(TransientKind::Canceled),
            ),
            (
                "prepared statement \"__diesel_stmt_0\" already exists",
                ErrorClass::StatementLost,
            ),
            (
                "bind message supplies 3 parameters, but prepared statement \"__diesel_stmt_4\" \
                 requires 2",
                ErrorClass::StatementLost,
            ),
            (
                "Statement aborted because lock(s) could not be acquired immediately and \
                 NOWAIT is set.",
                ErrorClass::Transient(TransientKind::LockWaitTimeout),
            ),
            (
                "Query execution was interrupted",
                ErrorClass::Transient(TransientKind::Canceled),
            ),
            (
                "Query execution was interrupted (max_statement_time exceeded)",
                ErrorClass::Transient(TransientKind::StatementTimeout),
            ),
            (
                "the database system is shutting down",
                ErrorClass::ConnectionLost,
            ),
            // Captured from a partitioned MariaDB Galera node.
            (
                "WSREP has not yet prepared node for application use",
                ErrorClass::ConnectionLost,
            ),
            (
                "Error while appending streaming replication fragment(provider status: Not \
                 connected to Primary Component)",
                ErrorClass::ConnectionLost,
            ),
        ] {
            assert_eq!(other(message), class, "{message}");
        }
    }

    /// What each driver says when the server has ended the session (a terminated backend, a
    /// `KILL`), as seen from the next statement: the connection is lost, never "other" (which
    /// a pump dead-letters).
    #[test]
    fn a_session_ended_by_the_server_is_a_lost_connection() {
        for message in [
            "terminating connection due to administrator command",
            "server closed the connection unexpectedly",
            "Lost connection to server during query",
            "MySQL server has gone away",
            "Connection was killed",
            // MySQL / MariaDB 1053; PostgreSQL 57P02 (another backend crashed) and 57P03 (a
            // server starting, stopping or recovering).
            "Server shutdown in progress",
            "terminating connection because of crash of another server process",
            "the database system is ",
            // mysql_async (diesel-async's AsyncMysqlConnection) after a `KILL`.
            "Input/output error: Input/output error: Driver error: `Connection to the server is closed.'",
        ] {
            let error = ServerError {
                kind: ServerErrorKind::Other,
                constraint: None,
                table: None,
                message,
            };
            assert_eq!(
                error.classify(&InboxSchema::DEFAULT),
                ErrorClass::ConnectionLost,
                "{message}"
            );
        }
    }

    /// What a migration or an account's limit makes the server say, messages captured from
    /// PostgreSQL 15 and MariaDB 10.11: each is what a redelivery (or the same attempt, on a
    /// statement not prepared) gets past, or what an operator must act on — never "other",
    /// which a pump dead-letters.
    #[test]
    fn a_migration_or_a_limit_is_never_dead_lettered() {
        for (message, class) in [
            (
                "Table definition has changed, please retry transaction",
                ErrorClass::StatementLost,
            ),
            (
                "Prepared statement needs to be re-prepared",
                ErrorClass::StatementLost,
            ),
            (
                "cached plan must not change result type",
                ErrorClass::StatementLost,
            ),
            (
                "User 'app' has exceeded the 'max_updates_per_hour' resource (current value: 6)",
                ErrorClass::ResourceExhausted,
            ),
            ("out of shared memory", ErrorClass::ResourceExhausted),
            (
                "could not extend file \"base/5/16384\": No space left on device",
                ErrorClass::ResourceExhausted,
            ),
            ("The table 'credits' is full", ErrorClass::ResourceExhausted),
            (
                "Can't create more than max_prepared_stmt_count statements (current value: 3)",
                ErrorClass::ResourceExhausted,
            ),
            (
                "transaction blocks not allowed in statement pooling mode",
                ErrorClass::ServerSetting,
            ),
            (
                "temporary file size exceeds temp_file_limit (1024kB)",
                ErrorClass::ResourceExhausted,
            ),
            (
                "The MariaDB server is running with the --max-session-mem-used=8000000 option \
                 so it cannot execute this statement",
                ErrorClass::ResourceExhausted,
            ),
            (
                "Multi-statement transaction required more than 'max_binlog_cache_size' bytes \
                 of storage; increase this mariadbd variable and try again",
                ErrorClass::ResourceExhausted,
            ),
            (
                "cannot update table \"audit_log\" because it does not have a replica identity \
                 and publishes updates",
                ErrorClass::Schema,
            ),
        ] {
            let error = ServerError {
                kind: ServerErrorKind::Other,
                constraint: None,
                table: None,
                message,
            };
            assert_eq!(error.classify(&InboxSchema::DEFAULT), class, "{message}");
        }
    }
}
