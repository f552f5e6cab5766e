//! Claim mode on a pool, written once for both IO models: the claim, the stamp and a
//! release each on a connection checked out for it ([`Checkouts`]), the body with none.

use std::marker::PhantomData;
use std::time::Duration;

use inbox_core::{HandlerOutcome, MessageKey};

use super::{
    Holding, RELEASE_CHECKOUTS, StampFailure, StampTries, Start, Started, ToStamp, Unstamped,
    claim_finished, claim_not_started, claim_stamped, claim_started, claim_unsettled,
    prepared_for_stamp, run_detached, stamp_given_up,
};
use crate::error::Error;
use crate::guard::NoConnection;
use crate::pool::CheckoutFailure;
use crate::runtime::claim::ClaimSpec;
use crate::runtime::steps::{Body, Panicked, Steps};
use crate::runtime::stored::Remembered;
use crate::runtime::transaction::Handling;
use crate::spec::HandlerSpec;

/// A pool as claim mode takes its connections, sync or async.
pub(crate) trait Checkouts {
    /// Runs `work` on a connection checked out for it, as the runtime's steps; the pool's
    /// failure to give one, with the work back.
    async fn on_checkout<W: OnCheckout>(&self, work: W) -> Result<W::Output, (W, CheckoutFailure)>;

    /// Waits before the stamp's next try.
    async fn pause(&self, pause: Duration);
}

/// One phase's work on a checkout.
pub(crate) trait OnCheckout {
    /// What the phase answers.
    type Output;

    /// Does the phase's work on the checkout's steps.
    async fn run<S: Steps>(self, steps: &mut S) -> Self::Output;
}

/// Runs a claim-mode call on a pool: the claim and the stamp each on a checkout of their own,
/// the body with none; see `drive_claim` for the steps.
pub(crate) async fn claim_on_pool<P, T, E, B, A>(
    pool: &P,
    claim: ClaimSpec,
    key: MessageKey,
    handling: Handling<T, E, B, (), ()>,
) -> Result<A, E>
where
    P: Checkouts,
    B: Body<NoConnection, Result<T, E>>,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let (start, mut body) = Start::of(handling, claim, &key);
    let (spec, inbox_error) = (start.spec, start.inbox_error);
    let started = match pool.on_checkout(start).await {
        Ok(started) => started?,
        Err((_, source)) => return Err(claim_not_started(spec, source, inbox_error)),
    };
    let (holding, remembered) = match started {
        Started::Answered(answer) => return Ok(answer),
        Started::Holding(holding, remembered) => (holding, remembered),
    };
    let ran = run_detached(spec, &holding, &mut body).await;
    let mut value = match ran {
        Ok(Ok(value)) => value,
        ran => return released_on_pool(pool, spec, holding, key, ran, inbox_error).await,
    };
    let mut stamp = ToStamp::before_stamp(spec, &holding, &key, &value, remembered, inbox_error);
    let mut tries = StampTries::new(&holding);
    loop {
        let work = Stamp {
            outcome: PhantomData::<A>,
            stamp: &mut stamp,
            value,
            elsewhere: tries.elsewhere(),
        };
        let failure = match pool.on_checkout(work).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(Unstamped::Failed(e))) => return Err(e),
            Ok(Err(Unstamped::Lost { value: back, error })) => {
                value = back;
                StampFailure::Database(error)
            }
            Err((work, source)) => {
                value = work.value;
                StampFailure::Checkout(source)
            }
        };
        match tries.failed(&failure) {
            Some(pause) => pool.pause(pause).await,
            None => {
                let tried = tries.tries();
                return Err(stamp_given_up(spec, &holding, failure, tried, inbox_error));
            }
        }
    }
}

/// Phase 3 of claim mode on a pool after a body that failed or was stopped: its claim
/// released on a connection checked out for it (three checkouts tried; the claim is left
/// to its lease when none comes).
async fn released_on_pool<P, T, E, A>(
    pool: &P,
    spec: &'static HandlerSpec,
    holding: Holding,
    key: MessageKey,
    ran: Result<Result<T, E>, Panicked>,
    inbox_error: fn(Error) -> E,
) -> Result<A, E>
where
    P: Checkouts,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let mut release = Release {
        outcome: PhantomData::<A>,
        spec,
        holding,
        key,
        ran,
        inbox_error,
    };
    let mut failure = None;
    for _ in 0..RELEASE_CHECKOUTS {
        match pool.on_checkout(release).await {
            Ok(answer) => return answer,
            Err((back, source)) => {
                release = back;
                failure = Some(source);
            }
        }
    }
    let source = failure.expect("a checkout was tried");
    claim_unsettled(spec, holding, release.ran, source, inbox_error)
}

/// Phase 1: the claim, committed on its own.
impl<A, T, E> OnCheckout for Start<'_, A, T, E>
where
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    type Output = Result<Started<A, T>, E>;

    async fn run<S: Steps>(self, steps: &mut S) -> Self::Output {
        claim_started(steps, self).await
    }
}

/// Phase 3 after a body that succeeded: the stamp.
struct Stamp<'s, 'k, A, T, E> {
    outcome: PhantomData<A>,
    stamp: &'s mut ToStamp<'k, E>,
    value: T,
    elsewhere: super::Elsewhere,
}

impl<A, T, E> OnCheckout for Stamp<'_, '_, A, T, E>
where
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    type Output = Result<A, Unstamped<T, E>>;

    async fn run<S: Steps>(self, steps: &mut S) -> Self::Output {
        let elsewhere = Some(self.elsewhere);
        claim_stamped(steps, self.stamp, self.value, elsewhere).await
    }
}

/// Phase 3 after a body that failed or was stopped: the release.
struct Release<A, T, E> {
    outcome: PhantomData<A>,
    spec: &'static HandlerSpec,
    holding: Holding,
    key: MessageKey,
    ran: Result<Result<T, E>, Panicked>,
    inbox_error: fn(Error) -> E,
}

impl<A, T, E> OnCheckout for Release<A, T, E>
where
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    type Output = Result<A, E>;

    async fn run<S: Steps>(self, steps: &mut S) -> Self::Output {
        let Release {
            spec,
            holding,
            key,
            ran,
            inbox_error,
            ..
        } = self;
        if let Err(e) = prepared_for_stamp(steps, &holding).await {
            return claim_unsettled(spec, holding, ran, Box::new(e), inbox_error);
        }
        let nothing = Remembered::nothing();
        claim_finished(steps, spec, holding, key, ran, nothing, inbox_error).await
    }
}
