//! Claim mode on a sync connection or a pool: the claim, the body given no connection, the
//! stamp or the release, each on a connection of the pool where the handler was given one.

use super::*;

/// Runs a call's body in claim mode, on a sync connection or a pool (`conn`: `&mut` the one,
/// `&` the other, [`crate::pool`]); see `claim_mode::drive_claim` for the steps.
pub fn run_claim<H, T, E, B, A>(
    mut conn: H,
    claim: ClaimSpec,
    call: Call<A, T, E, B>,
) -> Result<A, E>
where
    H: ClaimTarget,
    H::Connection: HandlerConnection,
    H::Pool: ClaimPool<Connection = H::Connection>,
    B: FnOnce(&mut NoConnection) -> Result<T, E>,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let Call {
        spec,
        key,
        body,
        remembered,
        inbox_error,
        ..
    } = call;
    let key = key.map_err(|e| Run::invalid_key(spec, inbox_error(Error::InvalidKey(e))))?;
    match conn.__inbox_claim_target() {
        ClaimOn::Connection(conn) => conn.__inbox_visit(Claim {
            outcome: PhantomData::<A>,
            spec,
            claim,
            key,
            body,
            remembered,
            inbox_error,
        }),
        ClaimOn::Pool(pool) => claim_on_pool(pool, spec, claim, key, body, remembered, inbox_error),
    }
}

/// Claim mode on a pool: the claim and the stamp each on a checkout of their own, the body
/// with none.
pub(super) fn claim_on_pool<P, T, E, B, A>(
    pool: &P,
    spec: &'static HandlerSpec,
    claim: ClaimSpec,
    key: MessageKey,
    body: B,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<A, E>
where
    P: ClaimPool,
    P::Connection: HandlerConnection,
    B: FnOnce(&mut NoConnection) -> Result<T, E>,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let run = Run::message(spec, &key, true);
    let span = run.instrument_span();
    let result = span.in_scope(|| {
        let started = {
            let mut checkout = pool
                .checkout()
                .map_err(|source| claim_mode::claim_not_started(spec, source, inbox_error))?;
            (*checkout).__inbox_visit(ClaimStart {
                outcome: PhantomData::<A>,
                spec,
                claim,
                key: &key,
                remembered,
                inbox_error,
            })?
        };
        let (holding, remembered) = match started {
            claim_mode::Started::Answered(answer) => return Ok(answer),
            claim_mode::Started::Holding(holding, remembered) => (holding, remembered),
        };
        let ran = complete_now(claim_mode::run_detached(
            spec,
            &holding,
            &mut OnceWithoutConnection(Some(body)),
        ));
        let mut value = match ran {
            Ok(Ok(value)) => value,
            ran => return released_on_pool(pool, spec, holding, key, ran, inbox_error),
        };
        let mut stamp = claim_mode::ToStamp::before_stamp(&value, &holding, remembered);
        let mut tries = claim_mode::StampTries::new(&holding);
        loop {
            let failure = match pool.checkout() {
                Ok(mut checkout) => {
                    let stamped = (*checkout).__inbox_visit(ClaimStamp {
                        outcome: PhantomData::<A>,
                        spec,
                        holding: &holding,
                        key: &key,
                        value,
                        stamp: &mut stamp,
                        inbox_error,
                        elsewhere: tries.elsewhere(),
                    });
                    match stamped {
                        Ok(answer) => return Ok(answer),
                        Err(claim_mode::Unstamped::Failed(e)) => return Err(e),
                        Err(claim_mode::Unstamped::Lost { value: back, error }) => {
                            value = back;
                            claim_mode::StampFailure::Database(error)
                        }
                    }
                }
                Err(source) => claim_mode::StampFailure::Checkout(source),
            };
            match tries.failed(&failure) {
                Some(pause) => std::thread::sleep(pause),
                None => {
                    return Err(claim_mode::stamp_given_up(
                        spec,
                        &holding,
                        failure,
                        tries.tries(),
                        inbox_error,
                    ));
                }
            }
        }
    });
    run.finish(&result);
    result
}

/// Phase 1 of claim mode on a pool's checkout.
pub(super) struct ClaimStart<'k, A, T, E> {
    outcome: PhantomData<A>,
    spec: &'static HandlerSpec,
    claim: ClaimSpec,
    key: &'k MessageKey,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
}

impl<O, A, T, E> Visit<O> for ClaimStart<'_, A, T, E>
where
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    type Output = Result<claim_mode::Started<A, T>, E>;

    fn visit<C: InboxConnection>(
        self,
        outer: &mut O,
        project: fn(&mut O) -> &mut C,
    ) -> Self::Output {
        let ClaimStart {
            spec,
            claim,
            key,
            remembered,
            inbox_error,
            ..
        } = self;
        complete_now(claim_mode::claim_started(
            &mut Projected { outer, project },
            spec,
            claim,
            key,
            remembered,
            inbox_error,
        ))
    }
}

/// Phase 3 of claim mode on a pool after a body that failed or was stopped: its claim
/// released on a connection checked out for it (three checkouts tried; the claim is left
/// to its lease when none comes).
pub(super) fn released_on_pool<P, T, E, A>(
    pool: &P,
    spec: &'static HandlerSpec,
    holding: claim_mode::Holding,
    key: MessageKey,
    ran: Result<Result<T, E>, steps::Panicked>,
    inbox_error: fn(Error) -> E,
) -> Result<A, E>
where
    P: ClaimPool,
    P::Connection: HandlerConnection,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let mut failure = None;
    for _ in 0..claim_mode::RELEASE_CHECKOUTS {
        match pool.checkout() {
            Ok(mut checkout) => {
                return (*checkout).__inbox_visit(ClaimFinish {
                    outcome: PhantomData::<A>,
                    spec,
                    holding,
                    key,
                    ran,
                    inbox_error,
                });
            }
            Err(source) => failure = Some(source),
        }
    }
    let source = failure.expect("a checkout was tried");
    claim_mode::claim_unsettled(spec, holding, ran, source, inbox_error)
}

/// The stamp of claim mode on a pool's checkout.
pub(super) struct ClaimStamp<'h, A, T, E> {
    outcome: PhantomData<A>,
    spec: &'static HandlerSpec,
    holding: &'h claim_mode::Holding,
    key: &'h MessageKey,
    value: T,
    stamp: &'h mut claim_mode::ToStamp,
    inbox_error: fn(Error) -> E,
    elsewhere: claim_mode::Elsewhere,
}

impl<O, A, T, E> Visit<O> for ClaimStamp<'_, A, T, E>
where
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    type Output = Result<A, claim_mode::Unstamped<T, E>>;

    fn visit<C: InboxConnection>(
        self,
        outer: &mut O,
        project: fn(&mut O) -> &mut C,
    ) -> Self::Output {
        let ClaimStamp {
            spec,
            holding,
            key,
            value,
            stamp,
            inbox_error,
            elsewhere,
            ..
        } = self;
        complete_now(claim_mode::claim_stamped(
            &mut Projected { outer, project },
            spec,
            holding,
            key,
            value,
            stamp,
            inbox_error,
            Some(elsewhere),
        ))
    }
}

/// The release of claim mode on a pool's checkout.
pub(super) struct ClaimFinish<A, T, E> {
    outcome: PhantomData<A>,
    spec: &'static HandlerSpec,
    holding: claim_mode::Holding,
    key: MessageKey,
    ran: Result<Result<T, E>, steps::Panicked>,
    inbox_error: fn(Error) -> E,
}

impl<O, A, T, E> Visit<O> for ClaimFinish<A, T, E>
where
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    type Output = Result<A, E>;

    fn visit<C: InboxConnection>(
        self,
        outer: &mut O,
        project: fn(&mut O) -> &mut C,
    ) -> Self::Output {
        let ClaimFinish {
            spec,
            holding,
            key,
            ran,
            inbox_error,
            ..
        } = self;
        let mut steps = Projected { outer, project };
        complete_now(async {
            if let Err(e) = claim_mode::prepared_for_stamp(&mut steps, &holding).await {
                return claim_mode::claim_unsettled(spec, holding, ran, Box::new(e), inbox_error);
            }
            let nothing = Remembered::nothing();
            claim_mode::claim_finished(&mut steps, spec, holding, key, ran, nothing, inbox_error)
                .await
        })
    }
}

/// A claim-mode run, on the connection the handler's connection leads to.
pub(super) struct Claim<A, T, E, B> {
    outcome: PhantomData<A>,
    spec: &'static HandlerSpec,
    claim: ClaimSpec,
    key: MessageKey,
    body: B,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
}

impl<O, T, E, B, A> Visit<O> for Claim<A, T, E, B>
where
    B: FnOnce(&mut NoConnection) -> Result<T, E>,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    type Output = Result<A, E>;

    fn visit<C: InboxConnection>(
        self,
        outer: &mut O,
        project: fn(&mut O) -> &mut C,
    ) -> Self::Output {
        let Claim {
            spec,
            claim,
            key,
            body,
            remembered,
            inbox_error,
            ..
        } = self;
        let run = Run::message(spec, &key, true);
        let result = complete_now(
            claim_mode::drive_claim(
                Projected { outer, project },
                spec,
                claim,
                key,
                OnceWithoutConnection(Some(body)),
                remembered,
                inbox_error,
            )
            .instrument(run.instrument_span()),
        );
        run.finish(&result);
        result
    }
}
