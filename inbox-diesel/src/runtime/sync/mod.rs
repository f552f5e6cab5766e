//! The sync runtime: the expansion of `#[idempotent]` on a `fn`.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::time::Duration;

use diesel::QueryResult;
use inbox_core::{BatchOutcome, ErrorClass, HandlerOutcome, KeyError, MessageKey};
use tracing::Instrument;

use crate::backends::HandlerConnection;
use crate::backends::InboxConnection;
use crate::backends::Visit;
use crate::error::Error;
use crate::guard::NoConnection;
use crate::io::{Blocking, complete_now};
use crate::pool::{ClaimOn, ClaimPool, ClaimTarget};
use crate::runtime::batch::{self, BatchClaims, NewMessages};
use crate::runtime::call::{Call, WithoutConnection, checked_key, claimed};
use crate::runtime::claim::ClaimSpec;
use crate::runtime::steps;
use crate::runtime::stored::Remembered;
use crate::runtime::{claim_mode, transaction};
use crate::spec::HandlerSpec;
use crate::telemetry::Run;
use diesel::connection::TransactionManagerStatus;

mod claim;
mod projected;

pub use claim::run_claim;
pub(crate) use projected::Projected;

/// Runs a call's body once per message key and consumer, on a sync connection, answering
/// in the outcome type `A` the caller names; see `transaction::drive` for the steps.
pub fn run<C, T, E, B, P, A>(conn: &mut C, call: Call<A, T, E, B, P>) -> Result<A, E>
where
    C: HandlerConnection,
    B: FnMut(&mut C) -> Result<T, E>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
    A: HandlerOutcome<T>,
{
    visit::<false, _, _, _, _, _, _>(conn, call.with_body(Immediate))
}

/// `transaction = "caller_or_own"`: [`run_joined`] where the caller has a transaction open
/// (diesel's manager counts it), [`run`] where it has none — a transaction the application
/// opened as SQL is not counted, and `run` refuses it as it does for any handler.
pub fn run_joined_or_own<C, T, E, B, P, A>(conn: &mut C, call: Call<A, T, E, B, P>) -> Result<A, E>
where
    C: HandlerConnection,
    B: FnMut(&mut C) -> Result<T, E>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
    A: HandlerOutcome<T>,
{
    // The depth `drive_joined` refuses at 0, read the same way.
    match depth(conn) > 0 {
        true => run_joined(conn, call),
        false => run(conn, call),
    }
}

/// Runs a call's body once per message key and consumer inside the transaction the caller
/// opened (`transaction = "caller"`), on a sync connection; see `transaction::drive_joined`.
pub fn run_joined<C, T, E, B, P, A>(conn: &mut C, call: Call<A, T, E, B, P>) -> Result<A, E>
where
    C: HandlerConnection,
    B: FnOnce(&mut C) -> Result<T, E>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
    A: HandlerOutcome<T>,
{
    visit::<true, _, _, _, _, _, _>(conn, call.with_body(|body| Once(Some(body))))
}

/// Checks the call's key, then runs it on the connection the handler's connection leads to.
fn visit<const JOINED: bool, C, A, T, E, B, P>(
    conn: &mut C,
    call: Call<A, T, E, B, P>,
) -> Result<A, E>
where
    C: HandlerConnection,
    A: HandlerOutcome<T>,
    Message<JOINED, A, T, E, B, P>: Visit<C, Output = Result<A, E>>,
{
    let (key, handling) = call.keyed(A::IN_FLIGHT)?;
    conn.__inbox_visit(Message::<JOINED, A, T, E, B, P> { key, handling })
}

/// How many transactions diesel's manager counts open on `conn` (0 where it is in error):
/// for an application's enum of connections, its variant's.
fn depth<C: diesel::Connection>(conn: &mut C) -> u32 {
    use diesel::connection::TransactionManager;
    crate::runtime::handle::depth(C::TransactionManager::transaction_manager_status_mut(conn))
}

/// One message's run, on the connection the handler's connection leads to
/// ([`HandlerConnection`]): in the caller's transaction (`JOINED`, `transaction::drive_joined`) or
/// in its own (`transaction::drive`).
struct Message<const JOINED: bool, A: HandlerOutcome<T>, T, E, B, P> {
    key: MessageKey,
    handling: transaction::Handling<T, E, B, P, A::InFlightWitness>,
}

impl<const JOINED: bool, O, T, E, B, P, A> Visit<O> for Message<JOINED, A, T, E, B, P>
where
    O: Send,
    B: steps::Body<O, Result<T, E>>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
    A: HandlerOutcome<T>,
{
    type Output = Result<A, E>;

    fn visit<C: InboxConnection>(
        self,
        outer: &mut O,
        project: fn(&mut O) -> &mut C,
    ) -> Result<A, E> {
        let Message { key, handling } = self;
        let steps = Projected { outer, project };
        complete_now(transaction::message(steps, JOINED, key, handling))
    }
}

/// A sync body that runs once, never retried: in its caller's transaction, or in claim mode
/// (whose failed run the broker's redelivery retries, so that it may consume what it
/// captured: the handler's parameters taken by value).
struct Once<B>(Option<B>);

impl<C, R, B: FnOnce(&mut C) -> R> steps::Body<C, R> for Once<B> {
    async fn call(&mut self, conn: &mut C) -> R {
        let body = self.0.take().expect("a body that runs once is called once");
        body(conn)
    }
}

/// Runs `body` once for the messages of a batch that are new, in one transaction; see
/// `transaction::drive` for the steps.
pub fn run_batch<C, T, E, B, P>(
    conn: &mut C,
    spec: &'static HandlerSpec,
    keys: Result<Vec<MessageKey>, KeyError>,
    new: &NewMessages,
    body: B,
    probe: P,
    inbox_error: fn(Error) -> E,
) -> Result<BatchOutcome<T>, E>
where
    C: HandlerConnection,
    B: FnMut(&mut C) -> Result<T, E>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
{
    let keys = checked_key(spec, keys, inbox_error)?;
    if keys.is_empty() {
        return Ok(batch::batch_outcome(0, None, new));
    }
    conn.__inbox_visit(Batch {
        spec,
        keys,
        new,
        body,
        probe,
        inbox_error,
    })
}

/// A batch's run, on the connection the handler's connection leads to.
struct Batch<'n, E, B, P> {
    spec: &'static HandlerSpec,
    keys: Vec<MessageKey>,
    new: &'n NewMessages,
    body: B,
    probe: P,
    inbox_error: fn(Error) -> E,
}

impl<O, T, E, B, P> Visit<O> for Batch<'_, E, B, P>
where
    O: Send,
    B: FnMut(&mut O) -> Result<T, E>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
{
    type Output = Result<BatchOutcome<T>, E>;

    fn visit<C: InboxConnection>(
        self,
        outer: &mut O,
        project: fn(&mut O) -> &mut C,
    ) -> Self::Output {
        let Batch {
            spec,
            keys,
            new,
            body,
            probe,
            inbox_error,
        } = self;
        let run = Run::batch(spec, keys.len());
        let claims = BatchClaims::new(&keys, new);
        let result = complete_now(
            transaction::drive(
                Projected { outer, project },
                &claims,
                transaction::Handling {
                    spec,
                    body: Immediate(body),
                    probe,
                    in_flight: None::<Infallible>,
                    remembered: Remembered::nothing(),
                    inbox_error,
                },
            )
            .instrument(run.instrument_span()),
        )
        .map(|value| batch::batch_outcome(keys.len(), value.value(), new));
        run.finish_batch(&result);
        result
    }
}

/// A sync body: it runs to its end when called.
pub(crate) struct Immediate<B>(pub(crate) B);

impl<C, R, B: FnMut(&mut C) -> R> steps::Body<C, R> for Immediate<B> {
    async fn call(&mut self, conn: &mut C) -> R {
        (self.0)(conn)
    }
}
