//! The transaction manager's count kept in step with what the runtime sends itself: a
//! handler's `BEGIN` sent with its marker, a `COMMIT` or `ROLLBACK` sent with other statements
//! in one round trip, which diesel's manager does not see. Used by [`Session`](super::Session)'s
//! steps and by each backend's.

use diesel::QueryResult;

/// A handler's `BEGIN` refused because a transaction the caller opened as SQL is open on the
/// session (`batch_execute("BEGIN")`, which diesel's transaction manager does not count):
/// [`Error::CalledInsideTransaction`](crate::Error::CalledInsideTransaction), as for one the
/// manager counts. Each backend's start says so in its own way, whatever the server's
/// language: PostgreSQL's `BEGIN` only warns, and the check after it in the same round trip
/// fails ([`OPEN_TRANSACTION_PROBE`](crate::dialect::Dialect::OPEN_TRANSACTION_PROBE)),
/// aborting the caller's transaction; MariaDB's `START TRANSACTION` would commit it, and the
/// check before it fails ([`HandlerSpec::MARIADB_NONE_OPEN`](crate::spec::HandlerSpec)),
/// leaving it open as it was; SQLite refuses a `BEGIN` inside a transaction. Any other error
/// as it is.
pub(crate) fn inside_callers(error: diesel::result::Error) -> diesel::result::Error {
    match crate::dialect::open_transaction(&error) {
        true => diesel::result::Error::QueryBuilderError(Box::new(
            crate::error::Error::CalledInsideTransaction,
        )),
        false => error,
    }
}

/// Whether `error` is [`inside_callers`]'s refusal.
pub(crate) fn refused_inside(error: &diesel::result::Error) -> bool {
    matches!(
        error,
        diesel::result::Error::QueryBuilderError(inner)
            if matches!(inner.downcast_ref::<crate::error::Error>(), Some(crate::error::Error::CalledInsideTransaction))
    )
}

/// No transaction is open and the manager is sound: the handler's transaction may begin
/// with its marker. Otherwise the runtime begins on its own, which reports the transaction
/// already open (or the broken manager) before anything is sent.
pub(crate) fn none_open(status: &mut diesel::connection::TransactionManagerStatus) -> bool {
    matches!(open(status), Ok(false))
}

/// What a transaction's start sent with its marker (PostgreSQL's `PgMarker`, MySQL's
/// `start_with_marker`, in `dialect/marker.rs`) decided: `true` when it
/// began and the marker is new; `false` when the inbox's own index refused the marker; the
/// error otherwise. After a failure the server may hold the transaction open (aborted on
/// PostgreSQL): the transaction manager is told it is open (it counted none, as the string
/// failed as a whole), so that the runtime's rollback ends it — and a pool discards the
/// connection if that rollback never runs.
pub(crate) fn claimed(
    begun: QueryResult<()>,
    schema: &inbox_core::InboxSchema,
    status: &mut diesel::connection::TransactionManagerStatus,
) -> QueryResult<bool> {
    let Err(error) = begun else {
        return Ok(true);
    };
    // The caller's transaction, refused before the handler's began: nothing of the
    // handler's is open, and the caller's is not the runtime's to roll back.
    let error = inside_callers(error);
    if refused_inside(&error) {
        return Err(error);
    }
    if let Ok(state) = valid(status)
        && state.transaction_depth().is_none()
        && let Err(e) = state
            .change_transaction_depth(diesel::connection::TransactionDepthChange::IncreaseDepth)
    {
        tracing::error!(error = %e, "counting the failed transaction open failed");
    }
    match crate::classify::class_of(&error, schema) {
        inbox_core::ErrorClass::InboxDuplicate => Ok(false),
        _ => Err(error),
    }
}

/// The manager's state unless it is broken (diesel's own `transaction_state`, which is public
/// only to implementers of backends: a user's build of this crate does not enable that).
fn valid(
    status: &mut diesel::connection::TransactionManagerStatus,
) -> QueryResult<&mut diesel::connection::ValidTransactionManagerStatus> {
    match status {
        diesel::connection::TransactionManagerStatus::Valid(state) => Ok(state),
        diesel::connection::TransactionManagerStatus::InError => {
            Err(diesel::result::Error::BrokenTransactionManager)
        }
    }
}

/// Before a `COMMIT` or `ROLLBACK` the runtime sends itself, with other statements in one
/// round trip: the transaction manager is sound and counts the transaction open (diesel's own
/// commit refuses the same way, before anything is sent). `Ok(false)`: none is open.
pub(crate) fn open(status: &mut diesel::connection::TransactionManagerStatus) -> QueryResult<bool> {
    Ok(valid(status)?.transaction_depth().is_some())
}

/// The transaction manager told that the transaction it counts open ended: after a
/// `COMMIT` or `ROLLBACK` the runtime sent itself, with other statements in one round trip.
pub(crate) fn ended(status: &mut diesel::connection::TransactionManagerStatus) -> QueryResult<()> {
    let state = valid(status)?;
    match state.transaction_depth() {
        Some(_) => state
            .change_transaction_depth(diesel::connection::TransactionDepthChange::DecreaseDepth),
        None => Ok(()),
    }
}
