//! The sync runtime: the expansion of `#[idempotent]` on a `fn`.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::time::Duration;

use diesel::QueryResult;
use inbox_core::{BatchOutcome, ErrorClass, HandlerOutcome, KeyError, MessageKey};
use tracing::Instrument;

use crate::backends::Visit;
use crate::dialect::claim::{ClaimAnswer, ClaimStep};
use crate::dialect::layout::Layout;
use crate::io::{Blocking, complete_now};
use crate::pool::{ClaimOn, ClaimPool, ClaimTarget};
use crate::runtime::batch::{self, BatchClaims, NewMessages};
use crate::runtime::claim::ClaimSpec;
use crate::runtime::steps::{self, Steps};
use crate::runtime::stored::{Fingerprint, Kept, Remembered};
use crate::runtime::{checked, claim_mode, transaction};
use crate::spec::HandlerSpec;
use crate::telemetry::Run;
use crate::{Error, HandlerConnection, InboxConnection, NoConnection};
use diesel::connection::TransactionManagerStatus;

/// Runs `body` once per message key and consumer, on a sync connection, answering in the
/// outcome type `A` the caller names (`_outcome`); see
/// `transaction::drive` for the steps.
#[allow(
    clippy::too_many_arguments,
    reason = "the pieces the expansion of `#[idempotent]` writes, each its own argument"
)]
pub fn run<C, T, E, B, P, A>(
    _outcome: PhantomData<A>,
    conn: &mut C,
    spec: &'static HandlerSpec,
    key: Result<MessageKey, KeyError>,
    body: B,
    probe: P,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<A, E>
where
    C: HandlerConnection,
    B: FnMut(&mut C) -> Result<T, E>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
    A: HandlerOutcome<T>,
{
    let key = key.map_err(|e| Run::invalid_key(spec, inbox_error(Error::InvalidKey(e))))?;
    conn.__inbox_visit(Message::<false, A, T, E, _, P> {
        outcome: PhantomData,
        spec,
        key,
        body: Immediate(body),
        probe,
        remembered,
        inbox_error,
    })
}

/// `transaction = "caller_or_own"`: [`run_joined`] where the caller has a transaction open
/// (diesel's manager counts it), [`run`] where it has none — a transaction the application
/// opened as SQL is not counted, and `run` refuses it as it does for any handler.
#[allow(
    clippy::too_many_arguments,
    reason = "the pieces the expansion of `#[idempotent]` writes, each its own argument"
)]
pub fn run_joined_or_own<C, T, E, B, P, A>(
    outcome: PhantomData<A>,
    conn: &mut C,
    spec: &'static HandlerSpec,
    key: Result<MessageKey, KeyError>,
    body: B,
    probe: P,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<A, E>
where
    C: HandlerConnection,
    B: FnMut(&mut C) -> Result<T, E>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
    A: HandlerOutcome<T>,
{
    // The depth `drive_joined` refuses at 0, read the same way.
    match depth(conn) > 0 {
        true => run_joined(
            outcome,
            conn,
            spec,
            key,
            body,
            probe,
            remembered,
            inbox_error,
        ),
        false => run(
            outcome,
            conn,
            spec,
            key,
            body,
            probe,
            remembered,
            inbox_error,
        ),
    }
}

/// Runs `body` once per message key and consumer inside the transaction the caller opened
/// (`transaction = "caller"`), on a sync connection; see `transaction::drive_joined`.
#[allow(
    clippy::too_many_arguments,
    reason = "the pieces the expansion of `#[idempotent]` writes, each its own argument"
)]
pub fn run_joined<C, T, E, B, P, A>(
    _outcome: PhantomData<A>,
    conn: &mut C,
    spec: &'static HandlerSpec,
    key: Result<MessageKey, KeyError>,
    body: B,
    probe: P,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<A, E>
where
    C: HandlerConnection,
    B: FnOnce(&mut C) -> Result<T, E>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
    A: HandlerOutcome<T>,
{
    let key = key.map_err(|e| Run::invalid_key(spec, inbox_error(Error::InvalidKey(e))))?;
    conn.__inbox_visit(Message::<true, A, T, E, _, P> {
        outcome: PhantomData,
        spec,
        key,
        body: Once(Some(body)),
        probe,
        remembered,
        inbox_error,
    })
}

/// How many transactions diesel's manager counts open on `conn` (0 where it is in error):
/// for an application's enum of connections, its variant's.
fn depth<C: diesel::Connection>(conn: &mut C) -> u32 {
    use diesel::connection::TransactionManager;
    C::TransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .ok()
        .flatten()
        .map_or(0, std::num::NonZeroU32::get)
}

/// One message's run, on the connection the handler's connection leads to
/// ([`HandlerConnection`]): in the caller's transaction (`JOINED`, `transaction::drive_joined`) or
/// in its own (`transaction::drive`).
struct Message<const JOINED: bool, A, T, E, B, P> {
    outcome: PhantomData<A>,
    spec: &'static HandlerSpec,
    key: MessageKey,
    body: B,
    probe: P,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
}

impl<const JOINED: bool, O, T, E, B, P, A> Visit<O> for Message<JOINED, A, T, E, B, P>
where
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
        let Message {
            spec,
            key,
            body,
            probe,
            remembered,
            inbox_error,
            ..
        } = self;
        let steps = Projected { outer, project };
        // The stored id, not the key: a key can be business data (an e-mail address) or carry
        // control characters; the key itself is logged escaped, at DEBUG (`transaction`).
        let run = Run::message(spec, &key, false);
        let result = match JOINED {
            true => complete_now(
                transaction::drive_joined::<_, _, _, _, _, A::InFlightWitness>(
                    steps,
                    spec,
                    &key,
                    body,
                    probe,
                    remembered,
                    inbox_error,
                )
                .instrument(run.instrument_span()),
            ),
            false => complete_now(
                transaction::drive(
                    steps,
                    spec,
                    &key,
                    body,
                    probe,
                    A::IN_FLIGHT,
                    remembered,
                    inbox_error,
                )
                .instrument(run.instrument_span()),
            ),
        }
        .map(|value| transaction::outcome(spec, key, value));
        run.finish(&result);
        result
    }
}

/// A sync body that runs once: in its caller's transaction, never retried.
struct Once<B>(Option<B>);

impl<C, R, B: FnOnce(&mut C) -> R> steps::Body<C, R> for Once<B> {
    async fn call(&mut self, conn: &mut C) -> R {
        let body = self.0.take().expect("a joined body runs once");
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
    let keys = keys.map_err(|e| Run::invalid_key(spec, inbox_error(Error::InvalidKey(e))))?;
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
                spec,
                &claims,
                Immediate(body),
                probe,
                None::<Infallible>,
                Remembered::nothing(),
                inbox_error,
            )
            .instrument(run.instrument_span()),
        )
        .map(|value| batch::batch_outcome(keys.len(), value.value(), new));
        run.finish_batch(&result);
        result
    }
}

/// Runs `body` in claim mode, on a sync connection or a pool (`conn`: `&mut` the one, `&`
/// the other, [`crate::pool`]); see `claim_mode::drive_claim` for the steps.
#[allow(
    clippy::too_many_arguments,
    reason = "the pieces the expansion of `#[idempotent]` writes, each its own argument"
)]
pub fn run_claim<H, T, E, B, A>(
    _outcome: PhantomData<A>,
    mut conn: H,
    spec: &'static HandlerSpec,
    claim: ClaimSpec,
    key: Result<MessageKey, KeyError>,
    body: B,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<A, E>
where
    H: ClaimTarget,
    H::Connection: HandlerConnection,
    H::Pool: ClaimPool<Connection = H::Connection>,
    B: FnOnce(&mut NoConnection) -> Result<T, E>,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
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
fn claim_on_pool<P, T, E, B, A>(
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
struct ClaimStart<'k, A, T, E> {
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
fn released_on_pool<P, T, E, A>(
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
struct ClaimStamp<'h, A, T, E> {
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
struct ClaimFinish<A, T, E> {
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
struct Claim<A, T, E, B> {
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

/// A sync body: it runs to its end when called.
pub(crate) struct Immediate<B>(pub(crate) B);

impl<C, R, B: FnMut(&mut C) -> R> steps::Body<C, R> for Immediate<B> {
    async fn call(&mut self, conn: &mut C) -> R {
        (self.0)(conn)
    }
}

/// A sync claim-mode body: it runs to its end when called, and is given no connection. It
/// runs once — a failed run is retried by the broker's redelivery, never here — so it may
/// consume what it captured: the handler's parameters taken by value.
struct OnceWithoutConnection<B>(Option<B>);

impl<C, R, B: FnOnce(&mut NoConnection) -> R> steps::Body<C, R> for OnceWithoutConnection<B> {
    async fn call(&mut self, _: &mut C) -> R {
        let body = self.0.take().expect("a claim-mode body runs once");
        body(&mut NoConnection::new())
    }
}

/// The handler's connection, given to the body, and the connection the runtime's statements
/// run on: the same one, or an application's enum of connections and its variant
/// ([`HandlerConnection`]).
pub(crate) struct Projected<'c, O, C> {
    outer: &'c mut O,
    project: fn(&mut O) -> &mut C,
}

impl<'c, O, C: InboxConnection> Projected<'c, O, C> {
    /// `outer`, whose runtime statements run on `project(outer)`.
    pub(crate) fn new(outer: &'c mut O, project: fn(&mut O) -> &mut C) -> Self {
        Self { outer, project }
    }

    /// The connection the runtime's statements run on.
    fn inner(&mut self) -> &mut C {
        (self.project)(self.outer)
    }

    /// That connection as the runtime's statements' [`Io`](crate::io::Io).
    fn io(&mut self) -> Blocking<'_, C> {
        Blocking(self.inner())
    }

    /// Its transaction manager's state.
    fn status(&mut self) -> &mut TransactionManagerStatus {
        use diesel::connection::TransactionManager;
        diesel::connection::AnsiTransactionManager::transaction_manager_status_mut(self.inner())
    }
}

/// The runtime's statements on the variant ([`Projected::inner`]).
impl<O, C: InboxConnection> crate::io::Io for Projected<'_, O, C> {
    type Backend = C::Backend;

    async fn execute(&mut self, sql: &crate::dialect::Sql) -> QueryResult<usize> {
        self.io().execute(sql).await
    }

    async fn load<R: crate::dialect::Row>(
        &mut self,
        sql: &crate::dialect::Sql,
    ) -> QueryResult<Vec<R>> {
        self.io().load(sql).await
    }

    async fn batch(&mut self, sql: &str) -> QueryResult<()> {
        self.io().batch(sql).await
    }

    async fn execute_claim(
        &mut self,
        sql: crate::dialect::claim::ClaimSql<'_, C::Backend>,
    ) -> QueryResult<usize> {
        self.io().execute_claim(sql).await
    }

    async fn read_claim(
        &mut self,
        sql: crate::dialect::claim::ClaimRead<'_, C::Backend>,
    ) -> QueryResult<Vec<crate::dialect::claim::ClaimRow>> {
        self.io().read_claim(sql).await
    }

    fn transaction_status(&mut self) -> &mut diesel::connection::TransactionManagerStatus {
        self.status()
    }

    async fn sleep(&mut self, pause: Duration) {
        std::thread::sleep(pause);
    }
}

/// Transactions on the variant, whose manager is the enum's too (diesel's
/// `MultiConnection` hands its transactions to the variant); the caller's closures are given
/// the enum.
impl<O, C: InboxConnection> crate::io::Transactions for Projected<'_, O, C> {
    type Conn = O;

    fn conn(&mut self) -> &mut O {
        self.outer
    }

    async fn begin(&mut self) -> QueryResult<()> {
        crate::io::Transactions::begin(&mut self.io()).await
    }

    async fn begin_write(&mut self) -> QueryResult<()> {
        crate::io::Transactions::begin_write(&mut self.io()).await
    }

    async fn commit(&mut self) -> QueryResult<()> {
        crate::io::Transactions::commit(&mut self.io()).await
    }

    async fn roll_back(&mut self) -> QueryResult<()> {
        crate::io::Transactions::roll_back(&mut self.io()).await
    }
}

impl<O, C: InboxConnection> Steps for Projected<'_, O, C> {
    type Conn = O;

    fn conn(&mut self) -> &mut O {
        self.outer
    }

    fn net(&mut self) -> Option<usize> {
        crate::tripwire::net::Net::id(diesel::Connection::instrumentation(self.inner()))
    }

    fn in_error(&mut self) -> bool {
        self.status().transaction_depth().is_err()
    }

    fn discard(&mut self) {
        self.status().set_in_error();
    }

    fn forget_transaction(&mut self) {
        *self.status() = Default::default();
    }

    fn identity(&mut self) -> usize {
        let instrumentation = std::ptr::from_mut(diesel::Connection::instrumentation(self.inner()));
        checked::identity(
            <C as InboxConnection>::BACKEND,
            std::ptr::from_mut(self.inner()).cast::<u8>() as usize,
            size_of::<C>(),
            instrumentation.cast::<u8>() as usize,
        )
    }

    async fn begin(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()> {
        self.inner()
            .begin_inbox_transaction(spec, layout)
            .map_err(crate::backends::inside_callers)
    }

    async fn begin_with_claim(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
    ) -> Option<QueryResult<bool>> {
        self.inner().begin_with_claim(spec, key, layout)
    }

    async fn end(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()> {
        self.inner().end_inbox_transaction(spec, layout.mariadb)
    }

    async fn claim(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
    ) -> QueryResult<bool> {
        self.inner()
            .claim_marker(&spec.schema, spec.consumer.as_str(), key, layout)
    }

    async fn claim_batch(
        &mut self,
        spec: &'static HandlerSpec,
        ids: &[uuid::Uuid],
        texts: Option<&[String]>,
        layout: Layout,
    ) -> QueryResult<Vec<uuid::Uuid>> {
        self.inner()
            .claim_markers(&spec.schema, spec.consumer.as_str(), ids, texts, layout)
    }

    async fn commit(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()> {
        self.inner().commit_inbox_transaction(spec, layout.mariadb)
    }

    async fn roll_back_and_end(
        &mut self,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> QueryResult<()> {
        self.inner().roll_back_and_end(spec, layout.mariadb)
    }

    async fn roll_back(&mut self) -> QueryResult<()> {
        self.inner().roll_back_inbox_transaction()
    }

    async fn prepare_claim(&mut self, spec: &'static HandlerSpec) -> QueryResult<()> {
        self.inner().prepare_claim(spec)
    }

    async fn wait_for_locks(
        &mut self,
        spec: &'static HandlerSpec,
        claimed: bool,
    ) -> QueryResult<()> {
        self.inner().wait_for_locks(spec, claimed)
    }

    async fn ended_by_server(&mut self) -> bool {
        crate::runtime::claim::ended_by_server(&mut self.io()).await
    }

    async fn ended_in_body(&mut self) -> bool {
        match <C as InboxConnection>::BACKEND {
            crate::dialect::Backend::Postgres => {
                crate::runtime::claim::ended_in_body(&mut self.io()).await
            }
            // SQLite rolls a transaction back itself on some errors (a busy database, a full
            // disk): after a body's error its savepoint's absence does not say the body did.
            crate::dialect::Backend::Sqlite | crate::dialect::Backend::Mysql => false,
        }
    }

    async fn discard_foreign(&mut self) {
        use diesel::connection::TransactionManager;
        let _ = diesel::connection::SimpleConnection::batch_execute(self.inner(), "ROLLBACK");
        *diesel::connection::AnsiTransactionManager::transaction_manager_status_mut(self.inner()) =
            Default::default();
    }

    fn stop_caching_statements(&mut self) {
        self.inner()
            .set_prepared_statement_cache_size(diesel::connection::CacheSize::Disabled);
    }

    async fn verify(
        &mut self,
        spec: &'static HandlerSpec,
        claim: bool,
    ) -> Result<Layout, crate::schema::check::SchemaError> {
        self.inner()
            .prepare_check(spec)
            .map_err(crate::schema::check::SchemaError::Database)?;
        crate::schema::verify_layout(self.inner(), &spec.schema, claim)
    }

    async fn claim_step(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        step: ClaimStep,
    ) -> QueryResult<ClaimAnswer> {
        crate::runtime::claim::step(
            &mut self.io(),
            &spec.schema,
            spec.consumer.as_str(),
            key,
            step,
        )
        .await
    }

    async fn markers_present(
        &mut self,
        spec: &'static HandlerSpec,
        ids: &[uuid::Uuid],
        latest: bool,
    ) -> QueryResult<crate::runtime::claim::Presence> {
        crate::runtime::claim::present(
            &mut self.io(),
            &spec.schema,
            spec.consumer.as_str(),
            ids,
            latest,
        )
        .await
    }

    fn depth(&mut self) -> u32 {
        depth(self.inner())
    }

    async fn savepoint(&mut self) -> QueryResult<()> {
        use diesel::connection::TransactionManager;
        diesel::connection::AnsiTransactionManager::begin_transaction(self.inner())
    }

    async fn release(&mut self) -> QueryResult<()> {
        use diesel::connection::TransactionManager;
        diesel::connection::AnsiTransactionManager::commit_transaction(self.inner())
    }

    async fn store_result(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        text: String,
        fingerprint: Option<Fingerprint>,
        attempt: Option<u32>,
    ) -> QueryResult<usize> {
        crate::runtime::stored::write(
            &mut self.io(),
            &spec.schema,
            spec.consumer.as_str(),
            key,
            text,
            fingerprint,
            attempt,
        )
        .await
    }

    async fn read_kept(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        columns: (bool, bool),
        latest: bool,
    ) -> QueryResult<Kept> {
        let consumer = spec.consumer.as_str();
        crate::runtime::stored::read(&mut self.io(), &spec.schema, consumer, key, columns, latest)
            .await
    }

    async fn write_fingerprint(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        fingerprint: Fingerprint,
    ) -> QueryResult<usize> {
        crate::runtime::stored::write_fingerprint(
            &mut self.io(),
            &spec.schema,
            spec.consumer.as_str(),
            key,
            fingerprint,
        )
        .await
    }

    async fn pause(&mut self, delay: Duration) {
        std::thread::sleep(delay);
    }
}
