//! A handler's constant settings, as the expansion of `#[idempotent]` (or
//! [`handler::Handler`](crate::handler::Handler)) writes them: what every layer below the
//! runtime reads.

use inbox_core::{Consumer, InboxSchema, Isolation, RetryPolicy};

/// [`HandlerSpec::POSTGRES_STILL_OURS`], as a literal: `COMMIT` is appended to it.
macro_rules! postgres_still_ours {
    () => {
        "SELECT CASE WHEN current_setting('inbox.transaction', true) = 'ours' THEN 1 \
         ELSE CAST('inbox: the handler''s transaction was ended in its body' \
         || coalesce(current_setting('inbox.transaction', true), '') AS integer) END"
    };
}

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

    /// PostgreSQL: fails inside a transaction block an earlier command opened, with
    /// [`OPEN_TRANSACTION`](crate::dialect::OPEN_TRANSACTION) in its message whatever the
    /// server's language. A statement outside one is its own transaction, begun with it,
    /// and one after `BEGIN` in the same simple-protocol message is in the block that
    /// `BEGIN` opened with the message: one message, one timestamp. The error's value
    /// carries the text, so that it reads the same in any language; `statement_timestamp()`
    /// in it keeps it from being folded into an error at planning.
    pub const POSTGRES_NONE_OPEN: &'static str = "SELECT CASE WHEN transaction_timestamp() = statement_timestamp() THEN 1 \
         ELSE CAST('inbox: a transaction is open on this session, since ' || \
         transaction_timestamp() AS integer) END";

    /// PostgreSQL, in the `BEGIN`'s round trip: the transaction named the handler's, by a
    /// setting that lives only in it (`set_config(…, true)`, gone at its end or rollback);
    /// and its commit durable — `synchronous_commit = off`, which the startup check refuses,
    /// set on the session since the check (by another user of a pooled connection, or
    /// another client's `SET` on a transaction-mode pooler's server session) is `on` for
    /// the transaction: a marker acknowledged to the broker and then lost in the server's
    /// crash would lose its message. Any other value (`local`, `remote_write`,
    /// `remote_apply`) is kept.
    pub const POSTGRES_OURS: &'static str = "SELECT set_config('inbox.transaction', 'ours', true), \
        set_config('synchronous_commit', CASE current_setting('synchronous_commit') \
        WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true)";

    /// PostgreSQL, in the `COMMIT`'s round trip, before it: fails unless the transaction open
    /// is the one the handler began ([`POSTGRES_OURS`](Self::POSTGRES_OURS)). A body that
    /// sent `ROLLBACK` or `COMMIT` (a helper's raw transaction statements) ended it: its
    /// writes after that committed on their own, without the marker, and a `COMMIT` would
    /// answer success — with a warning — for a transaction that is not there, or commit one
    /// the body began. Fails with 25P02 in an aborted transaction, as `SELECT 1` did, and the
    /// `COMMIT` after it is then never run. The error's value carries the text, so that it
    /// reads the same in any language; the setting read in it keeps it from being folded into
    /// an error at planning.
    pub const POSTGRES_STILL_OURS: &'static str = postgres_still_ours!();

    /// [`POSTGRES_STILL_OURS`](Self::POSTGRES_STILL_OURS), then `COMMIT`: one round trip.
    pub const POSTGRES_COMMIT_IF_OURS: &'static str = concat!(postgres_still_ours!(), "; COMMIT");

    /// How long a PostgreSQL handler's transaction may sit idle: what bounds the marker
    /// lock a handler cancelled mid-body leaves on a pooled connection.
    pub const IDLE_IN_TRANSACTION_MS: u32 = 10_000;

    /// `BEGIN` at the handler's isolation level, the check that it began the transaction,
    /// and the idle bound, in one round trip. A transaction the caller opened as SQL
    /// (`batch_execute("BEGIN")`, which diesel's transaction manager does not count) only
    /// makes `BEGIN` warn, and the handler would join it: the check then fails
    /// ([`POSTGRES_NONE_OPEN`](Self::POSTGRES_NONE_OPEN)), and the handler is refused. The
    /// bound is the smaller of the handler's and the session's own (a role's or an
    /// operator's tighter `idle_in_transaction_session_timeout` stays), for the transaction
    /// only.
    pub fn postgres_begin_sql(&self) -> std::borrow::Cow<'static, str> {
        self.postgres_begin_with(&Self::postgres_begin_checks(self.idle_in_transaction_ms))
            .into()
    }

    /// [`postgres_begin_sql`](Self::postgres_begin_sql) with `checks` run after `BEGIN` and
    /// the check that it began the transaction: [`postgres_begin_checks`](Self::postgres_begin_checks)'
    /// statement, or the `EXECUTE` of it prepared on the session. The check stays a
    /// statement of its own, first: on a session that lacks the prepared checks, a
    /// transaction the caller opened as SQL is refused before anything else fails (the
    /// preparation that follows a missing statement rolls back what is open).
    pub(crate) fn postgres_begin_with(&self, checks: &str) -> String {
        let begin = begin_sql(self.isolation);
        let none_open = Self::POSTGRES_NONE_OPEN;
        match self.in_flight_when_locked {
            true => format!(
                "{begin}; {none_open}; {checks}; {}",
                Self::POSTGRES_SHORT_LOCK_WAIT
            ),
            false => format!("{begin}; {none_open}; {checks}"),
        }
    }

    /// What the handler's transaction runs after its `BEGIN` and the check that it began
    /// it, as one `SELECT`: the transaction named the handler's and its commit durable
    /// ([`POSTGRES_OURS`](Self::POSTGRES_OURS)'s), and the idle bound of `idle_ms` (none
    /// for 0). One statement, which the marker's start prepares on the session with the
    /// marker's insert: parsed and planned once per session instead of once per message.
    pub(crate) fn postgres_begin_checks(idle_ms: u32) -> String {
        match idle_ms {
            0 => Self::POSTGRES_OURS.to_owned(),
            ms => format!(
                "{}, set_config('idle_in_transaction_session_timeout', \
                 LEAST(NULLIF((EXTRACT(EPOCH FROM \
                 current_setting('idle_in_transaction_session_timeout')::interval) * 1000)::bigint, \
                 0), {ms})::text, true)",
                Self::POSTGRES_OURS
            ),
        }
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

    /// MySQL and MariaDB: what goes before `START TRANSACTION`, it, and what goes after, in
    /// one round trip. On MySQL: the isolation level; with `on_locked = "in_flight"` the
    /// short lock wait. On MariaDB, in this order:
    ///
    /// 1. the session's own settings kept, to be put back when the transaction ends
    ///    ([`MARIADB_KEEP`](Self::MARIADB_KEEP));
    /// 2. a transaction the caller opened as SQL (`BEGIN` through `batch_execute`) refused
    ///    ([`MARIADB_NONE_OPEN`](Self::MARIADB_NONE_OPEN)): `START TRANSACTION` would commit
    ///    it;
    /// 3. `autocommit` off while the handler runs, messages in English, the idle bound, the
    ///    short lock wait, the isolation level, `START TRANSACTION`;
    /// 4. inside it, a savepoint that names it ([`MARIADB_OURS`](Self::MARIADB_OURS)).
    ///
    /// A deadlock or a Galera abort ends the transaction on the server, the marker rolled
    /// back with it. A body that swallows that error and goes on would write outside any
    /// transaction, each write committed on its own; with `autocommit` off its writes open
    /// another transaction instead, which commits only if told to. Before `COMMIT` the
    /// runtime releases the savepoint, which exists only in the transaction it began
    /// ([`MARIADB_STILL_OURS`](Self::MARIADB_STILL_OURS)): in any other that fails, and the
    /// runtime rolls back what the body wrote since and reports the swallowed error.
    pub fn mysql_begin_sql(&self, mariadb: bool) -> std::borrow::Cow<'static, str> {
        if !mariadb && !self.in_flight_when_locked && set_transaction_sql(self.isolation).is_none()
        {
            return "START TRANSACTION".into();
        }
        let mut sql = String::new();
        if mariadb {
            sql.push_str(Self::MARIADB_KEEP);
            sql.push_str("; ");
            sql.push_str(Self::MARIADB_NONE_OPEN);
            // Messages in English for the transaction: the startup check set them so, but a
            // pool's hook or the application may have set the session's language since, and
            // a lock wait timeout in the body is then read in words only (the text protocol
            // carries no error number).
            sql.push_str("; SET autocommit = 0, lc_messages = 'en_US'");
            if self.mariadb_idle_bound(mariadb) {
                let seconds = self.idle_in_transaction_ms.div_ceil(1000);
                // The smaller of the handler's bound and the session's own, which stays.
                sql.push_str(&format!(
                    ", SESSION idle_transaction_timeout = \
                     IF(@@SESSION.idle_transaction_timeout BETWEEN 1 AND {seconds}, \
                     @@SESSION.idle_transaction_timeout, {seconds})"
                ));
            }
            sql.push_str("; ");
        }
        if self.in_flight_when_locked {
            sql.push_str(Self::MYSQL_SHORT_LOCK_WAIT);
            sql.push_str("; ");
        }
        if let Some(level) = set_transaction_sql(self.isolation) {
            sql.push_str(level);
            sql.push_str("; ");
        }
        sql.push_str("START TRANSACTION");
        if mariadb {
            sql.push_str("; ");
            sql.push_str(Self::MARIADB_OURS);
        }
        sql.into()
    }

    /// MariaDB: the session's `autocommit`, idle bound and language kept in user variables,
    /// before anything changes them, to be put back ([`MARIADB_ROLLBACK_AND_RESTORE`](Self::MARIADB_ROLLBACK_AND_RESTORE)).
    pub const MARIADB_KEEP: &'static str = "SET @inbox_autocommit = @@autocommit, \
        @inbox_idle_transaction_timeout = @@SESSION.idle_transaction_timeout, \
        @inbox_lc_messages = @@SESSION.lc_messages";

    /// MariaDB: fails where a transaction is open on the session — one the caller opened as
    /// SQL, which diesel's transaction manager does not count — with
    /// [`OPEN_TRANSACTION`](crate::dialect::OPEN_TRANSACTION) as its message, whatever the
    /// server's language (SQLSTATE 25001, "active SQL transaction"). Nothing after it in the
    /// round trip runs: the caller's transaction stays open, uncommitted, as it was. A
    /// session with `autocommit = 0` has one open after any statement (the startup check's
    /// reads open one): there `START TRANSACTION` commits it, as it does for the
    /// application's own, and the check lets it.
    pub const MARIADB_NONE_OPEN: &'static str = "IF @@in_transaction AND @@autocommit THEN \
        SIGNAL SQLSTATE '25001' SET MESSAGE_TEXT = 'inbox: a transaction is open on this session'; \
        END IF";

    /// MariaDB, first inside the handler's transaction: a savepoint, which lives only as
    /// long as this transaction does.
    pub const MARIADB_OURS: &'static str = "SAVEPOINT inbox_transaction";

    /// MariaDB, before `COMMIT`, alone in its round trip (`backends/mysql.rs`, "A `COMMIT`
    /// alone"): the savepoint released — which fails (1305) where the transaction is no
    /// longer the one the handler began: a deadlock or a Galera abort the body swallowed and
    /// went on after, its later writes in another transaction (`autocommit` off), the marker
    /// rolled back. A `COMMIT` there would commit those writes without the marker, and
    /// answer success: the runtime rolls them back and reports the swallowed error instead
    /// ([`Error::TransactionAborted`](crate::Error)). Then the idle bound put back.
    pub const MARIADB_STILL_OURS: &'static str = "RELEASE SAVEPOINT inbox_transaction; \
        SET SESSION idle_transaction_timeout = @inbox_idle_transaction_timeout, \
        lc_messages = @inbox_lc_messages";

    /// MariaDB, after `COMMIT`, alone: `autocommit` as the session had it. (Turned on
    /// while a transaction is open, it would commit that transaction: never before the
    /// `COMMIT`, which travels alone.)
    pub const MARIADB_AUTOCOMMIT_BACK: &'static str = "SET autocommit = @inbox_autocommit";

    /// MariaDB: `ROLLBACK`, then the session's settings put back, in one round trip —
    /// wherever the handler's transaction ends otherwise than by its commit. Whatever the
    /// `ROLLBACK` answers, nothing commits, and `autocommit` is turned back on only after
    /// it: turned on with a transaction open, it would commit that transaction (one the
    /// runtime's own reads open after the handler's ended, with `autocommit` still off).
    /// (A `COMMIT` never shares its round trip: `backends/mysql.rs`, "A `COMMIT` alone".)
    pub const MARIADB_ROLLBACK_AND_RESTORE: &'static str = "ROLLBACK AND NO CHAIN NO RELEASE; \
        SET autocommit = @inbox_autocommit, \
        SESSION idle_transaction_timeout = @inbox_idle_transaction_timeout, \
        lc_messages = @inbox_lc_messages";

    /// MySQL and MariaDB: the handler's `COMMIT`, whatever the session's `completion_type`
    /// says — `RELEASE` (set by a pool's init, say) would end the session after it, the commit
    /// done but every statement after it failing on a closed connection; `CHAIN` would open
    /// another transaction at once.
    pub const MYSQL_COMMIT: &'static str = "COMMIT AND NO CHAIN NO RELEASE";

    /// MySQL and MariaDB: the handler's `ROLLBACK`, whatever `completion_type` says
    /// ([`MYSQL_COMMIT`](Self::MYSQL_COMMIT)).
    pub const MYSQL_ROLLBACK: &'static str = "ROLLBACK AND NO CHAIN NO RELEASE";

    /// MySQL and MariaDB, after the rollback of a transaction a cancelled handler left open
    /// (its restore never sent): MariaDB's settings put back where a handler kept them on
    /// this session. Fails on MySQL, which has no `idle_transaction_timeout` — and nothing
    /// to put back: the failure is ignored.
    pub const MARIADB_ABANDONED_RESTORE: &'static str = "SET \
        autocommit = IFNULL(@inbox_autocommit, @@autocommit), \
        SESSION idle_transaction_timeout = \
        IFNULL(@inbox_idle_transaction_timeout, @@SESSION.idle_transaction_timeout), \
        lc_messages = IFNULL(@inbox_lc_messages, @@SESSION.lc_messages)";

    /// MariaDB with the idle bound on: what `begin` sets besides what every MariaDB
    /// transaction sets.
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
