//! The sync driver: the steps of the transaction mode, performed on a diesel connection.

use std::thread;

use diesel::connection::{AnsiTransactionManager, TransactionManager};
use diesel::result::Error as DieselError;
use inbox_core::{ErrorClass, KeyError, MessageKey, Outcome, RetryDecision};

use crate::__private::HandlerSpec;
use crate::{Error, InboxConnection, classify};

/// What one attempt ended with.
enum Step<T> {
    Processed(T),
    Duplicate,
}

/// Why one attempt failed. Every variant is returned after the transaction was rolled back.
enum Failure<T, E> {
    /// The body returned `Err`; kept as the `Result` the body returned so that the
    /// macro-generated probe can look inside it.
    Body(Result<T, E>),
    /// Beginning, claiming or committing failed.
    Database(DieselError),
    /// The body returned `Ok` over an aborted transaction.
    Aborted,
}

/// Runs `body` once per message key and consumer: the expansion of `#[idempotent]`.
///
/// 1. `BEGIN` (SQLite `BEGIN IMMEDIATE`; PostgreSQL with the handler's isolation level);
/// 2. claim the marker first (`INSERT … ON CONFLICT DO NOTHING RETURNING id`); no row back
///    means the message was processed before: roll back, return `Duplicate`, body not run;
/// 3. run the body on the same connection;
/// 4. `Ok` → commit → `Processed`; `Err` → roll back → the body's error.
///
/// A transient failure (serialization failure, deadlock, busy database) — in any step, or
/// in the body when `probe` recognises a diesel error in what it returned — is retried in a
/// fresh transaction as `spec.retry` says.
pub fn run<C, T, E, B, P>(
    conn: &mut C,
    spec: &HandlerSpec,
    key: Result<MessageKey, KeyError>,
    mut body: B,
    probe: P,
    inbox_error: fn(Error) -> E,
) -> Result<Outcome<T>, E>
where
    C: InboxConnection,
    B: FnMut(&mut C) -> Result<T, E>,
    P: Fn(&Result<T, E>) -> Option<ErrorClass>,
{
    let key = key.map_err(|e| inbox_error(Error::InvalidKey(e)))?;
    let span = tracing::info_span!("inbox", consumer = spec.consumer.as_str());
    let _entered = span.enter();
    tracing::debug!(key = %key, "handling message");

    let mut retries = 0;
    loop {
        let failure = match attempt(conn, spec, &key, &mut body) {
            Ok(Step::Processed(value)) => {
                tracing::debug!(outcome = "processed", "committed with its marker");
                return Ok(Outcome::Processed(value));
            }
            Ok(Step::Duplicate) => {
                tracing::info!(outcome = "duplicate", "marker exists; body not run");
                return Ok(Outcome::Duplicate {
                    consumer: spec.consumer.clone(),
                    key,
                });
            }
            Err(failure) => failure,
        };
        let class = match &failure {
            Failure::Body(result) => probe(result),
            Failure::Database(e) => Some(classify(e, &spec.schema)),
            Failure::Aborted => Some(ErrorClass::TransactionAborted),
        };
        let decision = match &class {
            Some(class) => spec.retry.decide(class, retries, fastrand::f64()),
            None => RetryDecision::GiveUp,
        };
        match decision {
            RetryDecision::Retry { after } => {
                retries += 1;
                tracing::warn!(
                    class = %class.unwrap_or(ErrorClass::Other),
                    retry = retries,
                    after_ms = after.as_millis() as u64,
                    "transient failure; retrying in a fresh transaction"
                );
                thread::sleep(after);
            }
            RetryDecision::GiveUp => {
                return Err(give_up(failure, class, retries + 1, inbox_error));
            }
        }
    }
}

fn give_up<T, E>(
    failure: Failure<T, E>,
    class: Option<ErrorClass>,
    attempts: u32,
    inbox_error: fn(Error) -> E,
) -> E {
    match failure {
        Failure::Body(Err(e)) => {
            tracing::debug!(outcome = "failed", "handler returned an error; rolled back");
            e
        }
        Failure::Body(Ok(_)) => unreachable!("a body failure holds the body's Err"),
        Failure::Aborted => {
            tracing::error!(
                outcome = "aborted",
                "handler returned Ok over an aborted transaction (a swallowed database error); \
                 rolled back"
            );
            inbox_error(Error::TransactionAborted)
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

fn attempt<C, T, E, B>(
    conn: &mut C,
    spec: &HandlerSpec,
    key: &MessageKey,
    body: &mut B,
) -> Result<Step<T>, Failure<T, E>>
where
    C: InboxConnection,
    B: FnMut(&mut C) -> Result<T, E>,
{
    conn.begin_inbox_transaction(spec)
        .map_err(Failure::Database)?;
    match conn.claim_marker(&spec.schema, spec.consumer.as_str(), key) {
        Ok(true) => {}
        Ok(false) => {
            // ROLLBACK, not COMMIT: nothing was written, and on PostgreSQL a commit would
            // flush the WAL for the sequence value the conflicting insert consumed.
            roll_back(conn);
            return Ok(Step::Duplicate);
        }
        Err(e) => {
            roll_back(conn);
            return Err(Failure::Database(e));
        }
    }
    match body(conn) {
        Ok(value) => match conn.commit_inbox_transaction() {
            Ok(()) => Ok(Step::Processed(value)),
            Err(e) => {
                // A failed COMMIT may or may not have ended the transaction.
                roll_back(conn);
                match classify(&e, &spec.schema) {
                    ErrorClass::TransactionAborted => Err(Failure::Aborted),
                    _ => Err(Failure::Database(e)),
                }
            }
        },
        Err(e) => {
            roll_back(conn);
            Err(Failure::Body(Err(e)))
        }
    }
}

/// Rolls back the handler's transaction if it is still open. A failure to roll back is
/// logged, not returned: the error that caused the rollback is the one the caller needs, and
/// diesel marks the connection broken so that a pool discards it.
fn roll_back<C: InboxConnection>(conn: &mut C) {
    match AnsiTransactionManager::rollback_transaction(conn) {
        Ok(()) | Err(DieselError::NotInTransaction) => {}
        Err(e) => tracing::error!(error = %e, "rollback failed"),
    }
}
