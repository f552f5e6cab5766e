//! Transaction mode: the marker and the body in one transaction ([`drive`]), or in the
//! caller's ([`drive_joined`]), and the retry loop around them.
//!
//! The runtime's steps are `async fn`s over [`Steps`]. The async runtime awaits them; the
//! sync runtime polls them once with a no-op waker — every step of a sync connection
//! completes in that poll, because none of them awaits anything. So the order of the steps,
//! the retry loop, and what each failure means exist in one place.

use std::time::Instant;

use diesel::QueryResult;
use diesel::result::Error as DieselError;
use inbox_core::{ErrorClass, HandlerOutcome, MessageKey, RetryDecision};

use crate::classify;
use crate::dialect::layout::Layout;
use crate::dialect::marker::{Keeps, MarkerValues};
use crate::error::Error;
use crate::runtime::batch::{Claims, claimed_with_begin};
use crate::runtime::checked::{
    forget_check, needs_recheck, rechecked_layout, schema_checked, stop_caching,
};
use crate::runtime::evidence::{evidence, refused_marker};
use crate::runtime::failure::{
    Abandoned, DEADLOCK, Failure, deadlock_if_ended, deadlock_unread, discard, ended_in_body,
    give_up, idle_bound_hint, nothing_committed, recover, take_back,
};
use crate::runtime::steps::{
    Body, Decided, Panicked, Steps, end, is_stopped, roll_back, run_body_on, stopped,
};
use crate::runtime::stored::Remembered;
use crate::runtime::stored::{kept_columns, kept_duplicate};
use crate::spec::HandlerSpec;
use crate::telemetry;
use tracing::Instrument;

/// What one delivery in transaction mode is handled with: the handler's settings, its body,
/// how the body's error is classified (`probe`), the outcome type's witness that it can answer
/// `InFlight`, what the marker keeps, and the inbox's error as the handler's.
pub(crate) struct Handling<T, E, B, P, W> {
    pub(crate) spec: &'static HandlerSpec,
    pub(crate) body: B,
    pub(crate) probe: P,
    pub(crate) in_flight: Option<W>,
    pub(crate) remembered: Remembered<T>,
    pub(crate) inbox_error: fn(Error) -> E,
}

/// Runs `body` once per message key and consumer:
///
/// 1. `BEGIN` (SQLite `BEGIN IMMEDIATE`; PostgreSQL with the handler's isolation level);
/// 2. claim the markers first (`INSERT … ON CONFLICT DO NOTHING RETURNING …`); when none is
///    new, every message was processed before: roll back, return `None`, body not run;
/// 3. run the body on the same connection;
/// 4. `Ok` → commit → `Some(value)`; `Err` → roll back → the body's error.
///
/// A transient failure (serialization failure, deadlock, busy database) — in any step, or
/// in the body when `probe` recognises a diesel error in what it returned — is retried in a
/// fresh transaction as `spec.retry` says.
///
/// `in_flight` is the outcome type's witness that it can answer `InFlight`: without one, a
/// marker found locked is an error like any other (`on_locked = "in_flight"` needs it).
pub(crate) async fn drive<S, K, T, E, B, P, W: Copy>(
    mut steps: S,
    claims: &K,
    handling: Handling<T, E, B, P, W>,
) -> Result<Decided<T, W>, E>
where
    S: Steps,
    K: Claims,
    B: Body<S::Conn, Result<T, E>>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
{
    // Sync deliveries take no lock of the watch's: they cannot be cancelled mid-way.
    if S::CANCELLABLE
        && let Err(source) = recover(&mut steps).await
    {
        return Err((handling.inbox_error)(Error::Database {
            class: ErrorClass::ConnectionLost,
            attempts: 1,
            source,
        }));
    }
    take_back(&mut steps).await;
    let mut watched = Abandoned::watch(steps);
    let decided = run_delivery(&mut watched.steps, claims, handling).await;
    watched.finished = true;
    decided
}

/// `transaction = "caller"`: runs `body` for one message inside the transaction its caller
/// opened through diesel (a job runner's, holding the job's row): the marker and the body's
/// writes commit with the caller's own, or roll back with them. In a savepoint of that
/// transaction:
///
/// 1. the startup check, then the marker's insert; a marker of this key and consumer that
///    exists (committed — another delivery's uncommitted one is waited for) is a duplicate:
///    back to the savepoint, `Duplicate`, the body not run;
/// 2. the body; `Ok` releases the savepoint — `Processed` means written, for the caller to
///    commit — and `Err` rolls back to it, the caller's transaction going on as it was.
///
/// Nothing is retried here: a deadlock or a serialization failure has ended, or doomed, the
/// caller's whole transaction, which only the caller can run again. No transaction open is
/// refused before anything is written ([`Error::NoTransactionToJoin`]).
pub(crate) async fn drive_joined<S, T, E, B, P, W: Copy>(
    steps: S,
    key: &MessageKey,
    handling: Handling<T, E, B, P, W>,
) -> Result<Decided<T, W>, E>
where
    S: Steps,
    B: Body<S::Conn, Result<T, E>>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
{
    // A transaction of the caller's is not the runtime's to wait on: no `on_locked` here.
    let Handling {
        spec,
        mut body,
        probe,
        remembered,
        inbox_error,
        ..
    } = handling;
    // One attempt, as the other modes report theirs.
    let failed = |steps: &mut S, source: DieselError| {
        let class = Some(classify(&source, &spec.schema));
        discard(steps, class.as_ref());
        give_up(
            spec,
            Failure::<T, E>::Database(source),
            class,
            1,
            inbox_error,
        )
    };
    let mut joined = Joined { steps, open: false };
    let steps = &mut joined.steps;
    if steps.depth() == 0 {
        tracing::error!(
            outcome = "misuse",
            "the handler joins its caller's transaction, and none is open"
        );
        telemetry::failed(spec, ErrorClass::Misuse.label());
        return Err(inbox_error(Error::NoTransactionToJoin));
    }
    // A session the remembered check has not seen (a new connection where a checked one
    // was; MariaDB's session mark missing), or a table changed since: checked again, once.
    let mut rechecked = false;
    let claimed = loop {
        let steps = &mut joined.steps;
        if let Err(e) = steps.savepoint().await {
            return Err(failed(steps, e));
        }
        joined.open = true;
        let steps = &mut joined.steps;
        let checked = match rechecked {
            false => schema_checked(steps, spec, false, inbox_error).await,
            true => rechecked_layout(steps, spec, false, inbox_error).await,
        };
        let (layout, run) = match checked.and_then(|(layout, run)| {
            kept_columns(run, layout, &remembered, inbox_error).map(|()| (layout, run))
        }) {
            Ok(checked) => checked,
            Err(e) => {
                roll_back(steps).await;
                joined.open = false;
                return Err(e);
            }
        };
        match steps.claim(run, key, layout).await {
            // The request's fingerprint, with the marker (a stored result writes both after
            // the body).
            Ok(true) => match (remembered.fingerprint, &remembered.store) {
                (Some(fingerprint), None) => {
                    if let Err(e) = steps.write_fingerprint(run, key, fingerprint).await {
                        roll_back(steps).await;
                        joined.open = false;
                        break Err(e);
                    }
                    break Ok((layout, run, true));
                }
                _ => break Ok((layout, run, true)),
            },
            // The insert met a marker: its own evidence, read again at what committed last.
            Ok(false) => {
                roll_back(steps).await;
                joined.open = false;
                let steps = &mut joined.steps;
                break match steps.markers_present(run, &[key.stored_id()], true).await {
                    Ok(found) => evidence(run, found, 1).map(|()| (layout, run, false)),
                    Err(e) => Err(e),
                };
            }
            Err(e) => {
                roll_back(steps).await;
                joined.open = false;
                if !rechecked && needs_recheck(&e, spec) {
                    rechecked = true;
                    continue;
                }
                break Err(refused_marker(e, &spec.schema));
            }
        }
    };
    let steps = &mut joined.steps;
    let (layout, run) = match claimed {
        Ok((layout, run, true)) => (layout, run),
        Ok((_, run, false)) => {
            joined.open = false;
            telemetry::attempt(1);
            tracing::info!(outcome = "duplicate", "marker exists; body not run");
            // What the marker kept, read in the caller's transaction at what committed last.
            return kept_duplicate(steps, run, Some(key), remembered, true, inbox_error).await;
        }
        Err(e) => {
            joined.open = false;
            return Err(failed(steps, e));
        }
    };
    let origin = Some(Claims::origin(key, spec));
    let mut result = match run_body_on(steps, spec, &mut body, origin).await {
        Ok(result) => result,
        Err(Panicked(payload)) if is_stopped(&*payload) => {
            roll_back(steps).await;
            joined.open = false;
            return Err(failed(
                steps,
                DieselError::QueryBuilderError(Box::new(stopped(payload))),
            ));
        }
        Err(Panicked(payload)) => {
            roll_back(steps).await;
            joined.open = false;
            tracing::error!(
                outcome = "panicked",
                "the handler's body panicked; rolled back to its savepoint"
            );
            std::panic::resume_unwind(payload)
        }
    };
    if result.is_err() {
        roll_back(steps).await;
        joined.open = false;
        let class = probe(&mut result, 1, None);
        discard(steps, class.as_ref());
        return Err(give_up(
            spec,
            Failure::Body(result, false),
            class,
            1,
            inbox_error,
        ));
    }
    // The result, stored with the marker in the savepoint.
    if let Err(e) = store_result(steps, run, key, &result, remembered, layout).await {
        roll_back(steps).await;
        joined.open = false;
        return Err(failed(steps, e));
    }
    let depth = steps.depth();
    let released = steps.release().await;
    if let Err(e) = released {
        // The savepoint could not be released (a transaction aborted by an error the body
        // swallowed, or one the body ended): where the manager still counts it, back to it —
        // the caller's transaction as it was before the handler; where it does not, the
        // manager is put in error, so that the caller's commit is refused rather than
        // answered for a transaction that is not what the caller thinks.
        if steps.depth() == depth {
            roll_back(steps).await;
        } else {
            steps.abandon();
        }
        joined.open = false;
        return Err(failed(steps, e));
    }
    joined.open = false;
    telemetry::attempt(1);
    tracing::debug!(
        outcome = "processed",
        "written with its marker, for the caller to commit"
    );
    // The work is in the caller's transaction, not committed: the caller's commit is the
    // handler's (`AfterCommit` is the caller's own point, after it).
    crash_point!(BeforeCommit);
    Ok(Decided::Processed(
        result.ok().expect("checked by `is_err`"),
    ))
}

/// A delivery in its caller's transaction ([`drive_joined`]). Dropped with its savepoint
/// open — an async handler's future cancelled mid-way — it puts the connection's
/// transaction manager in error ([`Steps::abandon`]): diesel's manager would otherwise
/// count the savepoint as the caller's transaction, and the caller's commit would release
/// the savepoint and leave the transaction open, committing nothing while answering `Ok`.
/// Refused instead (`BrokenTransactionManager`): the caller's transaction is lost, loudly.
pub(super) struct Joined<S: Steps> {
    steps: S,
    open: bool,
}

impl<S: Steps> Drop for Joined<S> {
    fn drop(&mut self) {
        if self.open && !std::thread::panicking() {
            self.steps.abandon();
        }
    }
}

pub(super) async fn run_delivery<S, K, T, E, B, P, W: Copy>(
    steps: &mut S,
    claims: &K,
    handling: Handling<T, E, B, P, W>,
) -> Result<Decided<T, W>, E>
where
    S: Steps,
    K: Claims,
    B: Body<S::Conn, Result<T, E>>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
{
    let Handling {
        spec,
        mut body,
        probe,
        in_flight,
        remembered,
        inbox_error,
    } = handling;
    let (mut layout, mut run) = schema_checked(steps, spec, false, inbox_error).await?;
    kept_columns(spec, layout, &remembered, inbox_error)?;
    if spec.precheck && claims.completed_before(steps, run, layout).await {
        tracing::info!(
            outcome = "duplicate",
            "completed marker found before the transaction"
        );
        return kept_duplicate(steps, run, claims.key(), remembered, false, inbox_error).await;
    }
    let (mut retries, mut rechecked, mut uncached) = (0, false, false);
    // Attempts whose body swallowed an error that ended the transaction, nothing committed.
    let mut swallows = 0u32;
    loop {
        let started = Instant::now();
        let attempted = attempt(steps, run, layout, claims, &mut body, in_flight, remembered).await;
        // A commit or a duplicate's rollback put back what `begin` set, in its round trip; a
        // transaction the caller opened refused `begin` before it set anything, and is not
        // the runtime's to end.
        if !matches!(attempted, Ok(Decided::Processed(_) | Decided::Duplicate(_)))
            && !matches!(&attempted, Err(Failure::Database(e)) if crate::io::status::refused_inside(e))
        {
            end(steps, run, layout).await;
        }
        let mut failure = match attempted {
            Ok(decided) => {
                telemetry::attempt(retries + 1);
                match &decided {
                    Decided::Processed(_) => {
                        tracing::debug!(outcome = "processed", "committed with its marker")
                    }
                    Decided::Duplicate(_) => {
                        tracing::info!(outcome = "duplicate", "marker exists; body not run");
                        return kept_duplicate(
                            steps,
                            run,
                            claims.key(),
                            remembered,
                            false,
                            inbox_error,
                        )
                        .await;
                    }
                    Decided::InFlight(_) => tracing::info!(
                        outcome = "in_flight",
                        "another delivery holds the marker; body not run"
                    ),
                }
                return Ok(decided);
            }
            Err(failure) => failure,
        };
        if let Failure::Database(e) = &failure
            && !rechecked
            && needs_recheck(e, spec)
        {
            rechecked = true;
            (layout, run) = rechecked_layout(steps, spec, false, inbox_error).await?;
            continue;
        }
        let class = match &mut failure {
            // The body's error learns how many attempts were made, as the runtime's own do.
            Failure::Body(result, ended) => {
                let read = probe(result, retries + 1, None);
                let decided = deadlock_if_ended(read.clone(), *ended);
                // The body's error learns what the runtime decided it is, where its type can
                // keep it: read again after the runtime gives up, it says the same.
                if decided != read {
                    probe(result, retries + 1, decided.clone());
                }
                decided
            }
            Failure::Database(e) => Some(classify(e, &spec.schema)),
            Failure::Aborted => Some(ErrorClass::TransactionAborted),
        };
        // A prepared statement lost or clashing on the server: behind a transaction-mode
        // pooler each transaction may run on another server connection, which other clients'
        // statements of diesel's names share — a fresh connection meets the same, for ever.
        // The connection stops caching statements (diesel's cache: unnamed statements then),
        // once per delivery, and the attempt runs again.
        if class == Some(ErrorClass::StatementLost) && !uncached {
            uncached = true;
            stop_caching(steps);
            continue;
        }
        if class == Some(ErrorClass::Schema) {
            forget_check(steps, spec);
        }
        if class == Some(ErrorClass::ConnectionLost)
            && let Some(error) = idle_bound_hint(spec, started.elapsed())
        {
            let failure: Failure<T, E> =
                Failure::Database(DieselError::QueryBuilderError(Box::new(error)));
            discard(steps, class.as_ref());
            return Err(give_up(spec, failure, class, retries + 1, inbox_error));
        }
        // The body failed after the server had ended its transaction (MariaDB): an error it
        // swallowed ended it, and what failed is a consequence — a row the rollback took
        // away, a write in another transaction. A transient failure, whatever it reads as.
        let ended_under_body = matches!(&failure, Failure::Body(_, true))
            && !matches!(
                class,
                Some(ErrorClass::Transient(_) | ErrorClass::ConnectionLost)
            );
        // The body swallowed an error that ended its transaction — often a deadlock, a
        // serialization failure, a lock timeout, which a fresh transaction gets past:
        // retried as those are, where nothing of it committed, before it is reported.
        let swallowed = match &class {
            Some(class) if *class == ErrorClass::TransactionAborted || ended_under_body => {
                nothing_committed(steps, spec, layout, claims).await
            }
            _ => false,
        };
        // Ended under the body with something of it committed (MariaDB: the marker, by a
        // statement of the body that commits — `BEGIN`, DDL — before it failed): a retry would
        // meet that marker and answer a duplicate for work the body never finished. Reported
        // as a transaction the body ended. (A transient error the body returned is retried as
        // it is: a deadlock ends the transaction too, and a copy of the message may have
        // committed its marker since — the retry answers `Duplicate`, rightly.)
        if ended_under_body && class.is_some() && !swallowed {
            let failure: Failure<T, E> = ended_in_body();
            let class = Some(ErrorClass::Misuse);
            return Err(give_up(spec, failure, class, retries + 1, inbox_error));
        }
        let decision = match &class {
            Some(_) if swallowed => {
                swallows += 1;
                spec.retry.decide(&DEADLOCK, retries, fastrand::f64())
            }
            Some(class) => spec.retry.decide(class, retries, fastrand::f64()),
            None => RetryDecision::GiveUp,
        };
        // Given up on a swallowed error that no fresh transaction was tried against (the
        // retries spent on other failures, or none allowed): the redelivery is that fresh
        // transaction — a transient failure, as the deadlock it most often is, not an alert.
        // One that came back in every fresh transaction tried is the body's own: reported as
        // it is (`TransactionAborted`, an alert; the body's error).
        if swallowed && swallows == 1 && matches!(decision, RetryDecision::GiveUp) {
            failure = match failure {
                Failure::Aborted => {
                    Failure::Database(DieselError::QueryBuilderError(Box::new(Error::Database {
                        class: DEADLOCK,
                        attempts: retries + 1,
                        source: DieselError::QueryBuilderError(Box::new(
                            Error::TransactionAborted {
                                attempts: retries + 1,
                            },
                        )),
                    })))
                }
                Failure::Body(mut result, ended) => {
                    probe(&mut result, retries + 1, Some(DEADLOCK));
                    Failure::Body(result, ended)
                }
                other => other,
            };
            tracing::error!(
                "the body swallowed a database error that ended its transaction, and went on; \
                 nothing of it committed: reported as a transient failure, for the \
                 redelivery to run it again"
            );
            return Err(give_up(
                spec,
                failure,
                Some(DEADLOCK),
                retries + 1,
                inbox_error,
            ));
        }
        match decision {
            RetryDecision::Retry { after } => {
                retries += 1;
                telemetry::retried(spec, class.as_ref().unwrap_or(&ErrorClass::Other));
                tracing::warn!(
                    class = %class.unwrap_or(ErrorClass::Other),
                    retry = retries,
                    after_ms = after.as_millis() as u64,
                    "transient failure; retrying in a fresh transaction"
                );
                steps.pause(after).await;
            }
            RetryDecision::GiveUp => {
                discard(steps, class.as_ref());
                return Err(give_up(spec, failure, class, retries + 1, inbox_error));
            }
        }
    }
}

/// One message's run in transaction mode — in its own transaction ([`drive`]), or in the
/// caller's (`joined`, [`drive_joined`]) — under the run's span, answered in the handler's
/// outcome type `A` and reported when it ends.
pub(crate) async fn message<S, T, E, B, P, A>(
    steps: S,
    joined: bool,
    key: MessageKey,
    handling: Handling<T, E, B, P, A::InFlightWitness>,
) -> Result<A, E>
where
    S: Steps,
    B: Body<S::Conn, Result<T, E>>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
    A: HandlerOutcome<T>,
{
    let spec = handling.spec;
    // The stored id, not the key: a key can be business data (an e-mail address) or carry
    // control characters; the key itself is logged escaped, at DEBUG (`drive`).
    let run = telemetry::Run::message(spec, &key, false);
    let span = run.instrument_span();
    let decided = match joined {
        true => drive_joined(steps, &key, handling).instrument(span).await,
        false => drive(steps, &key, handling).instrument(span).await,
    };
    let result = decided.map(|value| outcome(spec, key, value));
    run.finish(&result);
    result
}

/// The outcome of a single message, in the handler's outcome type.
pub(crate) fn outcome<T, A: HandlerOutcome<T>>(
    spec: &'static HandlerSpec,
    key: MessageKey,
    decided: Decided<T, A::InFlightWitness>,
) -> A {
    let consumer = spec.consumer.clone();
    match decided {
        Decided::Processed(value) => A::from_processed(value),
        Decided::Duplicate(stored) => A::from_duplicate(consumer, key, stored),
        Decided::InFlight(witness) => A::from_in_flight(consumer, key, None, witness),
    }
}

pub(super) async fn attempt<S, K, T, E, B, W: Copy>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    layout: Layout,
    claims: &K,
    body: &mut B,
    in_flight: Option<W>,
    remembered: Remembered<T>,
) -> Result<Decided<T, W>, Failure<T, E>>
where
    S: Steps,
    K: Claims,
    B: Body<S::Conn, Result<T, E>>,
{
    let keeps = Keeps {
        result: remembered.store.is_some(),
        fingerprint: remembered.fingerprint.is_some(),
    };
    // `deferred`: the marker is written at the commit, with what it keeps.
    let (claimed, deferred) = claims
        .begin_and_claim(steps, spec, layout, keeps)
        .await
        .map_err(Failure::Database)?;
    if spec.in_flight_when_locked {
        // The short lock wait was for the marker: the body waits for locks as usual.
        if let Err(e) = steps
            .wait_for_locks(spec, matches!(claimed, Ok(true)))
            .await
        {
            roll_back(steps).await;
            match &claimed {
                // The claim's own error is the one that says what happened.
                Err(_) => tracing::warn!(error = %e, "putting back the lock wait failed"),
                Ok(_) => return Err(Failure::Database(e)),
            }
        }
    }
    match claimed {
        Ok(true) => {
            // The request's fingerprint, with the marker: a delivery that meets the marker
            // sees it once this transaction commits, and then with it. A handler that stores
            // its result writes both in one statement after the body.
            if let (Some(fingerprint), Some(key), None, false) = (
                remembered.fingerprint,
                claims.key(),
                &remembered.store,
                deferred,
            ) && let Err(e) = steps.write_fingerprint(spec, key, fingerprint).await
            {
                roll_back(steps).await;
                return Err(Failure::Database(e));
            }
        }
        Ok(false) => {
            // ROLLBACK, not COMMIT: nothing was written, and on PostgreSQL a commit would
            // flush the WAL for the sequence value the conflicting insert consumed. With it,
            // what `begin` set for the session is put back.
            if let Err(e) = steps.roll_back_and_end(spec, layout).await {
                tracing::error!(error = %e, "rollback failed");
                roll_back(steps).await;
                end(steps, spec, layout).await;
            }
            return Ok(Decided::Duplicate(None));
        }
        Err(e) => {
            let e = deadlock_unread(steps, spec, layout, e).await;
            roll_back(steps).await;
            // Another delivery's uncommitted marker: answered at once instead of waited for,
            // when the outcome type can say so.
            if let Some(witness) = in_flight
                && spec.in_flight_when_locked
                && classify(&e, &spec.schema)
                    == ErrorClass::Transient(inbox_core::TransientKind::LockWaitTimeout)
            {
                return Ok(Decided::InFlight(witness));
            }
            return Err(Failure::Database(refused_marker(e, &spec.schema)));
        }
    }
    let origin = Some(claims.origin(spec));
    let result = match run_body_on(steps, spec, body, origin).await {
        Ok(result) => result,
        Err(Panicked(payload)) if is_stopped(&*payload) => {
            roll_back(steps).await;
            return Err(Failure::Database(DieselError::QueryBuilderError(Box::new(
                stopped(payload),
            ))));
        }
        Err(Panicked(payload)) => {
            // Before the panic goes on: roll back, so that the connection is usable again and
            // the marker's lock is released for a redelivery at once.
            roll_back(steps).await;
            end(steps, spec, layout).await;
            tracing::error!(
                outcome = "panicked",
                "the handler's body panicked; its transaction was rolled back"
            );
            std::panic::resume_unwind(payload)
        }
    };
    // The result, stored with the marker in this transaction: a deferred marker is
    // written with it at the commit, else the marker is updated now.
    let text = match stored_text(&result, remembered, layout) {
        Ok(text) => text,
        Err(e) => {
            roll_back(steps).await;
            return Err(Failure::Database(e));
        }
    };
    if let (Some(key), Some(text), false) = (claims.key(), &text, deferred)
        && let Err(e) = steps
            .store_result(spec, key, text.clone(), remembered.fingerprint, None)
            .await
    {
        roll_back(steps).await;
        return Err(Failure::Database(e));
    }
    if result.is_ok() {
        crash_point!(BeforeCommit);
    }
    match result {
        Ok(value) => {
            let committed = match claims.key().filter(|_| deferred) {
                Some(key) => {
                    let values = MarkerValues {
                        result: text.as_deref(),
                        fingerprint: remembered.fingerprint.as_ref().map(|f| &f.as_bytes()[..]),
                    };
                    steps.commit_with_marker(spec, key, layout, values).await
                }
                None => steps.commit(spec, layout).await,
            };
            committed_or_not(steps, spec, claims.key(), deferred, committed, value).await
        }
        Err(e) => {
            let ended = layout.mariadb && steps.ended_by_server().await;
            let ended_in_body = !layout.mariadb && steps.ended_in_body().await;
            roll_back(steps).await;
            if ended_in_body {
                steps.discard_foreign().await;
                return Err(self::ended_in_body());
            }
            Err(Failure::Body(Err(e), ended))
        }
    }
}

/// What the handler's commit answered decides: processed, or — a deferred marker
/// refused by a marker committed without the key's lock — the duplicate it is, the body's
/// work rolled back; or the failure, after a rollback.
async fn committed_or_not<S: Steps, T, E, W>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    key: Option<&MessageKey>,
    deferred: bool,
    committed: QueryResult<()>,
    value: T,
) -> Result<Decided<T, W>, Failure<T, E>> {
    match committed {
        Ok(()) => {
            crash_point!(AfterCommit);
            Ok(Decided::Processed(value))
        }
        Err(e) => {
            let e = match key.filter(|_| deferred) {
                Some(key) => match refused_by_marker(e, spec) {
                    Ok(claimed) => {
                        return match claimed_with_begin(steps, spec, key, claimed).await {
                            Ok(_) => Ok(Decided::Duplicate(None)),
                            Err(e) => Err(Failure::Database(e)),
                        };
                    }
                    Err(e) => e,
                },
                None => e,
            };
            // A failed COMMIT may or may not have ended the transaction.
            roll_back(steps).await;
            if crate::dialect::ended_in_body(&e) {
                steps.discard_foreign().await;
                return Err(ended_in_body());
            }
            match classify(&e, &spec.schema) {
                ErrorClass::TransactionAborted => Err(Failure::Aborted),
                _ => Err(Failure::Database(e)),
            }
        }
    }
}

/// The body's value, stored as the result of `key`'s marker with the request's fingerprint,
/// in the open transaction or savepoint: for a handler that stores its result
/// (`remembered`), after a body that succeeded.
async fn store_result<S: Steps, T, E>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    key: &MessageKey,
    result: &Result<T, E>,
    remembered: Remembered<T>,
    layout: Layout,
) -> QueryResult<()> {
    let Some(text) = stored_text(result, remembered, layout)? else {
        return Ok(());
    };
    steps
        .store_result(spec, key, text, remembered.fingerprint, None)
        .await
        .map(drop)
}

/// The body's value as it is stored, for a handler that stores its result (`remembered`),
/// after a body that succeeded; `None` otherwise.
fn stored_text<T, E>(
    result: &Result<T, E>,
    remembered: Remembered<T>,
    layout: Layout,
) -> QueryResult<Option<String>> {
    let (Ok(value), Some(store)) = (result, remembered.store) else {
        return Ok(None);
    };
    store
        .encode(value, layout)
        .map(Some)
        .map_err(|problem| DieselError::QueryBuilderError(Box::new(problem)))
}

/// A deferred marker's insert refused by a unique index, as [`claimed_with_begin`] reads
/// the start's claim: the inbox's own index is a duplicate's `Ok(false)`, another's (a
/// partition's) the error, for it to tell. Any other failure is handed back.
fn refused_by_marker(
    error: DieselError,
    spec: &'static HandlerSpec,
) -> Result<QueryResult<bool>, DieselError> {
    match classify(&error, &spec.schema) {
        ErrorClass::InboxDuplicate => Ok(Ok(false)),
        ErrorClass::UniqueViolation { .. } => Ok(Err(error)),
        _ => Err(error),
    }
}
