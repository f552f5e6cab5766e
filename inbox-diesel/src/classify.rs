use diesel::result::{DatabaseErrorKind, Error as DieselError};
use inbox_core::server_message::{ServerError, ServerErrorKind};
use inbox_core::{ErrorClass, InboxSchema};

/// What a diesel error the server (or diesel's transaction manager) reported means for the
/// inbox whose table is `schema`: the classification below the inbox's own errors, which
/// [`classify`](crate::classify) adds.
pub(crate) fn class_of(error: &DieselError, schema: &InboxSchema) -> ErrorClass {
    match error {
        // The handler was called inside the caller's open transaction.
        DieselError::AlreadyInTransaction => ErrorClass::Misuse,
        // A rollback failed: what the server holds of the transaction is unknown, and diesel
        // refuses every later statement on the connection.
        DieselError::BrokenTransactionManager => ErrorClass::ConnectionLost,
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
                DatabaseErrorKind::ReadOnlyTransaction => ServerErrorKind::ReadOnly,
                DatabaseErrorKind::NotNullViolation => ServerErrorKind::NotNullViolation,
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
