//! Claim mode: acquire the claim (each statement committing on its own), run the body
//! outside any transaction, stamp the claim completed — or release it.

use std::marker::PhantomData;
use std::time::{Duration, Instant};

use diesel::QueryResult;
use diesel::result::Error as DieselError;
use inbox_core::{ErrorClass, HandlerOutcome, MessageKey, RetryDecision};

use crate::classify;
use crate::dialect::claim::{ClaimAnswer, ClaimState, ClaimStep};
use crate::dialect::layout::Layout;
use crate::error::Error;
use crate::guard::NoConnection;
use crate::runtime::checked::{
    forget_check, needs_recheck, rechecked_layout, schema_checked, statement_lost,
};
use crate::runtime::claim::ClaimSpec;
use crate::runtime::evidence::swallowed;
use crate::runtime::failure::{Failure, discard, give_up, take_back};
use crate::runtime::steps::{Body, Panicked, Steps, is_stopped, run_body, run_body_on, stopped};
use crate::runtime::stored::{Remembered, kept_columns, read_kept, stored_value};
use crate::runtime::transaction::Handling;
use crate::spec::HandlerSpec;
use crate::telemetry;
use crate::value::Fingerprint;

mod acquire;
mod on_pool;
mod stamp;

pub(super) use acquire::*;
pub(crate) use on_pool::{Checkouts, OnCheckout, claim_on_pool};
pub(crate) use stamp::*;

/// Runs `body` in claim mode: its side effect cannot join a transaction, so the inbox row is
/// claimed and committed before it, and stamped after it.
///
/// 1. claim: insert a live claim (attempt 1) unless a row exists; if one does, read it —
///    completed → `Duplicate`; live → `InFlight`; released by a failed attempt → take it over;
///    expired → report it (`StaleClaim`) when the outcome type can say so (`on_expired =
///    "report"` returns [`StaleClaimOutcome`](inbox_core::StaleClaimOutcome)), else take it over. A takeover is a
///    compare-and-set on the attempt counter: of concurrent deliveries, one wins, the others
///    read the row again and find it live;
/// 2. run the body, outside any transaction;
/// 3. `Ok` → stamp `processed_at` where the counter is still this attempt's: 0 rows means
///    the claim was taken over, and this attempt does not stamp (`Error::ClaimLost`);
///    `Err` → release the claim for a redelivery to retry, return the body's error.
///
/// Transient database errors in steps 1 and 3 are retried as `spec.retry` says; the body is
/// not: the broker's redelivery retries it, after the release.
pub(crate) async fn drive_claim<S, T, E, B, A>(
    mut steps: S,
    claim: ClaimSpec,
    key: MessageKey,
    handling: Handling<T, E, B, (), ()>,
) -> Result<A, E>
where
    S: Steps,
    B: Body<S::Conn, Result<T, E>>,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let (start, mut body) = Start::of(handling, claim, &key);
    let (spec, inbox_error) = (start.spec, start.inbox_error);
    let (holding, remembered) = match claim_started(&mut steps, start).await? {
        Started::Answered(answer) => return Ok(answer),
        Started::Holding(holding, remembered) => (holding, remembered),
    };
    let ran = run_body_on(&mut steps, spec, &mut body, None).await;
    claim_finished(&mut steps, spec, holding, key, ran, remembered, inbox_error).await
}

/// Phase 1 of claim mode ([`claim_started`]): what the claim is made with, answered in the
/// outcome type `A`.
pub(crate) struct Start<'k, A, T, E> {
    outcome: PhantomData<A>,
    spec: &'static HandlerSpec,
    claim: ClaimSpec,
    key: &'k MessageKey,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
}

impl<'k, A, T, E> Start<'k, A, T, E> {
    /// The claim of `key` a claim-mode `handling` makes, and its body. Claim mode's body is
    /// not retried here (no probe), and its in-flight answer is the claim's own.
    pub(crate) fn of<B>(
        handling: Handling<T, E, B, (), ()>,
        claim: ClaimSpec,
        key: &'k MessageKey,
    ) -> (Self, B) {
        let Handling {
            spec,
            body,
            remembered,
            inbox_error,
            ..
        } = handling;
        let start = Start {
            outcome: PhantomData,
            spec,
            claim,
            key,
            remembered,
            inbox_error,
        };
        (start, body)
    }
}

/// What phase 1 of claim mode left: the answer, without a claim (a duplicate, a claim in
/// flight, a stale claim reported), or the claim this delivery holds.
pub(crate) enum Started<A, T> {
    Answered(A),
    Holding(Holding, Remembered<T>),
}

/// The claim a delivery holds while its body runs: its attempt, and the table's layout as
/// the claim found it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holding {
    attempt: u32,
    layout: Layout,
    run: &'static HandlerSpec,
    /// Whether the claim's connection had the net ([`tripwire::net`](crate::tripwire::net)).
    netted: bool,
    /// When the claim's lease ends at the latest: its lease from before the claim was sent.
    lease_ends: Instant,
    /// The claim's lease.
    lease_ms: u64,
}

/// Phase 1 of claim mode ([`drive_claim`]): the claim, committed on its own.
pub(crate) async fn claim_started<S, T, E, A>(
    steps: &mut S,
    start: Start<'_, A, T, E>,
) -> Result<Started<A, T>, E>
where
    S: Steps,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let Start {
        spec,
        claim,
        key,
        remembered,
        inbox_error,
        ..
    } = start;
    tracing::debug!(key = ?key, "handling message");
    // A lease given as an expression (a setting), checked before anything runs; a literal
    // was checked at compile time.
    if !claim.valid() {
        return Err(inbox_error(Error::InvalidLease {
            lease_ms: claim.lease_ms,
        }));
    }
    take_back(steps).await;
    let (mut layout, mut run) = schema_checked(steps, spec, true, inbox_error).await?;
    kept_columns(spec, layout, &remembered, inbox_error)?;
    let (mut retries, mut rechecked, mut uncached) = (0, false, false);
    let (attempt, sent) = loop {
        let sent = Instant::now();
        let acquired = acquire(
            steps,
            run,
            claim,
            layout,
            key,
            A::STALE_CLAIM,
            remembered.fingerprint,
        )
        .await;
        match acquired {
            Ok(Acquired::Reused) => {
                tracing::warn!(
                    outcome = "key_reused",
                    "the key's claim is of a request with another fingerprint; body not run"
                );
                telemetry::failed(spec, ErrorClass::Other.label());
                return Err(inbox_error(Error::KeyReused {
                    consumer: spec.consumer.clone(),
                    key: key.clone(),
                }));
            }
            Ok(Acquired::Attempt(attempt)) => break (attempt, sent),
            Ok(Acquired::Completed) => {
                tracing::info!(outcome = "duplicate", "work completed before; body not run");
                let stored = match remembered.store {
                    Some(_) => {
                        let kept =
                            read_kept(steps, run, key, &remembered, false, inbox_error).await?;
                        stored_value(run, key, kept, remembered, inbox_error)?
                    }
                    None => None,
                };
                return Ok(Started::Answered(A::from_duplicate(
                    spec.consumer.clone(),
                    key.clone(),
                    stored,
                )));
            }
            Ok(Acquired::Live(lease_left)) => {
                tracing::info!(
                    outcome = "in_flight",
                    lease_left_ms = lease_left.map(|left| left.as_millis() as u64),
                    "claimed by a live delivery; body not run"
                );
                return Ok(Started::Answered(A::from_in_flight(
                    spec.consumer.clone(),
                    key.clone(),
                    lease_left,
                    (),
                )));
            }
            Ok(Acquired::Stale(attempts, witness)) => {
                telemetry::stale_claim(spec, "reported");
                tracing::warn!(
                    outcome = "stale_claim",
                    attempts,
                    "a claim's lease ended without completion; left for reconciliation"
                );
                return Ok(Started::Answered(A::from_stale_claim(
                    spec.consumer.clone(),
                    key.clone(),
                    attempts,
                    witness,
                )));
            }
            Err(e) if !rechecked && needs_recheck(&e, spec) => {
                rechecked = true;
                (layout, run) = rechecked_layout(steps, spec, true, inbox_error).await?;
            }
            // A prepared statement lost or clashing behind a transaction-mode pooler: as in
            // transaction mode, the connection stops caching them, once, and claims again.
            Err(e) if !uncached && statement_lost(steps, &e, spec) => uncached = true,
            Err(e) => wait_or_give_up(steps, spec, e, &mut retries, inbox_error).await?,
        }
    };

    tracing::debug!(attempt, "claimed; running the body");
    crash_point!(AfterClaim);
    telemetry::attempt(attempt);
    let netted = steps.net().is_some();
    Ok(Started::Holding(
        Holding {
            attempt,
            layout,
            run,
            netted,
            lease_ends: sent + Duration::from_millis(claim.lease_ms),
            lease_ms: claim.lease_ms,
        },
        remembered,
    ))
}

/// Phase 2 of claim mode on a pool: the body, run with no connection checked out. Every
/// write it sends on a connection with the net escapes; where the net is installed and the
/// claim's connection had none, the body is refused ([`Error::NetMissing`]), as on one
/// connection.
pub(crate) async fn run_detached<T, E, B>(
    spec: &'static HandlerSpec,
    holding: &Holding,
    body: &mut B,
) -> Result<Result<T, E>, Panicked>
where
    B: Body<NoConnection, Result<T, E>>,
{
    /// No net's address: the body has no connection of its own to write on.
    const NO_CONNECTION: usize = 0;
    let net = holding.netted.then_some(NO_CONNECTION);
    run_body(spec, body, &mut NoConnection::new(), None, net).await
}

/// The release of claim mode on a pool after a body that failed or was stopped, which got
/// no usable connection (`source`: the pool's checkout, or the connection's preparation):
/// the claim stays until its lease ends, and the body answers as
/// it would have. (A body that succeeded is stamped, never released.)
pub(crate) fn claim_unsettled<T, E, A>(
    spec: &'static HandlerSpec,
    holding: Holding,
    ran: Result<Result<T, E>, Panicked>,
    source: crate::pool::CheckoutFailure,
    inbox_error: fn(Error) -> E,
) -> Result<A, E> {
    let attempt = holding.attempt;
    match ran {
        Ok(Ok(_)) => unreachable!("a body that succeeded is stamped, not released"),
        Ok(Err(e)) => {
            tracing::error!(
                outcome = "failed",
                attempt,
                error = %source,
                "handler returned an error; no connection of the pool could release its claim"
            );
            telemetry::failed(spec, telemetry::error_type(None));
            Err(e)
        }
        Err(Panicked(payload)) if is_stopped(&*payload) => {
            tracing::error!(error = %source, "no connection of the pool could release the claim of a stopped body");
            telemetry::failed(spec, ErrorClass::Misuse.label());
            Err(inbox_error(stopped(payload)))
        }
        Err(Panicked(payload)) => panicked_holding(attempt, payload),
    }
}

/// A panic in a claim-mode body goes on once it is logged. No transaction is open while the
/// body runs: the panic leaves the outcome of the side effect unknown, as a crash does, and
/// is left as one — the claim stays until its lease ends, then is taken over or reported, as
/// the outcome type says.
fn panicked_holding(attempt: u32, payload: Box<dyn std::any::Any + Send>) -> ! {
    tracing::error!(
        outcome = "panicked",
        attempt,
        "the handler's body panicked; its claim stays until the lease ends"
    );
    std::panic::resume_unwind(payload)
}

/// A checkout for a claim-mode handler's claim failed: nothing ran.
pub(crate) fn claim_not_started<E>(
    spec: &'static HandlerSpec,
    source: crate::pool::CheckoutFailure,
    inbox_error: fn(Error) -> E,
) -> E {
    tracing::warn!(error = %source, "the pool gave the claim no connection; nothing ran");
    telemetry::failed(spec, ErrorClass::ConnectionLost.label());
    inbox_error(Error::Checkout {
        after_effect: None,
        source,
    })
}

/// How many checkouts the release of a claim made on a pool is given (after that, the claim
/// is left to its lease).
pub(crate) const RELEASE_CHECKOUTS: u32 = 3;

/// Before phase 3 on a connection checked out for it: a connection a cancelled delivery
/// left in error is taken back, and the connection is prepared as phase 1 prepares its own
/// (no transaction open, SQLite's busy timeout).
pub(crate) async fn prepared_for_stamp<S: Steps>(
    steps: &mut S,
    holding: &Holding,
) -> QueryResult<()> {
    take_back(steps).await;
    steps.prepare_claim(holding.run).await
}

/// Phase 2 and 3 of claim mode ([`drive_claim`]): what the body `ran` to, settled on the
/// claim `holding` — released after an error, stamped after success — on `steps`, the
/// connection of the claim or another one.
pub(crate) async fn claim_finished<S, T, E, A>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    holding: Holding,
    key: MessageKey,
    ran: Result<Result<T, E>, Panicked>,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<A, E>
where
    S: Steps,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let Holding { attempt, run, .. } = holding;
    let result = match ran {
        Ok(result) => result,
        Err(Panicked(payload)) if is_stopped(&*payload) => {
            if let Err(error) = steps
                .claim_step(run, &key, ClaimStep::Release { attempt })
                .await
            {
                tracing::error!(error = %error, "releasing the claim of a stopped body failed");
            }
            telemetry::failed(spec, ErrorClass::Misuse.label());
            return Err(inbox_error(stopped(payload)));
        }
        Err(Panicked(payload)) => panicked_holding(attempt, payload),
    };
    let value = match result {
        Ok(value) => value,
        Err(e) => {
            match steps
                .claim_step(run, &key, ClaimStep::Release { attempt })
                .await
            {
                Ok(answer) if answer.changed() => {
                    tracing::debug!(
                        outcome = "failed",
                        attempt,
                        "handler returned an error; claim released"
                    )
                }
                Ok(_) => tracing::warn!(
                    outcome = "failed",
                    attempt,
                    "handler returned an error; its claim had been taken over"
                ),
                // The claim stays until its lease ends; then it is reclaimed or reported.
                Err(error) => tracing::error!(
                    outcome = "failed",
                    attempt,
                    error = %error,
                    "handler returned an error; releasing its claim failed"
                ),
            }
            telemetry::failed(spec, telemetry::error_type(None));
            return Err(e);
        }
    };

    let mut stamp = ToStamp::before_stamp(spec, &holding, &key, &value, remembered, inbox_error);
    match claim_stamped(steps, &mut stamp, value, None).await {
        Ok(answer) => Ok(answer),
        Err(Unstamped::Failed(e)) => Err(e),
        Err(Unstamped::Lost { .. }) => unreachable!("on its own connection, a stamp is not lost"),
    }
}
