//! The async runtime: the expansion of `#[idempotent]` on an `async fn`, on diesel-async.
//!
//! The steps and the retry loop are the sync runtime's (`transaction::drive`), awaited; the SQL
//! is the same (`dialect/`, `backends/`).

use std::convert::Infallible;
use std::future::Future;

use inbox_core::{BatchOutcome, ErrorClass, HandlerOutcome, KeyError, MessageKey};
use tracing::Instrument;

use crate::backends::AsyncInboxConnection;
use crate::backends::CancelIfDropped;
use crate::error::Error;
use crate::guard::NoConnection;
use crate::io::Awaiting;
use crate::pool::{AsyncClaimPool, ClaimOn, ClaimTarget};
use crate::runtime::batch::{self, BatchClaims, NewMessages};
use crate::runtime::call::{Call, WithoutConnection, checked_key, claimed};
use crate::runtime::claim::ClaimSpec;
use crate::runtime::handle::Handle;
use crate::runtime::steps::{self, Steps};
use crate::runtime::stored::Remembered;
use crate::runtime::{claim_mode, transaction};
use crate::spec::HandlerSpec;
use crate::telemetry::Run;

/// An async closure taking the connection, whose future can be named — and so be required
/// to be `Send`. Async closures always implement `FnOnce` returning their future; the bounds
/// `AsyncFnMut`/`AsyncFn` alone cannot say that this future is `Send`, and the compiler then
/// fails to prove a spawned handler `Send` ("implementation of `Send` is not general enough").
pub trait AsyncBody<A, R>:
    AsyncFnOnce(A) -> R + FnOnce(A) -> <Self as AsyncBody<A, R>>::Fut
{
    /// The future of one run of the body.
    type Fut: Future<Output = R>;
}

impl<F, A, R, Fut> AsyncBody<A, R> for F
where
    F: AsyncFnOnce(A) -> R + FnOnce(A) -> Fut,
    Fut: Future<Output = R>,
{
    type Fut = Fut;
}

/// Each attempt runs a clone of the body: a clone of an async closure that captures the
/// handler's parameters by reference is a copy of those references.
pub(crate) struct Cloned<B>(pub(crate) B);

impl<C, R, B> steps::Body<C, R> for Cloned<B>
where
    B: Clone + for<'c> AsyncBody<&'c mut C, R, Fut: Send>,
{
    async fn call(&mut self, conn: &mut C) -> R {
        (self.0.clone())(conn).await
    }
}

/// Runs a call's body once per message key and consumer, on a diesel-async connection; see
/// `transaction::drive` for the steps.
pub async fn run_async<C, T, E, B, P, A>(conn: &mut C, call: Call<A, T, E, B, P>) -> Result<A, E>
where
    C: AsyncInboxConnection,
    B: Clone + for<'c> AsyncBody<&'c mut C, Result<T, E>, Fut: Send>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
    A: HandlerOutcome<T>,
{
    run_async_body(conn, call.with_body(Cloned)).await
}

/// [`run_async`] for any body the runtime can run: the function API's, checked by `guarded!`.
pub(crate) async fn run_async_body<C, T, E, B, P, A>(
    conn: &mut C,
    call: Call<A, T, E, B, P>,
) -> Result<A, E>
where
    C: AsyncInboxConnection,
    B: steps::Body<C, Result<T, E>>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
    A: HandlerOutcome<T>,
{
    let (key, handling) = call.keyed(A::IN_FLIGHT)?;
    transaction::message(Awaiting(conn), false, key, handling).await
}

/// `transaction = "caller_or_own"` on a diesel-async connection: [`run_joined_async`] where
/// the caller has a transaction open (diesel-async's manager counts it), [`run_async`] where
/// it has none.
pub async fn run_joined_or_own_async<C, T, E, B, P, A>(
    conn: &mut C,
    call: Call<A, T, E, B, P>,
) -> Result<A, E>
where
    C: AsyncInboxConnection,
    B: Clone + for<'c> AsyncBody<&'c mut C, Result<T, E>, Fut: Send>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
    A: HandlerOutcome<T>,
{
    // The depth `drive_joined` refuses at 0, read the same way.
    match Awaiting(&mut *conn).depth() > 0 {
        true => run_joined_async(conn, call).await,
        false => run_async(conn, call).await,
    }
}

/// Runs a call's body once per message key and consumer inside the transaction the caller
/// opened (`transaction = "caller"`), on a diesel-async connection; see
/// `transaction::drive_joined`.
pub async fn run_joined_async<C, T, E, B, P, A>(
    conn: &mut C,
    call: Call<A, T, E, B, P>,
) -> Result<A, E>
where
    C: AsyncInboxConnection,
    B: for<'c> AsyncBody<&'c mut C, Result<T, E>, Fut: Send>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
    A: HandlerOutcome<T>,
{
    let (key, handling) = call
        .with_body(|body| Once(Some(body)))
        .keyed(A::IN_FLIGHT)?;
    transaction::message(Awaiting(conn), true, key, handling).await
}

/// An async body that runs once, never retried: in its caller's transaction, or in claim
/// mode (whose failed run the broker's redelivery retries, so that it may consume what it
/// captured: the handler's parameters taken by value).
struct Once<B>(Option<B>);

impl<C, R, B> steps::Body<C, R> for Once<B>
where
    B: for<'c> AsyncBody<&'c mut C, R, Fut: Send>,
{
    async fn call(&mut self, conn: &mut C) -> R {
        let body = self.0.take().expect("a body that runs once is called once");
        body(conn).await
    }
}

/// Runs `body` once for the messages of a batch that are new, in one transaction, on a
/// diesel-async connection; see `transaction::drive` for the steps.
pub async fn run_batch_async<C, T, E, B, P>(
    conn: &mut C,
    spec: &'static HandlerSpec,
    keys: Result<Vec<MessageKey>, KeyError>,
    new: &NewMessages,
    body: B,
    probe: P,
    inbox_error: fn(Error) -> E,
) -> Result<BatchOutcome<T>, E>
where
    C: AsyncInboxConnection,
    B: Clone + for<'c> AsyncBody<&'c mut C, Result<T, E>, Fut: Send>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
{
    let keys = checked_key(spec, keys, inbox_error)?;
    if keys.is_empty() {
        return Ok(batch::batch_outcome(0, None, new));
    }
    let run = Run::batch(spec, keys.len());
    let claims = BatchClaims::new(&keys, new);
    let result = transaction::drive(
        Awaiting(conn),
        &claims,
        transaction::Handling {
            spec,
            body: Cloned(body),
            probe,
            in_flight: None::<Infallible>,
            remembered: Remembered::nothing(),
            inbox_error,
        },
    )
    .instrument(run.instrument_span())
    .await
    .map(|value| batch::batch_outcome(keys.len(), value.value(), new));
    run.finish_batch(&result);
    result
}

/// Runs a call's body in claim mode, on a diesel-async connection or a pool (`conn`: `&mut`
/// the one, `&` the other, [`crate::pool`]); see `claim_mode::drive_claim` for the steps.
pub async fn run_claim_async<H, T, E, B, A>(
    mut conn: H,
    claim: ClaimSpec,
    call: Call<A, T, E, B>,
) -> Result<A, E>
where
    H: ClaimTarget,
    H::Connection: AsyncInboxConnection,
    H::Pool: AsyncClaimPool<Connection = H::Connection>,
    B: for<'c> AsyncBody<&'c mut NoConnection, Result<T, E>, Fut: Send>,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let call = call.with_body(|body| WithoutConnection(Once(Some(body))));
    run_claim_on(conn.__inbox_claim_target(), claim, call).await
}

/// [`run_claim_async`] on what the handler's connection parameter leads to, a connection or
/// a pool, with the body as the runtime calls it: given no connection, whatever the
/// connection type it is asked with, once.
pub(crate) async fn run_claim_on<C, P, T, E, B, A>(
    target: ClaimOn<'_, C, P>,
    claim: ClaimSpec,
    call: Call<A, T, E, B>,
) -> Result<A, E>
where
    C: AsyncInboxConnection,
    P: AsyncClaimPool<Connection = C>,
    B: steps::Body<C, Result<T, E>> + steps::Body<NoConnection, Result<T, E>>,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let (key, handling) = call.keyed(None)?;
    claimed(handling.spec, key, |key| async move {
        match target {
            ClaimOn::Connection(conn) => {
                claim_mode::drive_claim(Awaiting(conn), claim, key, handling).await
            }
            ClaimOn::Pool(pool) => {
                claim_mode::claim_on_pool(&AwaitingPool(pool), claim, key, handling).await
            }
        }
    })
    .await
}

/// A diesel-async pool as claim mode takes its connections.
struct AwaitingPool<'p, P>(&'p P);

impl<P> claim_mode::Checkouts for AwaitingPool<'_, P>
where
    P: AsyncClaimPool,
    P::Connection: AsyncInboxConnection,
{
    async fn on_checkout<W: claim_mode::OnCheckout>(
        &self,
        work: W,
    ) -> Result<W::Output, (W, crate::pool::CheckoutFailure)> {
        match self.0.checkout().await {
            Ok(mut checkout) => Ok(work.run(&mut Awaiting(&mut *checkout)).await),
            Err(source) => Err((work, source)),
        }
    }

    async fn pause(&self, pause: std::time::Duration) {
        tokio::time::sleep(pause).await;
    }
}

impl<C: AsyncInboxConnection> Handle for Awaiting<'_, C> {
    type Conn = C;
    type Armed = CancelIfDropped;

    const CANCELLABLE: bool = true;

    fn conn(&mut self) -> &mut C {
        self.0
    }

    fn instrumentation(&mut self) -> &mut dyn diesel::connection::Instrumentation {
        diesel_async::AsyncConnection::instrumentation(self.0)
    }

    fn place(&mut self) -> (usize, usize) {
        (
            std::ptr::from_mut(self.0).cast::<u8>() as usize,
            size_of::<C>(),
        )
    }

    fn arm(&mut self) -> CancelIfDropped {
        CancelIfDropped::arm(&*self.0)
    }

    /// diesel-async counts an open transaction as broken too (for its pools): here only a
    /// manager that is broken with no transaction open — its `BEGIN` cut off, or in error.
    fn broken(&mut self) -> bool {
        use diesel_async::TransactionManager;
        C::TransactionManager::is_broken_transaction_manager(self.0)
            && !matches!(
                crate::io::Io::transaction_status(self).transaction_depth(),
                Ok(Some(_))
            )
    }

    fn stop_caching_statements(&mut self) {
        self.0
            .set_prepared_statement_cache_size(diesel::connection::CacheSize::Disabled);
    }
}
