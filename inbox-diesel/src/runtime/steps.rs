//! What the runtime asks of a connection ([`Steps`]) — implemented once, over a connection
//! of either IO model ([`handle`](super::handle)), and by the unit tests' scripts — and the
//! handler's body ([`Body`]): how it is run, and a panic in it caught.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use diesel::QueryResult;
use inbox_core::MessageKey;

use crate::dialect::claim::{ClaimAnswer, ClaimStep};
use crate::dialect::layout::Layout;
use crate::dialect::marker::{Keeps, MarkerValues};
use crate::error::Error;
use crate::runtime::found::Kept;
use crate::runtime::found::Presence;
use crate::schema::check::SchemaError;
use crate::spec::HandlerSpec;
use crate::tripwire;
use crate::value::Fingerprint;

/// What a connection does for the driver: open, claim, commit, roll back, wait.
pub(crate) trait Steps {
    /// The connection the handler's body is given.
    type Conn;

    fn conn(&mut self) -> &mut Self::Conn;

    /// The connection's [`Net`](crate::tripwire::net::Net), if it has one: the connection
    /// the body may write on.
    fn net(&mut self) -> Option<usize>;

    /// What the connection's startup check is remembered by: an address that stays with the
    /// connection while it moves between a pool and its users ([`identity`](super::checked::identity)).
    fn identity(&mut self) -> usize;

    /// Whether a delivery on this connection can be cancelled mid-way, its future dropped
    /// (an async handler): then a transaction it leaves open is watched for ([`Abandoned`](super::failure::Abandoned)).
    /// A sync handler stops in its transaction only by a panic, which rolls it back.
    const CANCELLABLE: bool = false;

    /// The connection's own address, as [`identity`](Self::identity) takes it on every
    /// backend: what a transaction left open by a cancelled handler is remembered by
    /// ([`Abandoned`](super::failure::Abandoned)).
    fn address(&mut self) -> usize {
        self.identity()
    }

    /// Whether the connection's transaction manager has a transaction open. A sync handler
    /// cannot be stopped inside its transaction but by a panic, which rolls it back: `false`.
    fn in_transaction(&mut self) -> bool {
        false
    }

    /// Whether the connection's transaction manager says a statement of its own (`BEGIN`,
    /// `COMMIT`, `ROLLBACK`) was cut off in the middle: nothing more can be read on it.
    fn broken(&mut self) -> bool {
        false
    }

    /// A delivery dropped with its transaction open ([`Abandoned`](super::failure::Abandoned)): the connection's
    /// transaction manager is put in error, so that the application's own use of the
    /// connection's transactions (`transaction`, `begin_transaction`, `rollback_transaction`)
    /// is refused (`BrokenTransactionManager`) instead of nesting a savepoint in the dropped
    /// transaction, which no one would commit. `true` when it was.
    fn abandon(&mut self) -> bool {
        false
    }

    /// Whether the connection's transaction manager is in error: [`abandon`](Self::abandon)
    /// or [`discard`](Self::discard) put it there, or a failure diesel could not recover from.
    fn in_error(&mut self) -> bool {
        false
    }

    /// Puts the connection's transaction manager in error, which every pool reads as a
    /// broken connection ([`discard`](super::failure::discard)).
    fn discard(&mut self);

    /// Undoes [`abandon`](Self::abandon), or forgets a transaction the manager still counts:
    /// the manager counts none open. Only before [`roll_back_abandoned`](Self::roll_back_abandoned).
    fn forget_transaction(&mut self) {}

    /// Opens the handler's transaction.
    async fn begin(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()>;

    /// Opens the handler's transaction with `key`'s marker claimed in it, in one round trip
    /// where the connection can; `None` where it cannot (then [`begin`](Self::begin) and
    /// [`claim`](Self::claim)). `Ok(false)`: a duplicate proven by the inbox's own index,
    /// the transaction aborted, to be rolled back.
    ///
    /// `keeps`: what the marker keeps, where the connection [defers](Self::defers_marker)
    /// it (nothing otherwise): the claim is then the key's lock and the look for the marker.
    async fn begin_with_claim(
        &mut self,
        _spec: &'static HandlerSpec,
        _key: &MessageKey,
        _layout: Layout,
        _keeps: Keeps,
    ) -> Option<QueryResult<bool>> {
        None
    }

    /// Whether a marker that keeps `keeps` beside its key is written at the commit, with
    /// what it keeps ([`Session::defers_marker`](crate::io::Session::defers_marker)).
    fn defers_marker(&mut self, _spec: &'static HandlerSpec, _keeps: Keeps) -> bool {
        false
    }

    /// Inserts the marker [deferred](Self::defers_marker) with `values`, and commits: what
    /// [`commit`](Self::commit) does otherwise. The inbox's unique index refusing the marker
    /// is returned as the error it is.
    async fn commit_with_marker(
        &mut self,
        _spec: &'static HandlerSpec,
        _key: &MessageKey,
        _layout: Layout,
        _values: MarkerValues<'_>,
    ) -> QueryResult<()> {
        Err(diesel::result::Error::QueryBuilderError(
            "the connection writes no marker at the commit".into(),
        ))
    }

    /// Puts back what `begin` set for the session, once the transaction ended.
    async fn end(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()>;

    /// Inserts the marker unless it exists, with what `layout` says; `Ok(false)` when it
    /// already did.
    async fn claim(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
    ) -> QueryResult<bool>;

    /// Inserts the markers of `ids` (distinct, sorted) that do not exist; returns those it
    /// inserted. `texts`: the keys' texts, in the order of `ids`, for a table with `key_text`.
    async fn claim_batch(
        &mut self,
        spec: &'static HandlerSpec,
        ids: &[uuid::Uuid],
        texts: Option<&[String]>,
        layout: Layout,
    ) -> QueryResult<Vec<uuid::Uuid>>;

    /// Commits, failing if the transaction had been aborted by a failed statement; and puts
    /// back what `begin` set for the session (no [`end`](Self::end) after it succeeded).
    async fn commit(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()>;

    /// Rolls back a duplicate's transaction and puts back what `begin` set for the session
    /// (no [`end`](Self::end) after it succeeded).
    async fn roll_back_and_end(
        &mut self,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> QueryResult<()>;

    /// Rolls back if a transaction is open; `Ok` when none is.
    async fn roll_back(&mut self) -> QueryResult<()>;

    /// Rolls back the transaction a cancelled handler left open ([`Abandoned`](super::failure::Abandoned)), which the
    /// manager no longer counts ([`forget_transaction`](Self::forget_transaction)), and puts
    /// back what its `begin` set for the session.
    async fn roll_back_abandoned(&mut self) -> QueryResult<()> {
        self.roll_back().await
    }

    /// Turns diesel's prepared-statement cache off on the connection: its statements' names
    /// clash, or are missing, on server connections a transaction-mode pooler shares between
    /// clients (PostgreSQL 42P05, 26000). Uncached statements are unnamed and never clash.
    fn stop_caching_statements(&mut self);

    /// MariaDB, inside the handler's transaction after a failure: whether the transaction
    /// is no longer the handler's (its savepoint is gone), as after a deadlock or a Galera
    /// abort and not after a statement's own error. `false` where it cannot tell.
    async fn ended_by_server(&mut self) -> bool;

    /// PostgreSQL, after the body failed: whether the transaction open is no longer the
    /// handler's — the body's own `ROLLBACK` or `COMMIT` ended it
    /// ([`HandlerSpec::POSTGRES_STILL_OURS`]); PostgreSQL ends none by itself but with the
    /// session. `false` elsewhere, or where it is (aborted or not).
    async fn ended_in_body(&mut self) -> bool {
        false
    }

    /// After a transaction the body ended: one the body began since, which diesel's manager
    /// may not count, rolled back as it is (where none is open, PostgreSQL only warns), and
    /// the manager told none is open.
    async fn discard_foreign(&mut self) {}

    /// Reads the inbox table's definition from the catalog and checks it (`schema::verify`).
    async fn verify(
        &mut self,
        spec: &'static HandlerSpec,
        claim: bool,
    ) -> Result<Layout, SchemaError>;

    /// `on_locked = "in_flight"`: after the marker's claim, lock waits as the session had them
    /// (`claimed`: a marker was written and the body runs; after a duplicate or a failed
    /// claim the transaction is only rolled back, and on PostgreSQL it may be aborted).
    async fn wait_for_locks(
        &mut self,
        spec: &'static HandlerSpec,
        claimed: bool,
    ) -> QueryResult<()>;

    /// Claim mode: checks that no transaction is open and prepares the connection.
    async fn prepare_claim(&mut self, spec: &'static HandlerSpec) -> QueryResult<()>;

    /// Claim mode: runs one statement, committed on its own.
    async fn claim_step(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        step: ClaimStep,
    ) -> QueryResult<ClaimAnswer>;

    /// Which of `ids` have a marker of the handler's consumer, inside the open transaction,
    /// and how many of those are completed: the evidence of the duplicates an insert
    /// reported by writing nothing. `latest`: what committed last, whatever the
    /// transaction's snapshot (a locking read on MySQL and MariaDB, inside a transaction of
    /// the caller's).
    async fn markers_present(
        &mut self,
        spec: &'static HandlerSpec,
        ids: &[uuid::Uuid],
        latest: bool,
    ) -> QueryResult<Presence>;

    /// How deep the transactions diesel's manager counts on the connection are: 0 outside
    /// any.
    fn depth(&mut self) -> u32;

    /// Inside a transaction of the caller's (`transaction = "caller"`): a savepoint, through
    /// diesel's manager, which counts it.
    async fn savepoint(&mut self) -> QueryResult<()>;

    /// Releases [`savepoint`](Self::savepoint)'s savepoint: what was written since stays in
    /// the caller's transaction, for the caller to commit.
    async fn release(&mut self) -> QueryResult<()>;

    /// Writes `text` as the stored result of `key`'s marker (`store_result`), with
    /// `fingerprint` in the same statement: in the open transaction, or with `attempt`
    /// (claim mode) on its own where that claim is still open.
    async fn store_result(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        text: String,
        fingerprint: Option<Fingerprint>,
        attempt: Option<u32>,
    ) -> QueryResult<usize>;

    /// What `key`'s marker kept: its result and its fingerprint, as `columns` says which
    /// to read. `latest`: inside a transaction of the caller's, what committed last,
    /// whatever its snapshot ([`ClaimSql::present`](crate::dialect::claim::ClaimSql)'s).
    async fn read_kept(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        columns: (bool, bool),
        latest: bool,
    ) -> QueryResult<Kept>;

    /// Writes the request's fingerprint on `key`'s marker, in the open transaction.
    async fn write_fingerprint(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        fingerprint: Fingerprint,
    ) -> QueryResult<usize>;

    /// Waits before a retry.
    async fn pause(&mut self, delay: Duration);
}

/// The handler's body, run once per attempt.
pub(crate) trait Body<C, R> {
    async fn call(&mut self, conn: &mut C) -> R;
}

/// What an attempt ended with, and so what [`drive`](super::transaction::drive) decided for the message (or the batch).
pub(crate) enum Decided<T, W> {
    Processed(T),
    /// With the stored result, for a handler that stores one.
    Duplicate(Option<T>),
    /// `on_locked = "in_flight"`: another delivery holds the marker, uncommitted. `W` is
    /// the outcome type's witness that it can say so ([`HandlerOutcome::InFlightWitness`](inbox_core::HandlerOutcome::InFlightWitness)).
    InFlight(W),
}

impl<T, W> Decided<T, W> {
    /// The body's value, if it ran and committed.
    pub(crate) fn value(self) -> Option<T> {
        match self {
            Decided::Processed(value) => Some(value),
            Decided::Duplicate(_) | Decided::InFlight(_) => None,
        }
    }
}

/// Runs the handler's body under the tripwire's mark, so that a pool checkout in it — in
/// code the compile-time check cannot see — is refused (`tripwire`). Set during each poll of
/// the body's future and put back after it: the sync body runs to its end in its one poll,
/// and an async body's mark does not outlive its polls into other tasks.
///
/// A panic in the body is caught at its poll and returned, so that the driver can roll back
/// (or release the claim) before the panic goes on: unwinding past an open transaction would
/// leave it open on the connection — refusing every later call with `AlreadyInTransaction`
/// and holding the marker's lock against every redelivery — until the connection is dropped.
///
/// `origin` names the run's messages in the outbox ([`crate::outbox`]): `None` in claim
/// mode, whose body has no transaction to publish in.
pub(super) async fn run_body<C, R, B: Body<C, R>>(
    spec: &'static HandlerSpec,
    body: &mut B,
    conn: &mut C,
    origin: Option<crate::outbox::Seed>,
    net: Option<usize>,
) -> Result<R, Panicked> {
    let mut future = pin!(tripwire::marked(
        Some(spec.consumer.as_str()),
        tripwire::net::handled_on(net, crate::outbox::originating(origin, body.call(conn)))
    ));
    std::future::poll_fn(|cx| {
        // The body's future is not polled again after a panic: it is dropped with the rest.
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(Panicked(payload))),
        }
    })
    .await
}

/// Runs the handler's body ([`run_body`]) on the connection of `steps`, under its net.
pub(super) async fn run_body_on<S: Steps, R, B: Body<S::Conn, R>>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    body: &mut B,
    origin: Option<crate::outbox::Seed>,
) -> Result<R, Panicked> {
    let net = steps.net();
    run_body(spec, body, steps.conn(), origin, net).await
}

/// The payload of a panic in the handler's body, resumed once the transaction is rolled back.
pub(crate) struct Panicked(pub(super) Box<dyn Any + Send>);

/// Whether the body was stopped by the tripwire — a write the net stopped, a checkout a
/// guarded pool refused, a handler's connection without the net the process installed —
/// rather than by a panic of its own.
pub(super) fn is_stopped(payload: &(dyn Any + Send)) -> bool {
    payload.is::<tripwire::net::Escaped>()
        || payload.is::<tripwire::InsideHandler>()
        || payload.is::<tripwire::net::NetMissing>()
}

/// The inbox's error for a body the tripwire stopped ([`is_stopped`]).
pub(super) fn stopped(payload: Box<dyn Any + Send>) -> Error {
    let payload = match payload.downcast::<tripwire::net::Escaped>() {
        Ok(escaped) => return Error::WriteOutsideTransaction(*escaped),
        Err(payload) => payload,
    };
    match payload.downcast::<tripwire::InsideHandler>() {
        Ok(inside) => Error::CheckoutInsideHandler(*inside),
        Err(payload) => Error::NetMissing(
            *payload
                .downcast::<tripwire::net::NetMissing>()
                .expect("checked by `is_stopped`"),
        ),
    }
}

/// Rolls back the handler's transaction if it is still open. A failure to roll back is
/// logged, not returned: the error that caused the rollback is the one the caller needs, and
/// diesel marks the connection broken so that a pool discards it.
pub(super) async fn roll_back<S: Steps>(steps: &mut S) {
    if let Err(e) = steps.roll_back().await {
        tracing::error!(error = %e, "rollback failed");
    }
}

/// Puts back what the transaction's `begin` set for the session. A failure is logged, not
/// returned: the transaction has ended, and what it decided stands.
pub(super) async fn end<S: Steps>(steps: &mut S, spec: &'static HandlerSpec, layout: Layout) {
    if let Err(e) = steps.end(spec, layout).await {
        tracing::warn!(error = %e, "putting back the session's settings failed");
    }
}
