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
    let (key, handling) = call
        .with_body(|body| WithoutConnection(Once(Some(body))))
        .keyed(None)?;
    match conn.__inbox_claim_target() {
        ClaimOn::Connection(conn) => conn.__inbox_visit(Claim {
            outcome: PhantomData::<A>,
            claim,
            key,
            handling,
        }),
        ClaimOn::Pool(pool) => {
            let pool = Blocking(pool);
            complete_now(claimed(handling.spec, key, |key| {
                claim_mode::claim_on_pool(&pool, claim, key, handling)
            }))
        }
    }
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
    B: steps::Body<O, Result<T, E>>,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    type Output = Result<A, E>;

    fn visit<C: InboxConnection>(
        self,
        outer: &mut O,
        project: fn(&mut O) -> &mut C,
    ) -> Self::Output {
        let steps = Projected { outer, project };
        complete_now(claimed(self.handling.spec, self.key, |key| {
            claim_mode::drive_claim(steps, self.claim, key, self.handling)
        }))
    }
}
