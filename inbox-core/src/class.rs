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
    /// The connection to the server is gone.
    ConnectionLost,
    /// Anything else.
    Other,
}

/// The kinds of failure that are retried in a fresh transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransientKind {
    /// PostgreSQL `40001`: a serializable or repeatable-read transaction lost a conflict.
    SerializationFailure,
    /// PostgreSQL `40P01`, MySQL `1213`: the server broke a deadlock by aborting this transaction.
    Deadlock,
    /// MySQL `1205`: a lock wait timed out.
    LockWaitTimeout,
    /// SQLite `SQLITE_BUSY` / `SQLITE_LOCKED`: the database stayed locked past the busy timeout.
    Busy,
}

impl ErrorClass {
    /// Whether the failure is worth another attempt in a fresh transaction.
    pub fn is_transient(&self) -> bool {
        matches!(self, ErrorClass::Transient(_))
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
            ErrorClass::Other => f.write_str("other error"),
        }
    }
}
