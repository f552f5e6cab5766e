//! The sync runtime: the expansion of `#[idempotent]` on a `fn`.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::time::Duration;

use diesel::QueryResult;
use inbox_core::{BatchOutcome, ErrorClass, HandlerOutcome, KeyError, MessageKey};
use tracing::Instrument;

use crate::dialect::claim::{ClaimAnswer, ClaimStep};
use crate::dialect::layout::Layout;
use crate::io::{Blocking, complete_now};
use crate::runtime::claim::ClaimSpec;
use crate::runtime::driver::{self, BatchClaims, NewMessages, Steps};
use crate::runtime::stored::{Fingerprint, Kept, Remembered};
use crate::spec::HandlerSpec;
use crate::telemetry::Run;
use crate::{Error, InboxConnection, NoConnection};

/// Runs `body` once per message key and consumer, on a sync connection, answering in the
/// outcome type `A` the caller names (`_outcome`); see
/// `driver::drive` for the steps.
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
    C: InboxConnection,
    B: FnMut(&mut C) -> Result<T, E>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
    A: HandlerOutcome<T>,
{
    let key = key.map_err(|e| Run::invalid_key(spec, inbox_error(Error::InvalidKey(e))))?;
    // The stored id, not the key: a key can be business data (an e-mail address) or carry
    // control characters; the key itself is logged escaped, at DEBUG (`driver`).
    let run = Run::message(spec, &key, false);
    let result = complete_now(
        driver::drive(
            Blocking(conn),
            spec,
            &key,
            Immediate(body),
            probe,
            A::IN_FLIGHT,
            remembered,
            inbox_error,
        )
        .instrument(run.instrument_span()),
    )
    .map(|value| driver::outcome(spec, key, value));
    run.finish(&result);
    result
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
    C: InboxConnection,
    B: FnMut(&mut C) -> Result<T, E>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
    A: HandlerOutcome<T>,
{
    // The depth `drive_joined` refuses at 0, read the same way.
    match Blocking(&mut *conn).depth() > 0 {
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
/// (`transaction = "caller"`), on a sync connection; see `driver::drive_joined`.
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
    C: InboxConnection,
    B: FnOnce(&mut C) -> Result<T, E>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
    A: HandlerOutcome<T>,
{
    let key = key.map_err(|e| Run::invalid_key(spec, inbox_error(Error::InvalidKey(e))))?;
    let run = Run::message(spec, &key, false);
    let result = complete_now(
        driver::drive_joined::<_, _, _, _, _, A::InFlightWitness>(
            Blocking(conn),
            spec,
            &key,
            Once(Some(body)),
            probe,
            remembered,
            inbox_error,
        )
        .instrument(run.instrument_span()),
    )
    .map(|value| driver::outcome(spec, key, value));
    run.finish(&result);
    result
}

/// A sync body that runs once: in its caller's transaction, never retried.
struct Once<B>(Option<B>);

impl<C, R, B: FnOnce(&mut C) -> R> driver::Body<C, R> for Once<B> {
    async fn call(&mut self, conn: &mut C) -> R {
        let body = self.0.take().expect("a joined body runs once");
        body(conn)
    }
}

/// Runs `body` once for the messages of a batch that are new, in one transaction; see
/// `driver::drive` for the steps.
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
    C: InboxConnection,
    B: FnMut(&mut C) -> Result<T, E>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
{
    let keys = keys.map_err(|e| Run::invalid_key(spec, inbox_error(Error::InvalidKey(e))))?;
    if keys.is_empty() {
        return Ok(driver::batch_outcome(0, None, new));
    }
    let run = Run::batch(spec, keys.len());
    let claims = BatchClaims::new(&keys, new);
    let result = complete_now(
        driver::drive(
            Blocking(conn),
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
    .map(|value| driver::batch_outcome(keys.len(), value.value(), new));
    run.finish_batch(&result);
    result
}

/// Runs `body` in claim mode, on a sync connection; see `driver::drive_claim` for the steps.
#[allow(
    clippy::too_many_arguments,
    reason = "the pieces the expansion of `#[idempotent]` writes, each its own argument"
)]
pub fn run_claim<C, T, E, B, A>(
    _outcome: PhantomData<A>,
    conn: &mut C,
    spec: &'static HandlerSpec,
    claim: ClaimSpec,
    key: Result<MessageKey, KeyError>,
    body: B,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<A, E>
where
    C: InboxConnection,
    B: FnOnce(&mut NoConnection) -> Result<T, E>,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let key = key.map_err(|e| Run::invalid_key(spec, inbox_error(Error::InvalidKey(e))))?;
    let run = Run::message(spec, &key, true);
    let result = complete_now(
        driver::drive_claim(
            Blocking(conn),
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

/// A sync body: it runs to its end when called.
pub(crate) struct Immediate<B>(pub(crate) B);

impl<C, R, B: FnMut(&mut C) -> R> driver::Body<C, R> for Immediate<B> {
    async fn call(&mut self, conn: &mut C) -> R {
        (self.0)(conn)
    }
}

/// A sync claim-mode body: it runs to its end when called, and is given no connection. It
/// runs once — a failed run is retried by the broker's redelivery, never here — so it may
/// consume what it captured: the handler's parameters taken by value.
struct OnceWithoutConnection<B>(Option<B>);

impl<C, R, B: FnOnce(&mut NoConnection) -> R> driver::Body<C, R> for OnceWithoutConnection<B> {
    async fn call(&mut self, _: &mut C) -> R {
        let body = self.0.take().expect("a claim-mode body runs once");
        body(&mut NoConnection::new())
    }
}

impl<C: InboxConnection> Steps for Blocking<'_, C> {
    type Conn = C;

    fn conn(&mut self) -> &mut C {
        self.0
    }

    fn net(&mut self) -> Option<usize> {
        crate::tripwire::net::Net::id(diesel::Connection::instrumentation(self.0))
    }

    fn identity(&mut self) -> usize {
        let instrumentation = std::ptr::from_mut(diesel::Connection::instrumentation(self.0));
        driver::identity(
            <C as InboxConnection>::BACKEND,
            std::ptr::from_mut(self.0).cast::<u8>() as usize,
            size_of::<C>(),
            instrumentation.cast::<u8>() as usize,
        )
    }

    async fn begin(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()> {
        self.0
            .begin_inbox_transaction(spec, layout)
            .map_err(crate::backends::inside_callers)
    }

    async fn begin_with_claim(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
    ) -> Option<QueryResult<bool>> {
        self.0.begin_with_claim(spec, key, layout)
    }

    async fn end(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()> {
        self.0.end_inbox_transaction(spec, layout.mariadb)
    }

    async fn claim(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
    ) -> QueryResult<bool> {
        self.0
            .claim_marker(&spec.schema, spec.consumer.as_str(), key, layout)
    }

    async fn claim_batch(
        &mut self,
        spec: &'static HandlerSpec,
        ids: &[uuid::Uuid],
        texts: Option<&[String]>,
        layout: Layout,
    ) -> QueryResult<Vec<uuid::Uuid>> {
        self.0
            .claim_markers(&spec.schema, spec.consumer.as_str(), ids, texts, layout)
    }

    async fn commit(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()> {
        self.0.commit_inbox_transaction(spec, layout.mariadb)
    }

    async fn roll_back_and_end(
        &mut self,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> QueryResult<()> {
        self.0.roll_back_and_end(spec, layout.mariadb)
    }

    async fn roll_back(&mut self) -> QueryResult<()> {
        self.0.roll_back_inbox_transaction()
    }

    async fn prepare_claim(&mut self, spec: &'static HandlerSpec) -> QueryResult<()> {
        self.0.prepare_claim(spec)
    }

    async fn wait_for_locks(
        &mut self,
        spec: &'static HandlerSpec,
        claimed: bool,
    ) -> QueryResult<()> {
        self.0.wait_for_locks(spec, claimed)
    }

    async fn ended_by_server(&mut self) -> bool {
        crate::runtime::claim::ended_by_server(self).await
    }

    async fn ended_in_body(&mut self) -> bool {
        match <C as InboxConnection>::BACKEND {
            crate::dialect::Backend::Postgres => crate::runtime::claim::ended_in_body(self).await,
            // SQLite rolls a transaction back itself on some errors (a busy database, a full
            // disk): after a body's error its savepoint's absence does not say the body did.
            crate::dialect::Backend::Sqlite | crate::dialect::Backend::Mysql => false,
        }
    }

    async fn discard_foreign(&mut self) {
        use diesel::connection::TransactionManager;
        let _ = diesel::connection::SimpleConnection::batch_execute(self.0, "ROLLBACK");
        *diesel::connection::AnsiTransactionManager::transaction_manager_status_mut(self.0) =
            Default::default();
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
        crate::schema::verify_layout(self.0, &spec.schema, claim)
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
    ) -> QueryResult<usize> {
        crate::runtime::claim::present(self, &spec.schema, spec.consumer.as_str(), ids, latest)
            .await
    }

    fn depth(&mut self) -> u32 {
        use diesel::connection::TransactionManager;
        diesel::connection::AnsiTransactionManager::transaction_manager_status_mut(self.0)
            .transaction_depth()
            .ok()
            .flatten()
            .map_or(0, std::num::NonZeroU32::get)
    }

    async fn savepoint(&mut self) -> QueryResult<()> {
        use diesel::connection::TransactionManager;
        diesel::connection::AnsiTransactionManager::begin_transaction(self.0)
    }

    async fn release(&mut self) -> QueryResult<()> {
        use diesel::connection::TransactionManager;
        diesel::connection::AnsiTransactionManager::commit_transaction(self.0)
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
        std::thread::sleep(delay);
    }
}
