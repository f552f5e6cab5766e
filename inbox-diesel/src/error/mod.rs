use std::fmt;

use inbox_core::{Action, ErrorClass, KeyError};

mod diesel_error;
pub(crate) mod outbox;
pub(crate) mod schema;

pub use diesel_error::{HasDieselError, classify, find_diesel_error};

/// Why an idempotent handler could not complete, other than its own error.
///
/// The error type `E` of an `#[idempotent]` handler must implement `From<inbox_diesel::Error>`;
/// the runtime returns these through it. In transaction mode the attempt's marker and its
/// business change commit together or not at all, so a redelivery processes the message, or
/// answers `Duplicate` if the attempt did commit: with every variant but one nothing of the
/// attempt was committed. The one is a lost connection ([`ErrorClass::ConnectionLost`]) at
/// `COMMIT` — the server may have committed before the connection went (a node killed
/// mid-commit), and the client cannot know; don't compensate on this error as if the work
/// were undone. In claim mode, see each variant.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The message key was refused before any SQL ran (empty, or longer than
    /// [`MessageKey::MAX_LEN`](crate::MessageKey::MAX_LEN)).
    InvalidKey(KeyError),
    /// The handler returned `Ok`, but an earlier statement of its transaction had failed and
    /// the handler swallowed that error. PostgreSQL aborts a transaction at its first failed
    /// statement, and its `COMMIT` then silently rolls back; MariaDB rolls the whole
    /// transaction back on a deadlock or a Galera abort, and the body's writes after it go
    /// into another transaction (`autocommit` is off while the handler runs). The runtime
    /// detects either, rolls back, and runs the handler again in a fresh transaction as it
    /// retries a deadlock (the swallowed error often was one) where nothing of the
    /// transaction had committed; when the retries run out with the error back in every
    /// fresh transaction tried, or where something had committed (MariaDB: a statement of
    /// the body that commits implicitly, DDL, committed the marker before it), it reports
    /// this instead of [`Outcome::Processed`](crate::Outcome::Processed). A swallowed error
    /// that no fresh transaction was tried against (`retries = 0`, or the retries spent on
    /// other failures), nothing committed, is reported as a transient failure instead
    /// ([`Error::Database`], a deadlock, `RetryLater`): the redelivery runs it again.
    TransactionAborted {
        /// How many transactions the body ran in, the error swallowed in each (1 when it
        /// was not retried, or when a statement of the body had committed).
        attempts: u32,
    },
    /// Claim mode: the body succeeded, but its claim was no longer this delivery's when the
    /// runtime came to stamp it: the lease had run out and another delivery took the claim
    /// over (or it was resolved by hand). Its class is [`ErrorClass::ClaimLost`]
    /// (`RetryLater`). This delivery's side effect happened; the claim's
    /// current holder runs its own and stamps the work, so the stamp of this attempt is never
    /// written. Do not acknowledge: the redelivery finds the work in flight or completed.
    /// Pass the message key downstream so that the two side effects are one; raise the lease
    /// (`lease_ms`) above the body's longest run.
    ClaimLost {
        /// The attempt whose claim was taken over.
        attempt: u32,
    },
    /// Claim mode: the body succeeded — its side effect happened — but stamping the claim
    /// complete failed (after `attempts` attempts, when the failure was transient): a
    /// privilege missing, a failover, a connection lost. The claim stays open until its lease
    /// ends, and then a redelivery would take it over and run the side effect again, unless
    /// `on_expired = "report"`. Do not retry blindly: record that the effect happened (stamp
    /// the row by hand, see [`purge::stale_claims`](crate::purge::stale_claims)), or make the
    /// downstream call idempotent by the message key. Its class is
    /// [`ErrorClass::EffectNotRecorded`]: [`Error::action`] is `Alert`, and its settlement
    /// parks the message (`DeadLetter`) rather than requeueing it.
    EffectNotRecorded {
        /// The attempt whose stamp failed.
        attempt: u32,
        /// How many times the stamp was tried.
        attempts: u32,
        /// The stamp's error.
        source: diesel::result::Error,
    },
    /// A setting of the server session that the runtime cannot work with, found before
    /// anything was written: MySQL and MariaDB `autocommit = 0` under claim mode or the purge,
    /// whose statements must each commit on their own. Fix the pool's session setup; alert,
    /// do not retry.
    Session(SessionProblem),
    /// The handler was called inside an open transaction of the caller's. The inbox writes
    /// the marker in a transaction of its own, committed with the body's work; inside
    /// another transaction it could not commit or roll back the marker with the body, so
    /// nothing ran. Call the handler outside any transaction — give it its own connection
    /// from the pool, or finish the caller's transaction first. A bug to fix: alert, do not
    /// retry. Found by diesel's transaction manager; a transaction opened with raw SQL
    /// (`batch_execute("BEGIN")`) is invisible to it, and in transaction mode the handler's
    /// own `BEGIN`/`COMMIT` then ends the caller's transaction — open transactions with
    /// `conn.transaction(…)`. Claim mode, whose claim must commit on its own before the
    /// side effect, asks the server too, before anything is written: PostgreSQL (a
    /// statement of the simple protocol whose transaction began before it), SQLite (a
    /// `BEGIN` it refuses), MariaDB (`@@in_transaction`, in the claim's insert); MySQL has
    /// no way to tell.
    CalledInsideTransaction,
    /// The handler's transaction was ended inside its body: by a `ROLLBACK`, `COMMIT` or
    /// `BEGIN` the body sent (a helper's raw transaction statements), or on MySQL and
    /// MariaDB a statement that commits implicitly. What the body wrote after that committed
    /// on its own — without the marker, or with it before the body was done — so the
    /// runtime can neither roll it back nor run the body again without doing some of it
    /// twice: the message is not marked processed, not retried, and this is reported (class
    /// `Misuse`: alert; every delivery would do the same). Inside a handler, use
    /// `conn.transaction(…)` (a savepoint), never raw transaction statements. Found before
    /// `COMMIT` (PostgreSQL: a setting that lives only in the handler's transaction; MariaDB
    /// and SQLite: its savepoint); on PostgreSQL also after a body's error, and on MariaDB
    /// after one the runtime recognises as not transient, where the marker had committed.
    TransactionEnded,
    /// The connection was lost after the handler's attempt ran past its idle bound
    /// (`idle_in_transaction_ms`): most likely the server ended the session for sitting idle
    /// in the transaction (PostgreSQL `idle_in_transaction_session_timeout`, MariaDB
    /// `idle_transaction_timeout`, which the handler sets) while the body waited on
    /// something else than the database — an HTTP call, a computation. The driver's own
    /// error says only "connection closed" or "server has gone away"; this one names the
    /// setting. Nothing committed. Its class is [`ErrorClass::ConnectionLost`]
    /// (`Reconnect`); a redelivery meets the same bound: raise `idle_in_transaction_ms`
    /// above the body's longest wait (or 0 for none).
    IdleBoundExceeded {
        /// The handler's bound, in milliseconds.
        idle_in_transaction_ms: u32,
        /// How long the attempt ran before the connection was lost.
        ran_ms: u64,
    },
    /// A handler that joins its caller's transaction (`transaction = "caller"`) was called
    /// with none open on the connection: the marker and the body's writes would have
    /// committed apart from the caller's, which is what the option exists to prevent.
    /// Nothing ran. Call it inside `conn.transaction(|conn| …)` (a transaction opened with
    /// raw SQL, `batch_execute("BEGIN")`, is not seen by diesel's manager, and refused the
    /// same). A bug to fix: alert, do not retry.
    NoTransactionToJoin,
    /// A claim-mode handler's `lease_ms`, given as an expression evaluated at each call (a
    /// setting), is outside 100 ms to 30 days (a literal is checked at compile time). Nothing
    /// ran. A lease shorter than 100 ms would never start the body (a claim whose insert
    /// takes over a quarter of its lease is given back); a longer one than 30 days would
    /// overflow the servers' timestamp arithmetic. Alert: every delivery would fail the same.
    InvalidLease {
        /// The lease the expression gave, in milliseconds.
        lease_ms: u64,
    },
    /// The inbox table cannot recognise a duplicate — its unique index on
    /// `(message_id, consumer)` is missing, not unique, on other columns or under another
    /// name than `constraint` says, partial, on a prefix, deferrable or invalid — or the table
    /// or a column is missing or of a type the runtime cannot write (the optional `key_text`
    /// included), or the table has what the runtime cannot rely on: a trigger, a rule, an
    /// inheritance child, an `UNLOGGED`, temporary or non-InnoDB table, missing privileges, a
    /// name that means different tables on different `search_path`s
    /// ([`SchemaProblem`](crate::schema::SchemaProblem) names each, with the fix). Found the first time
    /// a connection runs the handler, before any marker is written: nothing was processed, and
    /// no delivery will be until the table is fixed. Alert; do not retry.
    Schema(schema::SchemaError),
    /// A database error while beginning, claiming, or committing — after `retries` retries
    /// when it was transient. In claim mode, an error from the stamp leaves the claim open
    /// until its lease ends (the side effect has happened), then is taken over or reported
    /// as `on_expired` says.
    Database {
        /// What the error means ([`classify`](crate::classify)).
        class: ErrorClass,
        /// How many attempts were made (1 when the error was not retried).
        attempts: u32,
        /// The error diesel reported.
        source: diesel::result::Error,
    },
    /// A message was not written to the outbox ([`outbox::Outbox::publish`](crate::outbox::Outbox::publish)):
    /// refused before any SQL because its sink could not carry it (class
    /// [`ErrorClass::Other`]: dead-lettered, as the message that asked for it would fail on
    /// every delivery), or published outside a handler's body (class
    /// [`ErrorClass::Misuse`]).
    Outbox(outbox::OutboxProblem),
    /// The body wrote on a diesel connection that is not the handler's transaction — a
    /// helper's own connection, a pool without a wrapper — and the
    /// [net](crate::tripwire::net) stopped the statement before it was sent. The handler's
    /// transaction was rolled back (in claim mode, its claim released): nothing of the
    /// attempt is left. Class [`ErrorClass::Misuse`]: a bug to fix — pass the handler's
    /// connection to the code that writes.
    WriteOutsideTransaction(crate::tripwire::net::Escaped),
    /// The body checked a connection out of a guarded pool
    /// ([`tripwire::refuse_checkout`](crate::tripwire::refuse_checkout)), which refused it:
    /// whatever the body made of the refusal — handed it up in an error of its own, or
    /// caught it and went on —, the handler's transaction was rolled back and this is its
    /// answer. Class [`ErrorClass::Misuse`] (`Alert`): a bug to fix, never a message to
    /// dead-letter — pass the handler's connection to the code that needs one.
    CheckoutInsideHandler(crate::tripwire::InsideHandler),
    /// The process installed the [net](crate::tripwire::net::install), and the handler's
    /// own connection has none: replaced by the application's own default instrumentation
    /// set after `install()`, or opened before it. Refused before the body ran (its
    /// transaction rolled back, a claim released). Class [`ErrorClass::Misuse`] (`Alert`):
    /// call [`tripwire::net::install_around`](crate::tripwire::net::install_around)`(yours)`
    /// instead of both.
    NetMissing(crate::tripwire::net::NetMissing),
    /// A handler with `store_result`: its `Ok` value could not be stored, or a stored one
    /// could not be read back as the handler's type ([`StoredResultProblem`]). A value that
    /// cannot be stored is found after the body ran: in transaction mode its transaction
    /// was rolled back (nothing of the attempt is left; class [`ErrorClass::Other`], as
    /// every delivery of the message would fail the same way); in claim mode its side
    /// effect happened, and its claim is stamped complete without a result, so that it is
    /// not run again. A stored value that no longer reads as the handler's type (class
    /// [`ErrorClass::Misuse`]: the type changed under stored rows) is a bug to fix.
    StoredResult(StoredResultProblem),
    /// A handler with `fingerprint = …`: the key's marker was written for a request with
    /// another fingerprint — the same key reused for a different request. The body did not
    /// run, and nothing was written. Class [`ErrorClass::Other`]: every delivery of this
    /// request would meet the same marker (an HTTP API answers 422).
    KeyReused {
        /// The consumer whose marker was found.
        consumer: inbox_core::Consumer,
        /// The key reused.
        key: inbox_core::MessageKey,
    },
    /// A transaction-mode or batch handler met a marker of its key and consumer that is a
    /// claim-mode handler's claim, not completed: the same consumer name run in both modes
    /// (a rolling deploy that moves a handler to claim mode, say). A claim is not a
    /// duplicate's evidence — its side effect may not have run — so nothing ran, and the
    /// message is not answered `Duplicate`. `live`: the claim is within its lease (class
    /// [`ErrorClass::ClaimLost`], retried later: its stamp will answer `Duplicate`);
    /// otherwise its holder died before its stamp, and only claim mode can take it over
    /// ([`ErrorClass::Misuse`], an alert). Give each mode its own consumer name.
    OpenClaim {
        /// The consumer whose claim was found.
        consumer: inbox_core::Consumer,
        /// Whether the claim is within its lease.
        live: bool,
    },
    /// No connection could be taken from a pool: its checkout timed out, or it could not open
    /// one — a claim-mode handler's (given a pool in place of its connection: the claim and
    /// the stamp each take a connection of their own, and the side effect between them holds
    /// none), or the caller's before a handler ran ([`Error::checkout`]).
    /// `after_effect: None`: for the claim, or before the handler; nothing ran, class
    /// [`ErrorClass::ConnectionLost`] (`Reconnect`): redeliver later. `Some(attempt)`: for
    /// the stamp, after that attempt's side effect ran (checkouts were tried for twice the
    /// claim's lease): as [`Error::EffectNotRecorded`], class
    /// [`ErrorClass::EffectNotRecorded`] (`Alert`) — the claim stays open until a redelivery
    /// takes it over or reports it.
    Checkout {
        /// The attempt whose side effect ran before the checkout for its stamp failed.
        after_effect: Option<u32>,
        /// The pool's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Why a handler with `store_result` could not store its result or read one back.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoredResultProblem {
    /// The value's JSON is over the limit,
    /// [`MAX_STORED_RESULT_BYTES`](crate::MAX_STORED_RESULT_BYTES).
    TooLarge {
        /// The JSON text's length.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The value cannot be written as JSON (serde's error: a map with keys that are not
    /// strings, a `Serialize` implementation that fails).
    Encode(String),
    /// A stored value does not read as the handler's type (serde's error).
    Decode(String),
}

impl fmt::Display for StoredResultProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoredResultProblem::TooLarge { bytes, limit } => write!(
                f,
                "the handler's result is {bytes} bytes of JSON, over the {limit} a marker \
                 stores: return less (an id to look the rest up by)"
            ),
            StoredResultProblem::Encode(why) => {
                write!(f, "the handler's result cannot be stored as JSON: {why}")
            }
            StoredResultProblem::Decode(why) => write!(
                f,
                "a stored result does not read as the handler's type (changed since it was \
                 stored?): {why}"
            ),
        }
    }
}

impl Error {
    /// A connection the handler's caller could not take from its pool before calling the
    /// handler — a pump's closure that checks one out of bb8, deadpool or r2d2: nothing ran.
    /// Its class is [`ErrorClass::ConnectionLost`], so a pump settles it as the database's
    /// outage ([`Settlement::Retry`](inbox_core::Settlement::Retry) with `reconnect`): the
    /// delivery comes back after a delay, and the pump pauses and lets one delivery try
    /// alone while the others wait in hand, rather than spend their deliveries on a pool
    /// that has none to give.
    ///
    /// ```
    /// use inbox_diesel::{ErrorClass, Settle, Settlement};
    ///
    /// // What `pool.get().await` failed with (bb8's `RunError`, deadpool's `PoolError`).
    /// let timed_out = std::io::Error::new(std::io::ErrorKind::TimedOut, "no connection in 30 s");
    /// let error = inbox_diesel::Error::checkout(timed_out);
    /// assert_eq!(error.class(), ErrorClass::ConnectionLost);
    /// assert_eq!(error.settlement(), Settlement::Retry { reconnect: true });
    /// ```
    pub fn checkout(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Error::Checkout {
            after_effect: None,
            source: source.into(),
        }
    }

    /// The class of the failure: [`ErrorClass::Other`] for an invalid key.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::InvalidKey(_) => ErrorClass::Other,
            Error::TransactionAborted { .. } => ErrorClass::TransactionAborted,
            Error::ClaimLost { .. } => ErrorClass::ClaimLost,
            Error::EffectNotRecorded { .. } => ErrorClass::EffectNotRecorded,
            Error::Session(_) => ErrorClass::Misuse,
            Error::Schema(schema::SchemaError::Session { .. }) => ErrorClass::ServerSetting,
            Error::Schema(_) => ErrorClass::Schema,
            Error::CalledInsideTransaction
            | Error::NoTransactionToJoin
            | Error::InvalidLease { .. }
            | Error::TransactionEnded => ErrorClass::Misuse,
            Error::IdleBoundExceeded { .. } => ErrorClass::ConnectionLost,
            Error::Database { class, .. } => class.clone(),
            Error::Outbox(outbox::OutboxProblem::OutsideHandler) => ErrorClass::Misuse,
            Error::Outbox(_) => ErrorClass::Other,
            Error::WriteOutsideTransaction(_)
            | Error::CheckoutInsideHandler(_)
            | Error::NetMissing(_) => ErrorClass::Misuse,
            Error::StoredResult(StoredResultProblem::Decode(_)) => ErrorClass::Misuse,
            Error::StoredResult(_) => ErrorClass::Other,
            Error::KeyReused { .. } => ErrorClass::Other,
            Error::OpenClaim { live: true, .. } => ErrorClass::ClaimLost,
            Error::OpenClaim { live: false, .. } => ErrorClass::Misuse,
            Error::Checkout {
                after_effect: None, ..
            } => ErrorClass::ConnectionLost,
            Error::Checkout {
                after_effect: Some(_),
                ..
            } => ErrorClass::EffectNotRecorded,
        }
    }
}

impl Error {
    /// What a message pump does with this failure ([`Action`]): the class's action, except
    /// that an invalid key is dead-lettered (it can never be processed).
    ///
    /// ```
    /// use inbox_diesel::{Action, Error};
    ///
    /// assert_eq!(Error::CalledInsideTransaction.action(), Action::Alert);
    /// ```
    pub fn action(&self) -> Action {
        match self {
            Error::InvalidKey(_) => Action::DeadLetter,
            other => other.class().action(),
        }
    }

    /// How many attempts were made before the failure: more than one when a transient error
    /// was retried until the handler's retries were used up.
    pub fn attempts(&self) -> u32 {
        match self {
            Error::Database { attempts, .. }
            | Error::EffectNotRecorded { attempts, .. }
            | Error::TransactionAborted { attempts } => *attempts,
            _ => 1,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Which field is missing, how long the key was: the `KeyError`'s words, which
            // stays the `source()`.
            Error::InvalidKey(e) => write!(f, "inbox: invalid message key: {e}"),
            // What the check found, and its fix, in the error's own text: an operator who
            // prints the error sees the cause (a trigger, a privilege, the session's
            // language), not only that there is one.
            Error::Schema(problem) => write!(f, "inbox: {problem}; refusing to process"),
            Error::CalledInsideTransaction => f.write_str(
                "inbox: the handler was called inside an open transaction; nothing ran. Call \
                 it outside any transaction: it commits the marker with the body's work in a \
                 transaction of its own — or, where its callers hold a transaction (a job \
                 runner, another handler's or an HTTP request's body), declare it \
                 `transaction = \"caller_or_own\"` to join theirs",
            ),
            Error::IdleBoundExceeded {
                idle_in_transaction_ms,
                ran_ms,
            } => write!(
                f,
                "inbox: the connection was lost after the handler's transaction ran {ran_ms} ms, \
                 past its idle bound (idle_in_transaction_ms = {idle_in_transaction_ms}): the \
                 server ends a session whose transaction sits idle that long. Nothing \
                 committed; a body that waits on something else than the database for longer \
                 needs a larger idle_in_transaction_ms"
            ),
            Error::TransactionEnded => f.write_str(
                "inbox: the handler's transaction was ended inside its body (a ROLLBACK, COMMIT \
                 or BEGIN the body sent, or a statement that commits implicitly); what the body \
                 wrote after it committed on its own, and the message was not marked. Not \
                 retried: use conn.transaction(…) inside a handler, never raw transaction \
                 statements",
            ),
            Error::NoTransactionToJoin => f.write_str(
                "inbox: the handler joins its caller's transaction (`transaction = \"caller\"`), \
                 and none is open on this connection; nothing ran. Call it inside \
                 `conn.transaction(|conn| …)`",
            ),
            Error::InvalidLease { lease_ms } => write!(
                f,
                "inbox: the claim-mode handler's `lease_ms` is {lease_ms}, outside 100 (a \
                 shorter lease never starts the body) to 2592000000 (30 days); nothing ran. Set \
                 it above the side effect's longest run"
            ),
            Error::TransactionAborted { attempts } => write!(
                f,
                "inbox: the handler returned Ok, but its transaction had been aborted or ended \
                 under it in each of its {attempts} attempts (a database error swallowed \
                 inside the handler, or on MariaDB a ROLLBACK the body sent); it was rolled back, and the message not marked. Retried first \
                 where nothing of it had committed; on MySQL and MariaDB a statement in the \
                 body that commits implicitly (DDL) ends the transaction too, committing what \
                 came before it. Propagate database errors with `?`",
            ),
            Error::ClaimLost { attempt } => write!(
                f,
                "inbox: the claim of attempt {attempt} was taken over by another delivery after \
                 its lease ended; this attempt's side effect ran, and it is the other delivery \
                 that completes the work"
            ),
            Error::EffectNotRecorded {
                attempt, attempts, ..
            } => write!(
                f,
                "inbox: the side effect of attempt {attempt} ran, but stamping its claim \
                 complete failed ({attempts} tries); the claim stays open until its lease \
                 ends, and a delivery that takes it over would run the effect again: record \
                 the effect by hand"
            ),
            Error::Session(problem) => write!(f, "inbox: {problem}"),
            Error::Outbox(problem) => write!(f, "inbox {problem}"),
            Error::WriteOutsideTransaction(escaped) => write!(f, "inbox: {escaped}"),
            Error::CheckoutInsideHandler(inside) => write!(f, "inbox: {inside}"),
            Error::NetMissing(missing) => write!(f, "inbox: {missing}"),
            Error::StoredResult(problem) => write!(f, "inbox: {problem}"),
            Error::KeyReused { consumer, .. } => write!(
                f,
                "inbox: the key was used before by a request with another fingerprint \
                 (consumer {consumer}); nothing ran"
            ),
            Error::OpenClaim {
                consumer,
                live: true,
            } => write!(
                f,
                "inbox: the marker of this key is a claim-mode handler's claim, within its \
                 lease (consumer {consumer} is run in claim mode elsewhere, in a rolling \
                 deploy say); nothing ran. Retried later: once that claim is stamped, this \
                 message is a duplicate. Give each mode its own consumer name"
            ),
            Error::OpenClaim {
                consumer,
                live: false,
            } => write!(
                f,
                "inbox: the marker of this key is a claim-mode handler's claim whose lease \
                 ended without its stamp (consumer {consumer} is run in claim mode \
                 elsewhere): its holder died before or after its side effect, which a \
                 handler of this mode cannot tell; nothing ran, and the message is not a \
                 duplicate. A claim-mode handler of the consumer takes it over (`on_expired`); \
                 give each mode its own consumer name"
            ),
            Error::Checkout {
                after_effect: None,
                source,
            } => write!(
                f,
                "inbox: the pool gave no connection; nothing ran, redeliver later: {source}"
            ),
            Error::Checkout {
                after_effect: Some(attempt),
                source,
            } => write!(
                f,
                "inbox: the side effect of attempt {attempt} ran, but the pool gave its stamp \
                 no connection ({source}); the claim holds redeliveries back until its lease \
                 ends, then is taken over or reported as `on_expired` says: record the effect \
                 (stamp the row) or make the downstream call idempotent by the message key"
            ),
            // The server's words too (which table, which setting, which limit): an operator
            // who logs only `{e}` reads what to act on. The diesel error stays the
            // `source()`, where handlers' error types look for it.
            Error::Database {
                class,
                attempts: 1,
                source,
            } => write!(f, "inbox: {class}: {}", server_words(source)),
            Error::Database {
                class,
                attempts,
                source,
            } => write!(
                f,
                "inbox: {class} after {attempts} attempts: {}",
                server_words(source)
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::InvalidKey(e) => Some(e),
            // Its text is in this error's own: what it stands on is the source.
            Error::Schema(e) => std::error::Error::source(e),
            Error::TransactionAborted { .. }
            | Error::ClaimLost { .. }
            | Error::Session(_)
            | Error::Outbox(_)
            | Error::WriteOutsideTransaction(_)
            | Error::CheckoutInsideHandler(_)
            | Error::NetMissing(_)
            | Error::StoredResult(_)
            | Error::KeyReused { .. }
            | Error::OpenClaim { .. }
            | Error::CalledInsideTransaction
            | Error::NoTransactionToJoin
            | Error::InvalidLease { .. }
            | Error::TransactionEnded
            | Error::IdleBoundExceeded { .. } => None,
            Error::Database { source, .. } | Error::EffectNotRecorded { source, .. } => {
                Some(source)
            }
            Error::Checkout { source, .. } => Some(&**source),
        }
    }
}

/// A diesel error's text as the server gave it: a database error's message, or diesel's
/// own text for anything else.
fn server_words(error: &diesel::result::Error) -> String {
    match error {
        diesel::result::Error::DatabaseError(_, info) => info.message().to_owned(),
        other => other.to_string(),
    }
}

/// A server-session setting the runtime cannot work with ([`Error::Session`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionProblem {
    /// MySQL and MariaDB: `autocommit` is off on the session. Claim mode commits its claim
    /// and its stamp each on its own, and the purge each batch: with `autocommit = 0` none
    /// of them would commit, and the claim would vanish with the connection — after the
    /// side effect ran.
    AutocommitOff {
        /// What needed it: `"claim mode"` or `"purge"`.
        needed_by: &'static str,
    },
    /// MySQL and MariaDB: the session's clock is set (`SET timestamp = …`), and the
    /// purge's cutoff would be computed from it: a marker written a moment ago could go.
    ClockSet,
}

impl fmt::Display for SessionProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionProblem::AutocommitOff { needed_by } => write!(
                f,
                "autocommit is off on this MySQL/MariaDB session, and {needed_by} commits each \
                 of its statements on its own: nothing was written; give it connections with \
                 autocommit on (remove `SET autocommit = 0` from the pool's connection setup)"
            ),
            SessionProblem::ClockSet => f.write_str(
                "the session's clock is set (`SET timestamp`), and times the runtime writes or \
                 compares must be the server's: nothing was done; `SET timestamp = DEFAULT`",
            ),
        }
    }
}

/// Settled by its [`action`](Error::action) ([`Settlement::of_action`](inbox_core::Settlement::of_action)),
/// except [`Error::EffectNotRecorded`]: parked (`DeadLetter`) as well as alerted on, since a
/// redelivery would run the effect again.
impl inbox_core::Settle for Error {
    fn settlement(&self) -> inbox_core::Settlement {
        match self {
            Error::InvalidKey(_) => inbox_core::Settlement::DeadLetter,
            other => inbox_core::Settle::settlement(&other.class()),
        }
    }
}

impl From<KeyError> for Error {
    fn from(e: KeyError) -> Self {
        Error::InvalidKey(e)
    }
}

/// Lets a body whose error type is this one use `?` on diesel calls: the error is
/// [`Error::Database`] of its class, after one attempt. The inbox's own error, carried inside
/// a diesel error (as `QueryResult` handlers get it), comes back out as it was.
impl From<diesel::result::Error> for Error {
    fn from(source: diesel::result::Error) -> Self {
        match source {
            diesel::result::Error::QueryBuilderError(inner) if inner.is::<Error>() => {
                *inner.downcast::<Error>().expect("checked by `is`")
            }
            source => Error::Database {
                class: crate::classify::class_of(&source, &inbox_core::InboxSchema::DEFAULT),
                attempts: 1,
                source,
            },
        }
    }
}

/// Lets handlers return `diesel::QueryResult<T>`: a database failure comes back as the
/// original diesel error where that error says what the runtime decided (`classify` of it
/// gives the same class); the others — and a database failure the runtime classed otherwise
/// than its error reads, such as a refused marker insert, a schema fault rather than a
/// business violation — as a `QueryBuilderError` carrying this error, whose class
/// [`classify`] returns.
impl From<Error> for diesel::result::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Database {
                class,
                source,
                attempts,
            } => {
                if crate::classify::class_of(&source, &inbox_core::InboxSchema::DEFAULT) == class {
                    return source;
                }
                diesel::result::Error::QueryBuilderError(Box::new(Error::Database {
                    class,
                    source,
                    attempts,
                }))
            }
            other => diesel::result::Error::QueryBuilderError(Box::new(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{SchemaError, SchemaProblem};

    /// An operator who prints the error reads the cause and its fix, once: in its text, not
    /// only in its source (which then is not repeated by a report that walks the chain).
    #[test]
    fn a_schema_refusal_says_what_the_check_found() {
        let error = Error::Schema(SchemaError::Mismatch {
            table: "inbox",
            resolved: None,
            problems: vec![SchemaProblem::Unsupported {
                found: "the session's messages in ru_RU".into(),
                why: "the runtime reads some errors by their text",
                fix: "GRANT SET ON PARAMETER lc_messages TO app".into(),
            }],
        });
        let text = error.to_string();
        assert!(text.contains("the session's messages in ru_RU"), "{text}");
        assert!(
            text.contains("GRANT SET ON PARAMETER lc_messages"),
            "{text}"
        );
        assert!(std::error::Error::source(&error).is_none());
    }
}
