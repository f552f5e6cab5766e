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
    let (key, handling) = call.keyed(None)?;
    match conn.__inbox_claim_target() {
        ClaimOn::Connection(conn) => conn.__inbox_visit(Claim {
            outcome: PhantomData::<A>,
            claim,
            key,
            handling,
        }),
        ClaimOn::Pool(pool) => claim_on_pool(pool, claim, key, handling),
    }
}

/// Claim mode on a pool: `claim_mode::claim_on_pool`, each phase run to its end.
fn claim_on_pool<P, T, E, B, A>(
    pool: &P,
    claim: ClaimSpec,
    key: MessageKey,
    handling: transaction::Handling<T, E, B, (), ()>,
) -> Result<A, E>
where
    P: ClaimPool,
    P::Connection: HandlerConnection,
    B: FnOnce(&mut NoConnection) -> Result<T, E>,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let run = Run::message(handling.spec, &key, true);
    let handling = transaction::Handling {
        spec: handling.spec,
        body: OnceWithoutConnection(Some(handling.body)),
        probe: (),
        in_flight: None,
        remembered: handling.remembered,
        inbox_error: handling.inbox_error,
    };
    let result = complete_now(
        claim_mode::claim_on_pool(&Blocking(pool), claim, key, handling)
            .instrument(run.instrument_span()),
    );
    run.finish(&result);
    result
}

/// A sync pool as claim mode takes its connections: each checkout's phase on the connection
/// the checkout leads to (the variant of an application's enum).
struct Blocking<'p, P>(&'p P);

impl<P> claim_mode::Checkouts for Blocking<'_, P>
where
    P: ClaimPool,
    P::Connection: HandlerConnection,
{
    async fn on_checkout<W: claim_mode::OnCheckout>(
        &self,
        work: W,
    ) -> Result<W::Output, (W, crate::pool::CheckoutFailure)> {
        match self.0.checkout() {
            Ok(mut checkout) => Ok((*checkout).__inbox_visit(OnCheckout(work))),
            Err(source) => Err((work, source)),
        }
    }

    async fn pause(&self, pause: Duration) {
        std::thread::sleep(pause);
    }
}

/// A phase's work on the connection a checkout leads to.
struct OnCheckout<W>(W);

impl<O: Send, W: claim_mode::OnCheckout> Visit<O> for OnCheckout<W> {
    type Output = W::Output;

    fn visit<C: InboxConnection>(self, outer: &mut O, project: fn(&mut O) -> &mut C) -> W::Output {
        complete_now(self.0.run(&mut Projected { outer, project }))
    }
}

/// A claim-mode run, on the connection the handler's connection leads to.
pub(super) struct Claim<A, T, E, B> {
    outcome: PhantomData<A>,
    claim: ClaimSpec,
    key: MessageKey,
    handling: transaction::Handling<T, E, B, (), ()>,
}

impl<O, T, E, B, A> Visit<O> for Claim<A, T, E, B>
where
    O: Send,
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
            claim,
            key,
            handling,
            ..
        } = self;
        let spec = handling.spec;
        let handling = transaction::Handling {
            spec,
            body: OnceWithoutConnection(Some(handling.body)),
            probe: (),
            in_flight: None,
            remembered: handling.remembered,
            inbox_error: handling.inbox_error,
        };
        let run = Run::message(spec, &key, true);
        let steps = Projected { outer, project };
        let result = complete_now(
            claim_mode::drive_claim(steps, claim, key, handling).instrument(run.instrument_span()),
        );
        run.finish(&result);
        result
    }
}
