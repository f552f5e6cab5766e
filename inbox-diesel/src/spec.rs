//! A handler's constant settings, as the expansion of `#[idempotent]` (or
//! [`handler::Handler`](crate::handler::Handler)) writes them: what every layer below the
//! runtime reads.

use inbox_core::{Consumer, InboxSchema, Isolation, RetryPolicy};

/// A handler's constant settings, written by the macro into a `static`.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct HandlerSpec {
    /// The consumer the markers are written for.
    pub consumer: Consumer,
    /// The inbox table and its unique index.
    pub schema: InboxSchema,
    /// How transient failures are retried.
    pub retry: RetryPolicy,
    /// The transaction's isolation level (PostgreSQL, MySQL, MariaDB).
    pub isolation: Isolation,
    /// How long a SQLite handler waits for another writer.
    pub sqlite_busy_timeout_ms: u32,
    /// Look for a completed marker, outside any transaction, before opening one.
    pub precheck: bool,
    /// How long the handler's transaction may sit idle before the server ends the session:
    /// PostgreSQL's `idle_in_transaction_session_timeout`, MariaDB's
    /// `idle_transaction_timeout` (in whole seconds, rounded up); 0 for no bound.
    pub idle_in_transaction_ms: u32,
    /// `on_locked = "in_flight"`: a marker another delivery holds uncommitted answers
    /// `InFlight` at once instead of being waited for.
    pub in_flight_when_locked: bool,
}

impl HandlerSpec {
    /// How long a SQLite handler waits for another writer before `SQLITE_BUSY`.
    pub const SQLITE_BUSY_TIMEOUT_MS: u32 = 5_000;

    /// How long a PostgreSQL handler's transaction may sit idle: what bounds the marker
    /// lock a handler cancelled mid-body leaves on a pooled connection.
    pub const IDLE_IN_TRANSACTION_MS: u32 = 10_000;

    /// `BEGIN` at the handler's isolation level, and the idle bound, in one round trip. The
    /// bound is the smaller of the handler's and the session's own (a role's or an
    /// operator's tighter `idle_in_transaction_session_timeout` stays), for the transaction
    /// only.
    pub fn postgres_begin_sql(&self) -> std::borrow::Cow<'static, str> {
        let mut sql: std::borrow::Cow<'static, str> = begin_sql(self.isolation).into();
        if self.idle_in_transaction_ms > 0 {
            let ms = self.idle_in_transaction_ms;
            sql = format!(
                "{sql}; SELECT set_config('idle_in_transaction_session_timeout', \
                 LEAST(NULLIF((EXTRACT(EPOCH FROM \
                 current_setting('idle_in_transaction_session_timeout')::interval) * 1000)::bigint, \
                 0), {ms})::text, true)"
            )
            .into();
        }
        if self.in_flight_when_locked {
            sql = format!("{sql}; {}", Self::POSTGRES_SHORT_LOCK_WAIT).into();
        }
        sql
    }

    /// PostgreSQL, `on_locked = "in_flight"`: the marker's insert waits for no lock; the
    /// session's own setting is kept, for the transaction, to be put back.
    pub const POSTGRES_SHORT_LOCK_WAIT: &'static str = "SELECT set_config('inbox.lock_timeout', \
        current_setting('lock_timeout'), true); SET LOCAL lock_timeout = '1ms'";
    /// PostgreSQL: lock waits as the session has them (its own `SET` included — `TO
    /// DEFAULT` would drop that), for the body.
    pub const POSTGRES_LOCK_WAIT: &'static str =
        "SELECT set_config('lock_timeout', current_setting('inbox.lock_timeout'), true)";
    /// MySQL, `on_locked = "in_flight"`: the shortest lock wait InnoDB takes, one second,
    /// the session's own kept to be put back.
    pub const MYSQL_SHORT_LOCK_WAIT: &'static str = "SET @inbox_lock_wait_timeout = \
        @@SESSION.innodb_lock_wait_timeout, SESSION innodb_lock_wait_timeout = 1";
    /// MySQL: the session's lock wait put back.
    pub const MYSQL_LOCK_WAIT: &'static str = "SET SESSION innodb_lock_wait_timeout = \
        IFNULL(@inbox_lock_wait_timeout, @@SESSION.innodb_lock_wait_timeout)";

    /// MySQL and MariaDB: what goes before `START TRANSACTION`, and it, in one round trip:
    /// the isolation level; on MariaDB the idle bound, the session's own kept to be put
    /// back ([`MARIADB_IDLE_RESTORE`](Self::MARIADB_IDLE_RESTORE)); with
    /// `on_locked = "in_flight"` the short lock wait.
    pub fn mysql_begin_sql(&self, mariadb: bool) -> std::borrow::Cow<'static, str> {
        let idle_bound = self.mariadb_idle_bound(mariadb);
        if !idle_bound
            && !self.in_flight_when_locked
            && set_transaction_sql(self.isolation).is_none()
        {
            return "START TRANSACTION".into();
        }
        let mut sql = String::new();
        if let Some(level) = set_transaction_sql(self.isolation) {
            sql.push_str(level);
            sql.push_str("; ");
        }
        if idle_bound {
            let seconds = self.idle_in_transaction_ms.div_ceil(1000);
            // The smaller of the handler's bound and the session's own, which stays.
            sql.push_str(&format!(
                "SET @inbox_idle_transaction_timeout = @@SESSION.idle_transaction_timeout, \
                 SESSION idle_transaction_timeout = \
                 IF(@@SESSION.idle_transaction_timeout BETWEEN 1 AND {seconds}, \
                 @@SESSION.idle_transaction_timeout, {seconds}); "
            ));
        }
        if self.in_flight_when_locked {
            sql.push_str(Self::MYSQL_SHORT_LOCK_WAIT);
            sql.push_str("; ");
        }
        sql.push_str("START TRANSACTION");
        sql.into()
    }

    /// MariaDB: the session's idle bound put back once the handler's transaction ended.
    /// A handler cancelled mid-body never sends it: its abandoned transaction keeps the
    /// bound, and the server ends it.
    pub const MARIADB_IDLE_RESTORE: &'static str =
        "SET SESSION idle_transaction_timeout = @inbox_idle_transaction_timeout";

    /// MariaDB: the restore before `COMMIT`, which fails (1242: a subquery of two rows, read
    /// only then) where the server has ended the transaction already — a deadlock or a Galera abort the body
    /// swallowed and went on after, its later writes committed on their own and the marker
    /// rolled back. A `COMMIT` there would answer success for nothing: the runtime reports
    /// the swallowed error instead ([`Error::TransactionAborted`](crate::Error)).
    pub const MARIADB_IDLE_RESTORE_IN_TRANSACTION: &'static str = "SET SESSION \
        idle_transaction_timeout = IF(@@in_transaction, @inbox_idle_transaction_timeout, \
        (SELECT 1 UNION ALL SELECT 2))";

    /// MariaDB: `ROLLBACK`, then the restore, in one round trip. Whatever the `ROLLBACK`
    /// answers, nothing commits; the restore runs after the transaction, outside it. (A
    /// `COMMIT` never shares its round trip: `backends/mysql.rs`, "A `COMMIT` alone".)
    pub const MARIADB_ROLLBACK_AND_RESTORE: &'static str =
        "ROLLBACK; SET SESSION idle_transaction_timeout = @inbox_idle_transaction_timeout";

    /// MariaDB with the idle bound on: what `begin` set that the transaction's end puts back.
    pub(crate) fn mariadb_idle_bound(&self, mariadb: bool) -> bool {
        mariadb && self.idle_in_transaction_ms > 0
    }
}

/// The statement that sets the level of the next transaction, before it begins (MySQL,
/// MariaDB); `None` for the server's default.
fn set_transaction_sql(level: Isolation) -> Option<&'static str> {
    match level {
        Isolation::ServerDefault => None,
        Isolation::ReadCommitted => Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED"),
        Isolation::RepeatableRead => Some("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"),
        Isolation::Serializable => Some("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"),
    }
}

/// The statement that opens a transaction at this level (PostgreSQL).
fn begin_sql(level: Isolation) -> &'static str {
    match level {
        Isolation::ServerDefault => "BEGIN",
        Isolation::ReadCommitted => "BEGIN ISOLATION LEVEL READ COMMITTED",
        Isolation::RepeatableRead => "BEGIN ISOLATION LEVEL REPEATABLE READ",
        Isolation::Serializable => "BEGIN ISOLATION LEVEL SERIALIZABLE",
    }
}
