//! The async runtime: the expansion of `#[idempotent]` on an `async fn`, on diesel-async.
//!
//! The steps and the retry loop are the sync runtime's (`transaction::drive`), awaited; the SQL
//! is the same (`dialect/`, `backends/`).

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use diesel::QueryResult;
use inbox_core::{BatchOutcome, ErrorClass, HandlerOutcome, KeyError, MessageKey};
use tracing::Instrument;

use crate::backends::AsyncInboxConnection;
use crate::backends::CancelIfDropped;
use crate::dialect::claim::{ClaimAnswer, ClaimStep};
use crate::dialect::layout::Layout;
use crate::error::Error;
use crate::guard::NoConnection;
use crate::io::Awaiting;
use crate::pool::{AsyncClaimPool, ClaimOn, ClaimTarget};
use crate::runtime::batch::{self, BatchClaims, NewMessages};
use crate::runtime::call::Call;
use crate::runtime::claim::ClaimSpec;
use crate::runtime::found::Kept;
use crate::runtime::steps::{self, Steps};
use crate::runtime::stored::Remembered;
use crate::runtime::{checked, claim_mode, transaction};
use crate::spec::HandlerSpec;
use crate::telemetry::Run;
use crate::value::Fingerprint;

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

/// A claim-mode body, given no connection. It runs once — a failed run is retried by the
/// broker's redelivery, never here — so it may consume what it captured: the handler's
/// parameters taken by value.
struct OnceWithoutConnection<B>(Option<B>);

impl<C, R, B> steps::Body<C, R> for OnceWithoutConnection<B>
where
    B: for<'c> AsyncBody<&'c mut NoConnection, R, Fut: Send>,
{
    async fn call(&mut self, _: &mut C) -> R {
        let body = self.0.take().expect("a claim-mode body runs once");
        let mut none = NoConnection::new();
        body(&mut none).await
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
    let Call {
        spec,
        key,
        body,
        probe,
        remembered,
        inbox_error,
        ..
    } = call;
    let key = key.map_err(|e| Run::invalid_key(spec, inbox_error(Error::InvalidKey(e))))?;
    // The stored id, not the key: a key can be business data (an e-mail address) or carry
    // control characters; the key itself is logged escaped, at DEBUG (`transaction`).
    let run = Run::message(spec, &key, false);
    let result = transaction::drive(
        Awaiting(conn),
        &key,
        transaction::Handling {
            spec,
            body,
            probe,
            in_flight: A::IN_FLIGHT,
            remembered,
            inbox_error,
        },
    )
    .instrument(run.instrument_span())
    .await
    .map(|value| transaction::outcome(spec, key, value));
    run.finish(&result);
    result
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
    let Call {
        spec,
        key,
        body,
        probe,
        remembered,
        inbox_error,
        ..
    } = call;
    let key = key.map_err(|e| Run::invalid_key(spec, inbox_error(Error::InvalidKey(e))))?;
    let run = Run::message(spec, &key, false);
    let result = transaction::drive_joined::<_, _, _, _, _, A::InFlightWitness>(
        Awaiting(conn),
        spec,
        &key,
        Once(Some(body)),
        probe,
        remembered,
        inbox_error,
    )
    .instrument(run.instrument_span())
    .await
    .map(|value| transaction::outcome(spec, key, value));
    run.finish(&result);
    result
}

/// An async body that runs once: in its caller's transaction, never retried.
struct Once<B>(Option<B>);

impl<C, R, B> steps::Body<C, R> for Once<B>
where
    B: for<'c> AsyncBody<&'c mut C, R, Fut: Send>,
{
    async fn call(&mut self, conn: &mut C) -> R {
        let body = self.0.take().expect("a joined body runs once");
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
    let keys = keys.map_err(|e| Run::invalid_key(spec, inbox_error(Error::InvalidKey(e))))?;
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
    conn: H,
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
    run_claim_async_with(
        conn,
        claim,
        call.with_body(|body| OnceWithoutConnection(Some(body))),
    )
    .await
}

/// [`run_claim_async`] with the body as the runtime calls it: given no connection, whatever
/// the connection type it is asked with, once.
pub(crate) async fn run_claim_async_with<H, T, E, B, A>(
    mut conn: H,
    claim: ClaimSpec,
    call: Call<A, T, E, B>,
) -> Result<A, E>
where
    H: ClaimTarget,
    H::Connection: AsyncInboxConnection,
    H::Pool: AsyncClaimPool<Connection = H::Connection>,
    B: steps::Body<H::Connection, Result<T, E>> + steps::Body<NoConnection, Result<T, E>>,
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
    let run = Run::message(spec, &key, true);
    let result = match conn.__inbox_claim_target() {
        ClaimOn::Connection(conn) => {
            claim_mode::drive_claim(
                Awaiting(conn),
                spec,
                claim,
                key,
                body,
                remembered,
                inbox_error,
            )
            .instrument(run.instrument_span())
            .await
        }
        ClaimOn::Pool(pool) => {
            claim_on_pool(pool, spec, claim, key, body, remembered, inbox_error)
                .instrument(run.instrument_span())
                .await
        }
    };
    run.finish(&result);
    result
}

/// Claim mode on a pool: the claim and the stamp each on a checkout of their own, the body
/// with none.
async fn claim_on_pool<P, T, E, B, A>(
    pool: &P,
    spec: &'static HandlerSpec,
    claim: ClaimSpec,
    key: MessageKey,
    mut body: B,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<A, E>
where
    P: AsyncClaimPool,
    P::Connection: AsyncInboxConnection,
    B: steps::Body<NoConnection, Result<T, E>>,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let started = {
        let mut checkout = pool
            .checkout()
            .await
            .map_err(|source| claim_mode::claim_not_started(spec, source, inbox_error))?;
        claim_mode::claim_started(
            &mut Awaiting(&mut *checkout),
            spec,
            claim,
            &key,
            remembered,
            inbox_error,
        )
        .await?
    };
    let (holding, remembered) = match started {
        claim_mode::Started::Answered(answer) => return Ok(answer),
        claim_mode::Started::Holding(holding, remembered) => (holding, remembered),
    };
    let ran = claim_mode::run_detached(spec, &holding, &mut body).await;
    let mut value = match ran {
        Ok(Ok(value)) => value,
        ran => return released_on_pool(pool, spec, holding, key, ran, inbox_error).await,
    };
    let mut stamp = claim_mode::ToStamp::before_stamp(&value, &holding, remembered);
    let mut tries = claim_mode::StampTries::new(&holding);
    loop {
        let failure = match pool.checkout().await {
            Ok(mut checkout) => {
                let stamped = claim_mode::claim_stamped(
                    &mut Awaiting(&mut *checkout),
                    spec,
                    &holding,
                    &key,
                    value,
                    &mut stamp,
                    inbox_error,
                    Some(tries.elsewhere()),
                )
                .await;
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
            Some(pause) => tokio::time::sleep(pause).await,
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
}

/// Phase 3 of claim mode on a pool after a body that failed or was stopped: its claim
/// released on a connection checked out for it (three checkouts tried; the claim is left
/// to its lease when none comes).
async fn released_on_pool<P, T, E, A>(
    pool: &P,
    spec: &'static HandlerSpec,
    holding: claim_mode::Holding,
    key: MessageKey,
    ran: Result<Result<T, E>, steps::Panicked>,
    inbox_error: fn(Error) -> E,
) -> Result<A, E>
where
    P: AsyncClaimPool,
    P::Connection: AsyncInboxConnection,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let mut failure = None;
    for _ in 0..claim_mode::RELEASE_CHECKOUTS {
        match pool.checkout().await {
            Ok(mut checkout) => {
                let mut steps = Awaiting(&mut *checkout);
                if let Err(e) = claim_mode::prepared_for_stamp(&mut steps, &holding).await {
                    return claim_mode::claim_unsettled(
                        spec,
                        holding,
                        ran,
                        Box::new(e),
                        inbox_error,
                    );
                }
                let nothing = Remembered::nothing();
                return claim_mode::claim_finished(
                    &mut steps,
                    spec,
                    holding,
                    key,
                    ran,
                    nothing,
                    inbox_error,
                )
                .await;
            }
            Err(source) => failure = Some(source),
        }
    }
    let source = failure.expect("a checkout was tried");
    claim_mode::claim_unsettled(spec, holding, ran, source, inbox_error)
}

impl<C: AsyncInboxConnection> Steps for Awaiting<'_, C> {
    type Conn = C;

    fn conn(&mut self) -> &mut C {
        self.0
    }

    fn net(&mut self) -> Option<usize> {
        crate::tripwire::net::Net::id(diesel_async::AsyncConnection::instrumentation(self.0))
    }

    fn identity(&mut self) -> usize {
        let instrumentation =
            std::ptr::from_mut(diesel_async::AsyncConnection::instrumentation(self.0));
        checked::identity(
            <C as AsyncInboxConnection>::BACKEND,
            std::ptr::from_mut(self.0).cast::<u8>() as usize,
            size_of::<C>(),
            instrumentation.cast::<u8>() as usize,
        )
    }

    const CANCELLABLE: bool = true;

    fn address(&mut self) -> usize {
        let instrumentation =
            std::ptr::from_mut(diesel_async::AsyncConnection::instrumentation(self.0));
        // As the identity of a PostgreSQL connection: what stays with it.
        checked::identity(
            crate::dialect::Backend::Postgres,
            std::ptr::from_mut(self.0).cast::<u8>() as usize,
            size_of::<C>(),
            instrumentation.cast::<u8>() as usize,
        )
    }

    fn in_transaction(&mut self) -> bool {
        use diesel_async::TransactionManager;
        matches!(
            C::TransactionManager::transaction_manager_status_mut(self.0).transaction_depth(),
            Ok(Some(_))
        )
    }

    /// diesel-async counts an open transaction as broken too (for its pools): here only a
    /// manager that is broken with no transaction open — its `BEGIN` cut off, or in error.
    fn broken(&mut self) -> bool {
        use diesel_async::TransactionManager;
        C::TransactionManager::is_broken_transaction_manager(self.0) && !self.in_transaction()
    }

    fn abandon(&mut self) -> bool {
        use diesel_async::TransactionManager;
        let open = self.in_transaction();
        if open {
            C::TransactionManager::transaction_manager_status_mut(self.0).set_in_error();
        }
        open
    }

    fn in_error(&mut self) -> bool {
        use diesel_async::TransactionManager;
        C::TransactionManager::transaction_manager_status_mut(self.0)
            .transaction_depth()
            .is_err()
    }

    fn forget_transaction(&mut self) {
        use diesel_async::TransactionManager;
        *C::TransactionManager::transaction_manager_status_mut(self.0) = Default::default();
    }

    fn discard(&mut self) {
        use diesel_async::TransactionManager;
        C::TransactionManager::transaction_manager_status_mut(self.0).set_in_error();
    }

    async fn begin(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()> {
        self.0
            .begin_inbox_transaction(spec, layout)
            .await
            .map_err(crate::backends::inside_callers)
    }

    async fn begin_with_claim(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
    ) -> Option<QueryResult<bool>> {
        let armed = CancelIfDropped::arm(&*self.0);
        let claimed = self.0.begin_with_claim(spec, key, layout).await;
        armed.disarm();
        claimed
    }

    async fn end(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()> {
        self.0.end_inbox_transaction(spec, layout.mariadb).await
    }

    async fn claim(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
    ) -> QueryResult<bool> {
        let armed = CancelIfDropped::arm(&*self.0);
        let claimed = self.0.claim_marker(spec, key, layout).await;
        armed.disarm();
        claimed
    }

    async fn claim_batch(
        &mut self,
        spec: &'static HandlerSpec,
        ids: &[uuid::Uuid],
        texts: Option<&[String]>,
        layout: Layout,
    ) -> QueryResult<Vec<uuid::Uuid>> {
        let armed = CancelIfDropped::arm(&*self.0);
        let claimed = self.0.claim_markers(spec, ids, texts, layout).await;
        armed.disarm();
        claimed
    }

    async fn commit(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()> {
        self.0.commit_inbox_transaction(spec, layout.mariadb).await
    }

    async fn roll_back_and_end(
        &mut self,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> QueryResult<()> {
        self.0.roll_back_and_end(spec, layout.mariadb).await
    }

    async fn roll_back(&mut self) -> QueryResult<()> {
        self.0.roll_back_inbox_transaction().await
    }

    async fn roll_back_abandoned(&mut self) -> QueryResult<()> {
        self.0.roll_back_abandoned().await
    }

    async fn prepare_claim(&mut self, spec: &'static HandlerSpec) -> QueryResult<()> {
        self.0.prepare_claim(spec).await
    }

    async fn wait_for_locks(
        &mut self,
        spec: &'static HandlerSpec,
        claimed: bool,
    ) -> QueryResult<()> {
        self.0.wait_for_locks(spec, claimed).await
    }

    async fn ended_by_server(&mut self) -> bool {
        crate::runtime::claim::ended_by_server(self).await
    }

    async fn ended_in_body(&mut self) -> bool {
        match <C as AsyncInboxConnection>::BACKEND {
            crate::dialect::Backend::Postgres => crate::runtime::claim::ended_in_body(self).await,
            // As on the sync connection.
            crate::dialect::Backend::Sqlite | crate::dialect::Backend::Mysql => false,
        }
    }

    async fn discard_foreign(&mut self) {
        let _ = diesel_async::SimpleAsyncConnection::batch_execute(self.0, "ROLLBACK").await;
        self.forget_transaction();
    }

    fn stop_caching_statements(&mut self) {
        self.0
            .set_prepared_statement_cache_size(diesel::connection::CacheSize::Disabled);
    }

    async fn verify(
        &mut self,
        spec: &'static HandlerSpec,
        claim: bool,
    ) -> Result<Layout, crate::schema::check::SchemaError> {
        self.0
            .prepare_check(spec)
            .await
            .map_err(crate::schema::check::SchemaError::Database)?;
        crate::schema::verify_layout_async(self.0, &spec.schema, claim).await
    }

    async fn claim_step(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        step: ClaimStep,
    ) -> QueryResult<ClaimAnswer> {
        crate::runtime::claim::step(self, &spec.schema, spec.consumer.as_str(), key, step).await
    }

    async fn markers_present(
        &mut self,
        spec: &'static HandlerSpec,
        ids: &[uuid::Uuid],
        latest: bool,
    ) -> QueryResult<crate::runtime::found::Presence> {
        crate::runtime::claim::present(self, &spec.schema, spec.consumer.as_str(), ids, latest)
            .await
    }

    fn depth(&mut self) -> u32 {
        use diesel_async::TransactionManager;
        C::TransactionManager::transaction_manager_status_mut(self.0)
            .transaction_depth()
            .ok()
            .flatten()
            .map_or(0, std::num::NonZeroU32::get)
    }

    async fn savepoint(&mut self) -> QueryResult<()> {
        use diesel_async::TransactionManager;
        C::TransactionManager::begin_transaction(self.0).await
    }

    async fn release(&mut self) -> QueryResult<()> {
        use diesel_async::TransactionManager;
        C::TransactionManager::commit_transaction(self.0).await
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
            self,
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
        crate::runtime::stored::read(self, &spec.schema, consumer, key, columns, latest).await
    }

    async fn write_fingerprint(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        fingerprint: Fingerprint,
    ) -> QueryResult<usize> {
        crate::runtime::stored::write_fingerprint(
            self,
            &spec.schema,
            spec.consumer.as_str(),
            key,
            fingerprint,
        )
        .await
    }

    async fn pause(&mut self, delay: Duration) {
        tokio::time::sleep(delay).await;
    }
}
