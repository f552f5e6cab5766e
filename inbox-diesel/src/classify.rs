use diesel::result::{DatabaseErrorKind, Error as DieselError};
use inbox_core::server_message::{ServerError, ServerErrorKind};
use inbox_core::{ErrorClass, InboxSchema};

/// What a diesel error means for an idempotent handler whose inbox is `schema`.
///
/// This is the classification the runtime itself uses: a unique violation is an
/// [`ErrorClass::InboxDuplicate`] only when it is a violation of the inbox's own unique index
/// (by constraint name and table on PostgreSQL, by key name on MySQL/MariaDB — and table, where
/// MySQL ≥ 8.0.19 qualifies the key with it —, by table and columns on SQLite); any other
/// unique violation is a business error that keeps its name.
///
/// Route a handler's failures on what the runtime decided, not on this function: a duplicate
/// comes back as [`Outcome::Duplicate`](crate::Outcome::Duplicate), never as an error, and the
/// inbox's own failures carry their class ([`Error::class`](crate::Error::class)) — also inside
/// the diesel error a handler returning `QueryResult` gets them in, which this function reads. An error the
/// handler's body returned is the body's: the message was not processed, whatever its class.
/// Servers name tables without their schema, and MariaDB names none at all: there, a unique
/// index of another table that carries the inbox index's name (a copy made with
/// `CREATE TABLE … LIKE inbox`) reads as the inbox's. Give each inbox's unique index a name no
/// other table uses (`constraint = "…"`) where tables are copied.
///
/// ```
/// use diesel::result::{DatabaseErrorKind, Error};
/// use inbox_diesel::{classify, ErrorClass, InboxSchema};
///
/// let sqlite = Error::DatabaseError(
///     DatabaseErrorKind::UniqueViolation,
///     Box::new(String::from("UNIQUE constraint failed: accounts.email")),
/// );
/// assert_eq!(
///     classify(&sqlite, &InboxSchema::DEFAULT),
///     ErrorClass::UniqueViolation { constraint: Some("accounts.email".into()) }
/// );
/// ```
pub fn classify(error: &DieselError, schema: &InboxSchema) -> ErrorClass {
    match error {
        // The handler was called inside the caller's open transaction.
        DieselError::AlreadyInTransaction => ErrorClass::Misuse,
        // A rollback failed: what the server holds of the transaction is unknown, and diesel
        // refuses every later statement on the connection.
        DieselError::BrokenTransactionManager => ErrorClass::ConnectionLost,
        // The inbox's own failure, as a handler returning `QueryResult` gets it: its class.
        DieselError::QueryBuilderError(inner) => match inner.downcast_ref::<crate::Error>() {
            Some(inbox) => inbox.class(),
            None => ErrorClass::Other,
        },
        _ => {
            with_server_error(error, |server| server.classify(schema)).unwrap_or(ErrorClass::Other)
        }
    }
}

/// `read` on the parts of `error` the server reported; `None` for an error that did not
/// come from the server.
pub(crate) fn with_server_error<R>(
    error: &DieselError,
    read: impl FnOnce(&ServerError<'_>) -> R,
) -> Option<R> {
    match error {
        DieselError::DatabaseError(kind, info) => Some(read(&ServerError {
            kind: match kind {
                DatabaseErrorKind::UniqueViolation => ServerErrorKind::UniqueViolation,
                DatabaseErrorKind::SerializationFailure => ServerErrorKind::SerializationFailure,
                DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand => {
                    ServerErrorKind::ConnectionLost
                }
                _ => ServerErrorKind::Other,
            },
            constraint: info.constraint_name(),
            table: info.table_name(),
            message: info.message(),
        })),
        // A failed COMMIT whose rollback failed too: the commit error says what happened.
        DieselError::RollbackErrorOnCommit { commit_error, .. } => {
            with_server_error(commit_error, read)
        }
        _ => None,
    }
}
