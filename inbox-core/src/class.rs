use std::fmt;

/// What a database error means for an idempotent handler.
///
/// `inbox_diesel::classify` maps a diesel error to a class; the runtime acts on the class:
/// an inbox duplicate becomes [`Outcome::Duplicate`](crate::Outcome::Duplicate), a transient
/// failure is retried in a fresh transaction, everything else is returned to the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorClass {
    /// A unique violation of the inbox's own index: the message was already processed.
    InboxDuplicate,
    /// A unique violation of any other index or primary key — a business constraint. Never a
    /// duplicate message, never retried.
    UniqueViolation {
        /// The index or constraint the server named, when it named one.
        constraint: Option<String>,
    },
    /// A failure that a fresh transaction may not hit again.
    Transient(TransientKind),
    /// The transaction was already aborted by an earlier failed statement whose error the
    /// handler swallowed; nothing of it can commit.
    TransactionAborted,
    /// The connection to the server is gone, or its state is unknown (a rollback that
    /// failed): take a fresh connection.
    ConnectionLost,
    /// The session can only read: a replica, a primary demoted by a failover, a session or
    /// transaction set `READ ONLY` (PostgreSQL `25006`, MySQL and MariaDB `1792`, `1290` —
    /// `--read-only`). The message is fine and so is the table: a fresh connection (to the
    /// new primary) processes it.
    ReadOnly,
    /// The database refused the statement for want of a privilege (PostgreSQL `42501`, MySQL
    /// and MariaDB `1142`/`1143`, a SQLite file opened read-only): a deployment to fix, not a
    /// message to retry or dead-letter.
    PermissionDenied,
    /// The server, or the account, ran short of something the statement needs: memory or
    /// its lock table (PostgreSQL `53200`, "out of shared memory" —
    /// `max_locks_per_transaction`), disk (`53100`, MySQL and MariaDB `1021`, `1114`), the
    /// account's hourly limit (MySQL and MariaDB `1226`, `MAX_UPDATES_PER_HOUR`). Nothing
    /// about the message: an operator acts (`Alert`), and a redelivery then processes it.
    ResourceExhausted,
    /// A setting of the server refuses the statement whatever the message: MySQL and
    /// MariaDB binary logging by statement (`binlog_format = STATEMENT`) under `READ
    /// COMMITTED`, where InnoDB can log no write (`1665`, and the other "impossible to write
    /// to binary log" refusals). Every delivery would meet it: an operator changes the
    /// setting (`Alert`), and a redelivery then processes the message.
    ServerSetting,
    /// The server no longer knows a statement the connection prepared: a pooler's reset
    /// (`DISCARD ALL`, `DEALLOCATE ALL`) ran under it (PostgreSQL `26000`, MySQL and MariaDB
    /// `1243`). The connection caches the statement and fails the same way every time: drop it
    /// and take a fresh one.
    StatementLost,
    /// Claim mode: the side effect ran, and its claim could not be stamped complete. A
    /// person decides whether it happened (`Alert`); the message is parked, not retried: a
    /// redelivery that took the claim over would run the effect again.
    EffectNotRecorded,
    /// Claim mode: the side effect ran, but the claim had been taken over by another
    /// delivery after its lease ended; that one completes the work. Redeliver later.
    ClaimLost,
    /// The handler was used in a way it cannot work: called inside the caller's open
    /// transaction. A bug to fix, not a message to retry.
    Misuse,
    /// A table, column or index the statement needs does not exist or is not what it should
    /// be (the inbox table's unique index missing, a table dropped). Retrying does not help
    /// until the schema is fixed.
    Schema,
    /// Anything else.
    Other,
}

/// What a message pump does with a failed delivery: the decision [`ErrorClass::action`]
/// makes for each class, the same on every backend, sync or async, in transaction, batch and
/// claim mode.
///
/// | action | classes | the pump |
/// |---|---|---|
/// | `RetryLater` | transient (deadlock, serialization failure, lock or statement timeout, busy) — after the handler's own retries were used up; a claim lost to another delivery | nacks with a delay; the broker redelivers |
/// | `Reconnect` | connection lost, a read-only session (a replica, a demoted primary), a prepared statement lost under the connection | drops the connection (a pool discards it), nacks; the redelivery runs on a fresh one |
/// | `Alert` | misuse, schema, a missing privilege, a swallowed error (`TransactionAborted`), a claim-mode effect not recorded | stops consuming or parks the message and alerts: every redelivery would fail the same way (an effect not recorded is parked: see `Settlement`) |
/// | `DeadLetter` | a business constraint, any other error | dead-letters the message: it fails on its own merits |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Action {
    /// Redeliver later: the failure may not happen again.
    RetryLater,
    /// Redeliver on a fresh connection.
    Reconnect,
    /// A bug or a broken deployment: stop and alert, do not spin on redeliveries.
    Alert,
    /// The message fails on its own: dead-letter it.
    DeadLetter,
}

/// The kinds of failure that are retried in a fresh transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransientKind {
    /// PostgreSQL `40001`: a serializable or repeatable-read transaction lost a conflict.
    SerializationFailure,
    /// PostgreSQL `40P01`, MySQL `1213`: the server broke a deadlock by aborting this transaction.
    Deadlock,
    /// MySQL `1205`, PostgreSQL `55P03` (`lock_timeout`, or a row locked under `NOWAIT`),
    /// MySQL `3572` (`NOWAIT`): a lock wait timed out or was refused.
    LockWaitTimeout,
    /// PostgreSQL `57014` (`statement_timeout`), MariaDB `1969` (`max_statement_time`), MySQL
    /// `3024` (`max_execution_time`): the statement ran past its time limit.
    StatementTimeout,
    /// PostgreSQL `57014` by `pg_cancel_backend` ("user request"), MySQL and MariaDB `1317`
    /// (`KILL QUERY`): someone cancelled the statement, not the transaction's own content.
    Canceled,
    /// SQLite `SQLITE_BUSY` / `SQLITE_LOCKED`: the database stayed locked past the busy timeout.
    Busy,
}

impl ErrorClass {
    /// A short, fixed name of the class, for an `error.type` attribute or a metric label
    /// (`transient`, `unique_violation`, `read_only`, …): a constraint's name or a
    /// transient failure's kind is left out, so that the set of values stays small.
    ///
    /// ```
    /// use inbox_core::ErrorClass;
    /// assert_eq!(ErrorClass::ReadOnly.label(), "read_only");
    /// ```
    pub const fn label(&self) -> &'static str {
        match self {
            ErrorClass::InboxDuplicate => "inbox_duplicate",
            ErrorClass::UniqueViolation { .. } => "unique_violation",
            ErrorClass::Transient(_) => "transient",
            ErrorClass::TransactionAborted => "transaction_aborted",
            ErrorClass::ConnectionLost => "connection_lost",
            ErrorClass::ReadOnly => "read_only",
            ErrorClass::PermissionDenied => "permission_denied",
            ErrorClass::ResourceExhausted => "resource_exhausted",
            ErrorClass::ServerSetting => "server_setting",
            ErrorClass::StatementLost => "statement_lost",
            ErrorClass::EffectNotRecorded => "effect_not_recorded",
            ErrorClass::ClaimLost => "claim_lost",
            ErrorClass::Misuse => "misuse",
            ErrorClass::Schema => "schema",
            ErrorClass::Other => "other",
        }
    }

    /// Whether the failure is worth another attempt in a fresh transaction.
    pub fn is_transient(&self) -> bool {
        matches!(self, ErrorClass::Transient(_))
    }

    /// What a message pump does with a delivery that failed with this class ([`Action`]).
    pub fn action(&self) -> Action {
        match self {
            ErrorClass::Transient(_) | ErrorClass::ClaimLost => Action::RetryLater,
            ErrorClass::ConnectionLost | ErrorClass::ReadOnly | ErrorClass::StatementLost => {
                Action::Reconnect
            }
            // A duplicate is never an error the runtime returns: met as one, something read
            // it wrongly.
            ErrorClass::Misuse
            | ErrorClass::Schema
            | ErrorClass::TransactionAborted
            | ErrorClass::PermissionDenied
            | ErrorClass::ResourceExhausted
            | ErrorClass::ServerSetting
            | ErrorClass::EffectNotRecorded
            | ErrorClass::InboxDuplicate => Action::Alert,
            ErrorClass::UniqueViolation { .. } | ErrorClass::Other => Action::DeadLetter,
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorClass::InboxDuplicate => f.write_str("inbox duplicate"),
            ErrorClass::UniqueViolation {
                constraint: Some(name),
            } => write!(f, "unique violation of `{name}`"),
            ErrorClass::UniqueViolation { constraint: None } => f.write_str("unique violation"),
            ErrorClass::Transient(kind) => write!(f, "transient failure ({kind:?})"),
            ErrorClass::TransactionAborted => f.write_str("transaction aborted"),
            ErrorClass::ConnectionLost => f.write_str("connection lost"),
            ErrorClass::ReadOnly => f.write_str(
                "read-only session (a hot-standby replica, a primary demoted by a failover, or a \
                 session, role or database set read-only — `default_transaction_read_only`, \
                 whose refusal names the first statement of the transaction, whatever it was): \
                 the consumer must reach a writable primary",
            ),
            ErrorClass::PermissionDenied => f.write_str("permission denied"),
            ErrorClass::ResourceExhausted => {
                f.write_str("the server or the account ran short of a resource")
            }
            ErrorClass::ServerSetting => f.write_str("a server setting refuses the statement"),
            ErrorClass::StatementLost => f.write_str("prepared statement lost"),
            ErrorClass::Misuse => f.write_str("misuse"),
            ErrorClass::EffectNotRecorded => f.write_str("side effect not recorded"),
            ErrorClass::ClaimLost => f.write_str("claim lost"),
            ErrorClass::Schema => f.write_str("schema mismatch"),
            ErrorClass::Other => f.write_str("other error"),
        }
    }
}
