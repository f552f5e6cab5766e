//! What a failed attempt leaves behind and how a run gives up: a deadlock read after the
//! body, transactions abandoned by a dropped future, connections discarded, and the error a
//! run ends with.

use std::time::Duration;

use diesel::QueryResult;
use diesel::result::Error as DieselError;
use inbox_core::ErrorClass;

use crate::classify;
use crate::dialect::layout::Layout;
use crate::error::Error;
use crate::runtime::batch::Claims;
use crate::runtime::found::Presence;
use crate::runtime::steps::Steps;
use crate::spec::HandlerSpec;
use crate::telemetry;

/// MariaDB writes a deadlock (1213) in the server's own language, whatever the session's
/// `lc_messages`, and its text protocol and the async driver report no code for it: an
/// error nothing recognises, inside the handler's transaction, that the server ended the
/// transaction with ([`Steps::ended_by_server`]) is that deadlock (or a Galera abort, the
/// same error) — a transient failure, retried, never dead-lettered. Any other error as it is.
pub(super) fn deadlock_if_ended(class: Option<ErrorClass>, ended: bool) -> Option<ErrorClass> {
    match class {
        Some(ErrorClass::Other) if ended => {
            Some(ErrorClass::Transient(inbox_core::TransientKind::Deadlock))
        }
        class => class,
    }
}

/// The claim's error inside the transaction, as [`deadlock_if_ended`] reads a body's: an
/// unrecognised one the MariaDB server ended the transaction with, carried as the deadlock
/// it is (the server's error its source).
pub(super) async fn deadlock_unread<S: Steps>(
    steps: &mut S,
    spec: &HandlerSpec,
    layout: Layout,
    error: DieselError,
) -> DieselError {
    if !layout.mariadb || classify(&error, &spec.schema) != ErrorClass::Other {
        return error;
    }
    match steps.ended_by_server().await {
        true => DieselError::QueryBuilderError(Box::new(Error::Database {
            class: ErrorClass::Transient(inbox_core::TransientKind::Deadlock),
            attempts: 1,
            source: error,
        })),
        false => error,
    }
}

/// After a transaction the server ended under a body that swallowed the error
/// ([`ErrorClass::TransactionAborted`]), rolled back: whether nothing of it committed, so
/// that it may run again. PostgreSQL and SQLite commit nothing of an aborted transaction.
/// On MySQL and MariaDB a statement that commits implicitly (DDL, `LOCK TABLES`) ends the
/// transaction too — committing the marker and the body's writes before it: there the
/// marker of this key, read after the rollback, must be absent (a batch's is not read: not
/// retried). Present, it may be another delivery's, which went on after this one's
/// deadlock; or this one's, committed early: reported, not retried, either way.
pub(super) async fn nothing_committed<S: Steps, K: Claims>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    layout: Layout,
    claims: &K,
) -> bool {
    // MySQL reports no transaction ended under the body (it cannot tell).
    if !layout.mariadb {
        return true;
    }
    match claims.key() {
        Some(key) => matches!(
            steps.markers_present(spec, &[key.stored_id()], false).await,
            Ok(Presence { present: 0, .. })
        ),
        None => false,
    }
}

/// The body ended the handler's transaction ([`Error::TransactionEnded`]): never retried.
pub(super) fn ended_in_body<T, E>() -> Failure<T, E> {
    tracing::error!(
        "the handler's transaction was ended inside its body (a ROLLBACK, COMMIT or BEGIN it \
         sent); what it wrote after that committed on its own"
    );
    Failure::Database(DieselError::QueryBuilderError(Box::new(
        Error::TransactionEnded,
    )))
}

/// What a swallowed error is retried and, never retried, reported as.
pub(super) const DEADLOCK: ErrorClass = ErrorClass::Transient(inbox_core::TransientKind::Deadlock);

/// Why one attempt failed. Every variant is returned after the transaction was rolled back.
pub(super) enum Failure<T, E> {
    /// The body returned `Err`; kept as the `Result` the body returned so that the
    /// macro-generated probe can look inside it. With whether the server had ended the
    /// transaction ([`deadlock_if_ended`]).
    Body(Result<T, E>, bool),
    /// Beginning, claiming or committing failed.
    Database(DieselError),
    /// The body returned `Ok` over an aborted transaction.
    Aborted,
}

/// A delivery on a connection whose handler can be cancelled mid-way: an async handler's
/// future dropped (a `tokio::time::timeout`, a `select!`) takes no step after the one it was
/// dropped at, and diesel-async keeps the transaction open on the connection. Dropped
/// unfinished with the runtime's transaction open, the watch puts the connection's
/// transaction manager in error ([`Steps::abandon`]) — the application's own `transaction`
/// or `rollback_transaction` on it is refused, where it would have nested a savepoint in the
/// dropped transaction (committing nothing) or, on MariaDB, ended it with the session's
/// `autocommit` still off (committing nothing after it) — and remembers the connection (by
/// [`Steps::address`]). The next delivery on that connection rolls the transaction back —
/// nothing of it was committed — puts back what the handler set for the session, and goes
/// on ([`recover`]). A pool's connection is not handed out again with a transaction open
/// (diesel-async's pools check): this serves a connection the application keeps.
pub(crate) struct Abandoned<S: Steps> {
    pub(super) steps: S,
    address: usize,
    /// A transaction was open when the delivery began: the caller's, never the runtime's to
    /// end (the delivery is refused, `CalledInsideTransaction`).
    callers: bool,
    pub(super) finished: bool,
}

/// The connections a cancelled handler left a transaction open on, each with whether its
/// manager was put in error: the latest [`ABANDONED_MAX`], each forgotten when a delivery
/// runs on it.
pub(super) static ABANDONED: std::sync::Mutex<Vec<(usize, bool)>> =
    std::sync::Mutex::new(Vec::new());

/// How many connections [`ABANDONED`] remembers.
pub(super) const ABANDONED_MAX: usize = 1024;

impl<S: Steps> Abandoned<S> {
    pub(super) fn watch(mut steps: S) -> Self {
        let (address, callers) = match S::CANCELLABLE {
            true => (steps.address(), steps.in_transaction()),
            false => (0, false),
        };
        Self {
            steps,
            address,
            callers,
            finished: false,
        }
    }
}

impl<S: Steps> Drop for Abandoned<S> {
    fn drop(&mut self) {
        // A panic has rolled the transaction back before it went on (`run_body`): only a
        // future dropped mid-way leaves one open.
        if !S::CANCELLABLE || self.finished || std::thread::panicking() {
            return;
        }
        let marked = !self.callers && self.steps.abandon();
        let mut abandoned = ABANDONED.lock().unwrap_or_else(|e| e.into_inner());
        abandoned.retain(|(at, _)| *at != self.address);
        if abandoned.len() == ABANDONED_MAX {
            abandoned.remove(0);
        }
        abandoned.push((self.address, marked));
    }
}

/// Connections [`discard`] put in error, by their [`Steps::address`]: bounded, as the
/// checks remembered are.
pub(super) static DISCARDED: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// How many connections [`discard`] remembers as put in error, as the check's cache
/// remembers its pairs.
const DISCARDED_MAX: usize = 256;

/// A delivery that failed with a class whose action is a new connection
/// ([`Action::Reconnect`](inbox_core::Action::Reconnect): the session lost, read-only — a
/// standby, or a primary demoted by a failover, whose open sessions stay —, a prepared
/// statement lost under it): the connection's transaction manager is put in error. r2d2,
/// deadpool and bb8 each ask diesel whether a connection is broken before they hand it
/// out again, and discard this one; the pool's next connection is a new session, which a
/// failover-aware URL (`target_session_attrs=read-write`) takes to the writer — where the
/// same session, handed to every redelivery, would fail each as it failed the first until the
/// broker's delivery limit dead-lettered the message. In the caller's transaction
/// (`transaction = "caller"`), after the handler's savepoint is rolled back: the caller's own
/// rollback is then refused by diesel (`BrokenTransactionManager`, and the caller gets its
/// error back), and the pool's discard, closing the session, ends that transaction.
pub(super) fn discard<S: Steps>(steps: &mut S, class: Option<&ErrorClass>) {
    if class.map(ErrorClass::action) != Some(inbox_core::Action::Reconnect) {
        return;
    }
    steps.discard();
    let address = steps.address();
    let mut discarded = DISCARDED.lock().unwrap_or_else(|e| e.into_inner());
    if !discarded.contains(&address) {
        if discarded.len() == DISCARDED_MAX {
            discarded.clear();
        }
        discarded.push(address);
    }
}

/// Before a delivery: a connection [`discard`] put in error and handed to a handler again —
/// used without a pool, whose owner did not drop it — is taken back as it is: what is open
/// on the session is rolled back (the caller's transaction a joined handler failed in, which
/// the manager in error did not roll back), and the manager is told that no transaction is
/// open; the session, if it is still lost or read-only, says so again. Free where the
/// manager is not in error.
pub(super) async fn take_back<S: Steps>(steps: &mut S) {
    if !steps.in_error() {
        return;
    }
    let address = steps.address();
    let taken = {
        let mut discarded = DISCARDED.lock().unwrap_or_else(|e| e.into_inner());
        discarded
            .iter()
            .position(|&a| a == address)
            .map(|at| discarded.swap_remove(at))
    };
    if taken.is_some() {
        steps.discard_foreign().await;
    }
}

/// Rolls back the transaction a cancelled handler left open on this connection, if it did
/// ([`Abandoned`]). A handler cancelled in the middle of a statement can leave the
/// connection's protocol where no answer can be read: a rollback that fails is the
/// connection's end (`ConnectionLost`: a new connection), never a failure of the message.
pub(super) async fn recover<S: Steps>(steps: &mut S) -> QueryResult<()> {
    let address = steps.address();
    let left = {
        let abandoned = ABANDONED.lock().unwrap_or_else(|e| e.into_inner());
        abandoned
            .iter()
            .find(|(at, _)| *at == address)
            .map(|(_, marked)| *marked)
    };
    let Some(marked) = left else {
        return Ok(());
    };
    // Put in error when the handler was dropped, and still so (a pool's new connection where
    // the dropped one was is not; a transaction open on a connection whose delivery left it
    // none is the caller's): the rollback is sent as it is, and the manager counts none open
    // only once it is done — dropped or failed before, the connection is still remembered,
    // and still refuses the application's transactions.
    if marked && steps.in_error() {
        tracing::warn!(
            "a handler on this connection was cancelled inside its transaction; rolling that \
             transaction back"
        );
        if let Err(e) = steps.roll_back_abandoned().await {
            tracing::warn!(error = %e, "rolling back the cancelled handler's transaction failed; the connection must go");
            return Err(e);
        }
        steps.forget_transaction();
    }
    ABANDONED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(at, _)| *at != address);
    // One of the manager's own statements (`BEGIN`, `COMMIT`, `ROLLBACK`) cut off in the
    // middle: answers may be pending on the connection, and nothing read on it can be
    // trusted. A new connection. (A connection that is neither broken nor in a transaction
    // is taken as it is: a new one a pool made where the cancelled one was looks the same.
    // One cut off in the middle of another statement shows it on the next: a connection
    // error.)
    if steps.broken() {
        tracing::warn!(
            "a handler on this connection was cancelled in the middle of a statement; the \
             connection must go"
        );
        return Err(diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::ClosedConnection,
            Box::new(
                "connection closed: a handler was cancelled in the middle of a statement on it"
                    .to_owned(),
            ),
        ));
    }
    Ok(())
}

/// A session lost after its attempt ran longer than the handler's idle bound: most likely the
/// server ended it for sitting idle in the transaction (PostgreSQL
/// `idle_in_transaction_session_timeout`, MariaDB `idle_transaction_timeout`) while the body
/// awaited something else than the database — which the error itself ("connection closed",
/// "server has gone away") does not say. Logged, and returned as the error that names the
/// setting ([`Error::IdleBoundExceeded`]).
pub(super) fn idle_bound_hint(spec: &HandlerSpec, ran: Duration) -> Option<Error> {
    let bound = Duration::from_millis(u64::from(spec.idle_in_transaction_ms));
    if spec.idle_in_transaction_ms > 0 && ran >= bound {
        tracing::error!(
            ran_ms = ran.as_millis() as u64,
            idle_in_transaction_ms = spec.idle_in_transaction_ms,
            "the connection was lost after the attempt ran past the handler's idle bound: the \
             server ends a session idle in its transaction that long; a body that awaits \
             something else than the database for longer needs a larger \
             `idle_in_transaction_ms`"
        );
        return Some(Error::IdleBoundExceeded {
            idle_in_transaction_ms: spec.idle_in_transaction_ms,
            ran_ms: u64::try_from(ran.as_millis()).unwrap_or(u64::MAX),
        });
    }
    None
}

/// The error a run gives up with, recorded on its span (`error.type`, `inbox.attempt`) and
/// counted.
pub(super) fn give_up<T, E>(
    spec: &HandlerSpec,
    failure: Failure<T, E>,
    class: Option<ErrorClass>,
    attempts: u32,
    inbox_error: fn(Error) -> E,
) -> E {
    telemetry::attempt(attempts);
    let error_type = match &failure {
        Failure::Body(..) => telemetry::error_type(class.as_ref()),
        Failure::Aborted => ErrorClass::TransactionAborted.label(),
        Failure::Database(DieselError::AlreadyInTransaction) => ErrorClass::Misuse.label(),
        Failure::Database(DieselError::QueryBuilderError(inner)) if inner.is::<Error>() => inner
            .downcast_ref::<Error>()
            .map_or("other", |error| error.class().label()),
        Failure::Database(_) => class.as_ref().unwrap_or(&ErrorClass::Other).label(),
    };
    telemetry::failed(spec, error_type);
    match failure {
        Failure::Body(Err(e), _) => {
            tracing::debug!(outcome = "failed", "handler returned an error; rolled back");
            e
        }
        Failure::Body(Ok(_), _) => unreachable!("a body failure holds the body's Err"),
        Failure::Aborted => {
            tracing::error!(
                outcome = "aborted",
                "handler returned Ok over an aborted transaction (a swallowed database error); \
                 rolled back"
            );
            inbox_error(Error::TransactionAborted { attempts })
        }
        Failure::Database(DieselError::AlreadyInTransaction) => {
            tracing::error!(
                outcome = "misuse",
                "the handler was called inside an open transaction; nothing ran"
            );
            inbox_error(Error::CalledInsideTransaction)
        }
        // The inbox's own error, carried through a statement's `QueryResult`: as it is.
        Failure::Database(DieselError::QueryBuilderError(inner)) if inner.is::<Error>() => {
            let error = *inner.downcast::<Error>().expect("checked by `is`");
            tracing::error!(outcome = "failed", error = %error, "refused");
            inbox_error(error)
        }
        Failure::Database(source) => {
            let class = class.unwrap_or(ErrorClass::Other);
            tracing::warn!(outcome = "failed", class = %class, attempts, error = %source, "rolled back");
            inbox_error(Error::Database {
                class,
                attempts,
                source,
            })
        }
    }
}
