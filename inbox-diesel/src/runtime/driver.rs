//! The steps of both modes, written once for both IO models.
//!
//! [`drive`] (transaction mode) and [`drive_claim`] (claim mode) are `async fn`s over
//! [`Steps`]. The async runtime awaits them; the sync runtime polls them once with a no-op
//! waker — every step of a sync connection completes in that poll, because none of them
//! awaits anything. So the order of the steps, the retry loop, and what each failure means
//! exist in one place.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Where `inbox_diesel::testing::crash` may stop the handler; nothing without the feature.
macro_rules! crash_point {
    ($point:ident) => {
        #[cfg(feature = "testing")]
        crate::testing::reached(crate::testing::Crash::$point);
    };
}

use diesel::QueryResult;
use diesel::result::Error as DieselError;
use inbox_core::{BatchOutcome, ErrorClass, HandlerOutcome, MessageKey, RetryDecision};

use crate::dialect::claim::{ClaimAnswer, ClaimState, ClaimStep};
use crate::dialect::layout::{Layout, key_text};
use crate::runtime::claim::{ClaimSpec, Presence};
use crate::runtime::stored::{Fingerprint, Kept, Remembered};
use crate::schema::check::SchemaError;
use crate::spec::HandlerSpec;
use crate::telemetry;
use crate::{Error, NoConnection, classify, tripwire};

/// What a connection does for the driver: open, claim, commit, roll back, wait.
pub(crate) trait Steps {
    /// The connection the handler's body is given.
    type Conn;

    fn conn(&mut self) -> &mut Self::Conn;

    /// The connection's [`Net`](crate::tripwire::net::Net), if it has one: the connection
    /// the body may write on.
    fn net(&mut self) -> Option<usize>;

    /// What the connection's startup check is remembered by: an address that stays with the
    /// connection while it moves between a pool and its users ([`identity`]).
    fn identity(&mut self) -> usize;

    /// Whether a delivery on this connection can be cancelled mid-way, its future dropped
    /// (an async handler): then a transaction it leaves open is watched for ([`Abandoned`]).
    /// A sync handler stops in its transaction only by a panic, which rolls it back.
    const CANCELLABLE: bool = false;

    /// The connection's own address, as [`identity`](Self::identity) takes it on every
    /// backend: what a transaction left open by a cancelled handler is remembered by
    /// ([`Abandoned`]).
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

    /// A delivery dropped with its transaction open ([`Abandoned`]): the connection's
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
    /// broken connection ([`discard`]).
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
    async fn begin_with_claim(
        &mut self,
        _spec: &'static HandlerSpec,
        _key: &MessageKey,
        _layout: Layout,
    ) -> Option<QueryResult<bool>> {
        None
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

    /// Rolls back the transaction a cancelled handler left open ([`Abandoned`]), which the
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

/// The error of the runtime's own marker or claim insert (or a claim's takeover): a
/// violation of another unique index, a check or a foreign key, a column without a default,
/// an exhausted sequence, row-level security — anything neither transient nor the
/// connection's — says the inbox table refuses markers, not that the message is bad: a
/// schema fault (`Alert`, and the table checked again), never dead-lettered with the
/// message. The server's error stays the source.
pub(crate) fn refused_marker(error: DieselError, schema: &inbox_core::InboxSchema) -> DieselError {
    // The inbox's own refusal, before the statement was sent (a key too long for the
    // server's packet): as it is.
    if let DieselError::QueryBuilderError(inner) = &error
        && inner.is::<Error>()
    {
        return error;
    }
    match classify(&error, schema) {
        ErrorClass::UniqueViolation { .. } | ErrorClass::Other => {
            DieselError::QueryBuilderError(Box::new(Error::Database {
                class: ErrorClass::Schema,
                attempts: 1,
                source: error,
            }))
        }
        _ => error,
    }
}

/// Confirms that each of `ids`, which an insert did not write, has its marker: a duplicate
/// is answered on the evidence that the other row exists, not on the absence of this one. A
/// trigger, rule or inheritance child can swallow an insert; a new message would then be
/// answered `Duplicate` and never applied. Without the evidence, the delivery fails as a
/// schema fault (the driver checks the table again, which names the cause).
async fn confirm_duplicates<S: Steps>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    ids: &[uuid::Uuid],
) -> QueryResult<()> {
    let found = steps.markers_present(spec, ids, false).await?;
    evidence(spec, found, ids.len())
}

/// Whether `found` proves `n` duplicates: a completed marker of each. A marker that is a
/// claim-mode handler's claim, not completed, is not a duplicate's evidence for a handler
/// of another mode — its side effect may not have run ([`Error::OpenClaim`]); no marker at
/// all is a schema fault ([`swallowed`]).
fn evidence(spec: &'static HandlerSpec, found: Presence, n: usize) -> QueryResult<()> {
    if found.completed == n {
        return Ok(());
    }
    if found.present == n {
        tracing::error!(
            open = n - found.completed,
            live = found.live_claims,
            "the marker met is a claim of claim mode, not completed: not a duplicate"
        );
        return Err(Error::OpenClaim {
            consumer: spec.consumer.clone(),
            live: found.live_claims > 0,
        }
        .into());
    }
    tracing::error!(
        missing = n - found.present,
        "a marker insert was refused or wrote no row, and no marker of its key and consumer \
         is there"
    );
    Err(swallowed(spec))
}

/// The schema fault of a marker or claim insert that wrote no row where no row exists.
fn swallowed(spec: &HandlerSpec) -> DieselError {
    Error::Schema(SchemaError::Mismatch {
        table: spec.schema.table(),
        resolved: None,
        problems: vec![crate::schema::SchemaProblem::Unsupported {
            found: "a marker insert refused as a duplicate or that wrote no row, where no \
                    marker of its key and consumer exists"
                .into(),
            why: "the unique index was redefined since the check (on other columns, under the \
                  inbox index's name), or something on the table (a trigger, a rule, an \
                  inheritance child) swallows inserts: a new message would be answered \
                  Duplicate and never applied",
            fix: "restore the index on (message_id, consumer) and remove what swallows \
                  inserts; `inbox_diesel::schema::verify` names what the check finds"
                .into(),
        }],
    })
    .into()
}

/// The handler's body, run once per attempt.
pub(crate) trait Body<C, R> {
    async fn call(&mut self, conn: &mut C) -> R;
}

/// What an attempt ended with, and so what [`drive`] decided for the message (or the batch).
pub(crate) enum Decided<T, W> {
    Processed(T),
    /// With the stored result, for a handler that stores one.
    Duplicate(Option<T>),
    /// `on_locked = "in_flight"`: another delivery holds the marker, uncommitted. `W` is
    /// the outcome type's witness that it can say so ([`HandlerOutcome::InFlightWitness`]).
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

/// MariaDB writes a deadlock (1213) in the server's own language, whatever the session's
/// `lc_messages`, and its text protocol and the async driver report no code for it: an
/// error nothing recognises, inside the handler's transaction, that the server ended the
/// transaction with ([`Steps::ended_by_server`]) is that deadlock (or a Galera abort, the
/// same error) — a transient failure, retried, never dead-lettered. Any other error as it is.
fn deadlock_if_ended(class: Option<ErrorClass>, ended: bool) -> Option<ErrorClass> {
    match class {
        Some(ErrorClass::Other) if ended => {
            Some(ErrorClass::Transient(inbox_core::TransientKind::Deadlock))
        }
        class => class,
    }
}

/// The claim's error inside the transaction, as [`deadlock_if_ended`] reads a body's: an
/// unrecognised one the MariaDB server ended the transaction with, carried as the deadlock
/// it is (the server's error its source).
async fn deadlock_unread<S: Steps>(
    steps: &mut S,
    spec: &HandlerSpec,
    layout: Layout,
    error: DieselError,
) -> DieselError {
    if !layout.mariadb || classify(&error, &spec.schema) != ErrorClass::Other {
        return error;
    }
    match steps.ended_by_server().await {
        true => DieselError::QueryBuilderError(Box::new(Error::Database {
            class: ErrorClass::Transient(inbox_core::TransientKind::Deadlock),
            attempts: 1,
            source: error,
        })),
        false => error,
    }
}

/// After a transaction the server ended under a body that swallowed the error
/// ([`ErrorClass::TransactionAborted`]), rolled back: whether nothing of it committed, so
/// that it may run again. PostgreSQL and SQLite commit nothing of an aborted transaction.
/// On MySQL and MariaDB a statement that commits implicitly (DDL, `LOCK TABLES`) ends the
/// transaction too — committing the marker and the body's writes before it: there the
/// marker of this key, read after the rollback, must be absent (a batch's is not read: not
/// retried). Present, it may be another delivery's, which went on after this one's
/// deadlock; or this one's, committed early: reported, not retried, either way.
async fn nothing_committed<S: Steps, K: Claims>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    layout: Layout,
    claims: &K,
) -> bool {
    // MySQL reports no transaction ended under the body (it cannot tell).
    if !layout.mariadb {
        return true;
    }
    match claims.key() {
        Some(key) => matches!(
            steps.markers_present(spec, &[key.stored_id()], false).await,
            Ok(Presence { present: 0, .. })
        ),
        None => false,
    }
}

/// The body ended the handler's transaction ([`Error::TransactionEnded`]): never retried.
fn ended_in_body<T, E>() -> Failure<T, E> {
    tracing::error!(
        "the handler's transaction was ended inside its body (a ROLLBACK, COMMIT or BEGIN it \
         sent); what it wrote after that committed on its own"
    );
    Failure::Database(DieselError::QueryBuilderError(Box::new(
        Error::TransactionEnded,
    )))
}

/// What a swallowed error is retried and, never retried, reported as.
const DEADLOCK: ErrorClass = ErrorClass::Transient(inbox_core::TransientKind::Deadlock);

/// Why one attempt failed. Every variant is returned after the transaction was rolled back.
enum Failure<T, E> {
    /// The body returned `Err`; kept as the `Result` the body returned so that the
    /// macro-generated probe can look inside it. With whether the server had ended the
    /// transaction ([`deadlock_if_ended`]).
    Body(Result<T, E>, bool),
    /// Beginning, claiming or committing failed.
    Database(DieselError),
    /// The body returned `Ok` over an aborted transaction.
    Aborted,
}

/// Runs `body` once per message key and consumer:
///
/// 1. `BEGIN` (SQLite `BEGIN IMMEDIATE`; PostgreSQL with the handler's isolation level);
/// 2. claim the markers first (`INSERT … ON CONFLICT DO NOTHING RETURNING …`); when none is
///    new, every message was processed before: roll back, return `None`, body not run;
/// 3. run the body on the same connection;
/// 4. `Ok` → commit → `Some(value)`; `Err` → roll back → the body's error.
///
/// A transient failure (serialization failure, deadlock, busy database) — in any step, or
/// in the body when `probe` recognises a diesel error in what it returned — is retried in a
/// fresh transaction as `spec.retry` says.
///
/// `in_flight` is the outcome type's witness that it can answer `InFlight`: without one, a
/// marker found locked is an error like any other (`on_locked = "in_flight"` needs it).
#[allow(
    clippy::too_many_arguments,
    reason = "what the handler's expansion hands on, each its own argument"
)]
pub(crate) async fn drive<S, K, T, E, B, P, W: Copy>(
    mut steps: S,
    spec: &'static HandlerSpec,
    claims: &K,
    body: B,
    probe: P,
    in_flight: Option<W>,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<Decided<T, W>, E>
where
    S: Steps,
    K: Claims,
    B: Body<S::Conn, Result<T, E>>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
{
    // Sync deliveries take no lock of the watch's: they cannot be cancelled mid-way.
    if S::CANCELLABLE
        && let Err(source) = recover(&mut steps).await
    {
        return Err(inbox_error(Error::Database {
            class: ErrorClass::ConnectionLost,
            attempts: 1,
            source,
        }));
    }
    take_back(&mut steps).await;
    let mut watched = Abandoned::watch(steps);
    let decided = run_delivery(
        &mut watched.steps,
        spec,
        claims,
        body,
        probe,
        in_flight,
        remembered,
        inbox_error,
    )
    .await;
    watched.finished = true;
    decided
}

/// `transaction = "caller"`: runs `body` for one message inside the transaction its caller
/// opened through diesel (a job runner's, holding the job's row): the marker and the body's
/// writes commit with the caller's own, or roll back with them. In a savepoint of that
/// transaction:
///
/// 1. the startup check, then the marker's insert; a marker of this key and consumer that
///    exists (committed — another delivery's uncommitted one is waited for) is a duplicate:
///    back to the savepoint, `Duplicate`, the body not run;
/// 2. the body; `Ok` releases the savepoint — `Processed` means written, for the caller to
///    commit — and `Err` rolls back to it, the caller's transaction going on as it was.
///
/// Nothing is retried here: a deadlock or a serialization failure has ended, or doomed, the
/// caller's whole transaction, which only the caller can run again. No transaction open is
/// refused before anything is written ([`Error::NoTransactionToJoin`]).
pub(crate) async fn drive_joined<S, T, E, B, P, W: Copy>(
    steps: S,
    spec: &'static HandlerSpec,
    key: &MessageKey,
    mut body: B,
    probe: P,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<Decided<T, W>, E>
where
    S: Steps,
    B: Body<S::Conn, Result<T, E>>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
{
    // One attempt, as the other modes report theirs.
    let failed = |steps: &mut S, source: DieselError| {
        let class = Some(classify(&source, &spec.schema));
        discard(steps, class.as_ref());
        give_up(
            spec,
            Failure::<T, E>::Database(source),
            class,
            1,
            inbox_error,
        )
    };
    let mut joined = Joined { steps, open: false };
    let steps = &mut joined.steps;
    if steps.depth() == 0 {
        tracing::error!(
            outcome = "misuse",
            "the handler joins its caller's transaction, and none is open"
        );
        telemetry::failed(spec, ErrorClass::Misuse.label());
        return Err(inbox_error(Error::NoTransactionToJoin));
    }
    // A session the remembered check has not seen (a new connection where a checked one
    // was; MariaDB's session mark missing), or a table changed since: checked again, once.
    let mut rechecked = false;
    let claimed = loop {
        let steps = &mut joined.steps;
        if let Err(e) = steps.savepoint().await {
            return Err(failed(steps, e));
        }
        joined.open = true;
        let steps = &mut joined.steps;
        let checked = match rechecked {
            false => schema_checked(steps, spec, false, inbox_error).await,
            true => rechecked_layout(steps, spec, false, inbox_error).await,
        };
        let (layout, run) = match checked.and_then(|(layout, run)| {
            kept_columns(run, layout, &remembered, inbox_error).map(|()| (layout, run))
        }) {
            Ok(checked) => checked,
            Err(e) => {
                roll_back(steps).await;
                joined.open = false;
                return Err(e);
            }
        };
        match steps.claim(run, key, layout).await {
            // The request's fingerprint, with the marker (a stored result writes both after
            // the body).
            Ok(true) => match (remembered.fingerprint, &remembered.store) {
                (Some(fingerprint), None) => {
                    if let Err(e) = steps.write_fingerprint(run, key, fingerprint).await {
                        roll_back(steps).await;
                        joined.open = false;
                        break Err(e);
                    }
                    break Ok((layout, run, true));
                }
                _ => break Ok((layout, run, true)),
            },
            // The insert met a marker: its own evidence, read again at what committed last.
            Ok(false) => {
                roll_back(steps).await;
                joined.open = false;
                let steps = &mut joined.steps;
                break match steps.markers_present(run, &[key.stored_id()], true).await {
                    Ok(found) => evidence(run, found, 1).map(|()| (layout, run, false)),
                    Err(e) => Err(e),
                };
            }
            Err(e) => {
                roll_back(steps).await;
                joined.open = false;
                if !rechecked && needs_recheck(&e, spec) {
                    rechecked = true;
                    continue;
                }
                break Err(refused_marker(e, &spec.schema));
            }
        }
    };
    let steps = &mut joined.steps;
    let (layout, run) = match claimed {
        Ok((layout, run, true)) => (layout, run),
        Ok((_, run, false)) => {
            joined.open = false;
            telemetry::attempt(1);
            tracing::info!(outcome = "duplicate", "marker exists; body not run");
            // What the marker kept, read in the caller's transaction at what committed last.
            return kept_duplicate(steps, run, Some(key), remembered, true, inbox_error).await;
        }
        Err(e) => {
            joined.open = false;
            return Err(failed(steps, e));
        }
    };
    let net = steps.net();
    let origin = Some(Claims::origin(key, spec));
    let mut result = match run_body(spec, &mut body, steps.conn(), origin, net).await {
        Ok(result) => result,
        Err(Panicked(payload)) if is_stopped(&*payload) => {
            roll_back(steps).await;
            joined.open = false;
            return Err(failed(
                steps,
                DieselError::QueryBuilderError(Box::new(stopped(payload))),
            ));
        }
        Err(Panicked(payload)) => {
            roll_back(steps).await;
            joined.open = false;
            tracing::error!(
                outcome = "panicked",
                "the handler's body panicked; rolled back to its savepoint"
            );
            std::panic::resume_unwind(payload)
        }
    };
    if result.is_err() {
        roll_back(steps).await;
        joined.open = false;
        let class = probe(&mut result, 1, None);
        discard(steps, class.as_ref());
        return Err(give_up(
            spec,
            Failure::Body(result, false),
            class,
            1,
            inbox_error,
        ));
    }
    // The result, stored with the marker in the savepoint.
    if let (Ok(value), Some(store)) = (&result, remembered.store) {
        let written = match store.encode(value, layout) {
            Ok(text) => {
                steps
                    .store_result(run, key, text, remembered.fingerprint, None)
                    .await
            }
            Err(problem) => Err(DieselError::QueryBuilderError(Box::new(problem))),
        };
        if let Err(e) = written {
            roll_back(steps).await;
            joined.open = false;
            return Err(failed(steps, e));
        }
    }
    let depth = steps.depth();
    let released = steps.release().await;
    if let Err(e) = released {
        // The savepoint could not be released (a transaction aborted by an error the body
        // swallowed, or one the body ended): where the manager still counts it, back to it —
        // the caller's transaction as it was before the handler; where it does not, the
        // manager is put in error, so that the caller's commit is refused rather than
        // answered for a transaction that is not what the caller thinks.
        if steps.depth() == depth {
            roll_back(steps).await;
        } else {
            steps.abandon();
        }
        joined.open = false;
        return Err(failed(steps, e));
    }
    joined.open = false;
    telemetry::attempt(1);
    tracing::debug!(
        outcome = "processed",
        "written with its marker, for the caller to commit"
    );
    // The work is in the caller's transaction, not committed: the caller's commit is the
    // handler's (`AfterCommit` is the caller's own point, after it).
    crash_point!(BeforeCommit);
    Ok(Decided::Processed(
        result.ok().expect("checked by `is_err`"),
    ))
}

/// A delivery in its caller's transaction ([`drive_joined`]). Dropped with its savepoint
/// open — an async handler's future cancelled mid-way — it puts the connection's
/// transaction manager in error ([`Steps::abandon`]): diesel's manager would otherwise
/// count the savepoint as the caller's transaction, and the caller's commit would release
/// the savepoint and leave the transaction open, committing nothing while answering `Ok`.
/// Refused instead (`BrokenTransactionManager`): the caller's transaction is lost, loudly.
struct Joined<S: Steps> {
    steps: S,
    open: bool,
}

impl<S: Steps> Drop for Joined<S> {
    fn drop(&mut self) {
        if self.open && !std::thread::panicking() {
            self.steps.abandon();
        }
    }
}

/// A delivery on a connection whose handler can be cancelled mid-way: an async handler's
/// future dropped (a `tokio::time::timeout`, a `select!`) takes no step after the one it was
/// dropped at, and diesel-async keeps the transaction open on the connection. Dropped
/// unfinished with the runtime's transaction open, the watch puts the connection's
/// transaction manager in error ([`Steps::abandon`]) — the application's own `transaction`
/// or `rollback_transaction` on it is refused, where it would have nested a savepoint in the
/// dropped transaction (committing nothing) or, on MariaDB, ended it with the session's
/// `autocommit` still off (committing nothing after it) — and remembers the connection (by
/// [`Steps::address`]). The next delivery on that connection rolls the transaction back —
/// nothing of it was committed — puts back what the handler set for the session, and goes
/// on ([`recover`]). A pool's connection is not handed out again with a transaction open
/// (diesel-async's pools check): this serves a connection the application keeps.
pub(crate) struct Abandoned<S: Steps> {
    steps: S,
    address: usize,
    /// A transaction was open when the delivery began: the caller's, never the runtime's to
    /// end (the delivery is refused, `CalledInsideTransaction`).
    callers: bool,
    finished: bool,
}

/// The connections a cancelled handler left a transaction open on, each with whether its
/// manager was put in error: the latest [`ABANDONED_MAX`], each forgotten when a delivery
/// runs on it.
static ABANDONED: std::sync::Mutex<Vec<(usize, bool)>> = std::sync::Mutex::new(Vec::new());

/// How many connections [`ABANDONED`] remembers.
const ABANDONED_MAX: usize = 1024;

impl<S: Steps> Abandoned<S> {
    fn watch(mut steps: S) -> Self {
        let (address, callers) = match S::CANCELLABLE {
            true => (steps.address(), steps.in_transaction()),
            false => (0, false),
        };
        Self {
            steps,
            address,
            callers,
            finished: false,
        }
    }
}

impl<S: Steps> Drop for Abandoned<S> {
    fn drop(&mut self) {
        // A panic has rolled the transaction back before it went on (`run_body`): only a
        // future dropped mid-way leaves one open.
        if !S::CANCELLABLE || self.finished || std::thread::panicking() {
            return;
        }
        let marked = !self.callers && self.steps.abandon();
        let mut abandoned = ABANDONED.lock().unwrap_or_else(|e| e.into_inner());
        abandoned.retain(|(at, _)| *at != self.address);
        if abandoned.len() == ABANDONED_MAX {
            abandoned.remove(0);
        }
        abandoned.push((self.address, marked));
    }
}

/// Connections [`discard`] put in error, by their [`Steps::address`]: bounded, as the
/// checks remembered are.
static DISCARDED: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// A delivery that failed with a class whose action is a new connection
/// ([`Action::Reconnect`](inbox_core::Action::Reconnect): the session lost, read-only — a
/// standby, or a primary demoted by a failover, whose open sessions stay —, a prepared
/// statement lost under it): the connection's transaction manager is put in error. r2d2,
/// deadpool and bb8 each ask diesel whether a connection is broken before they hand it
/// out again, and discard this one; the pool's next connection is a new session, which a
/// failover-aware URL (`target_session_attrs=read-write`) takes to the writer — where the
/// same session, handed to every redelivery, would fail each as it failed the first until the
/// broker's delivery limit dead-lettered the message. In the caller's transaction
/// (`transaction = "caller"`), after the handler's savepoint is rolled back: the caller's own
/// rollback is then refused by diesel (`BrokenTransactionManager`, and the caller gets its
/// error back), and the pool's discard, closing the session, ends that transaction.
fn discard<S: Steps>(steps: &mut S, class: Option<&ErrorClass>) {
    if class.map(ErrorClass::action) != Some(inbox_core::Action::Reconnect) {
        return;
    }
    steps.discard();
    let address = steps.address();
    let mut discarded = DISCARDED.lock().unwrap_or_else(|e| e.into_inner());
    if !discarded.contains(&address) {
        if discarded.len() == CHECKED_MAX {
            discarded.clear();
        }
        discarded.push(address);
    }
}

/// Before a delivery: a connection [`discard`] put in error and handed to a handler again —
/// used without a pool, whose owner did not drop it — is taken back as it is: what is open
/// on the session is rolled back (the caller's transaction a joined handler failed in, which
/// the manager in error did not roll back), and the manager is told that no transaction is
/// open; the session, if it is still lost or read-only, says so again. Free where the
/// manager is not in error.
async fn take_back<S: Steps>(steps: &mut S) {
    if !steps.in_error() {
        return;
    }
    let address = steps.address();
    let taken = {
        let mut discarded = DISCARDED.lock().unwrap_or_else(|e| e.into_inner());
        discarded
            .iter()
            .position(|&a| a == address)
            .map(|at| discarded.swap_remove(at))
    };
    if taken.is_some() {
        steps.discard_foreign().await;
    }
}

/// Rolls back the transaction a cancelled handler left open on this connection, if it did
/// ([`Abandoned`]). A handler cancelled in the middle of a statement can leave the
/// connection's protocol where no answer can be read: a rollback that fails is the
/// connection's end (`ConnectionLost`: a new connection), never a failure of the message.
async fn recover<S: Steps>(steps: &mut S) -> QueryResult<()> {
    let address = steps.address();
    let left = {
        let abandoned = ABANDONED.lock().unwrap_or_else(|e| e.into_inner());
        abandoned
            .iter()
            .find(|(at, _)| *at == address)
            .map(|(_, marked)| *marked)
    };
    let Some(marked) = left else {
        return Ok(());
    };
    // Put in error when the handler was dropped, and still so (a pool's new connection where
    // the dropped one was is not; a transaction open on a connection whose delivery left it
    // none is the caller's): the rollback is sent as it is, and the manager counts none open
    // only once it is done — dropped or failed before, the connection is still remembered,
    // and still refuses the application's transactions.
    if marked && steps.in_error() {
        tracing::warn!(
            "a handler on this connection was cancelled inside its transaction; rolling that \
             transaction back"
        );
        if let Err(e) = steps.roll_back_abandoned().await {
            tracing::warn!(error = %e, "rolling back the cancelled handler's transaction failed; the connection must go");
            return Err(e);
        }
        steps.forget_transaction();
    }
    ABANDONED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(at, _)| *at != address);
    // One of the manager's own statements (`BEGIN`, `COMMIT`, `ROLLBACK`) cut off in the
    // middle: answers may be pending on the connection, and nothing read on it can be
    // trusted. A new connection. (A connection that is neither broken nor in a transaction
    // is taken as it is: a new one a pool made where the cancelled one was looks the same.
    // One cut off in the middle of another statement shows it on the next: a connection
    // error.)
    if steps.broken() {
        tracing::warn!(
            "a handler on this connection was cancelled in the middle of a statement; the \
             connection must go"
        );
        return Err(diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::ClosedConnection,
            Box::new(
                "connection closed: a handler was cancelled in the middle of a statement on it"
                    .to_owned(),
            ),
        ));
    }
    Ok(())
}

#[allow(
    clippy::too_many_arguments,
    reason = "what the handler's expansion hands on, each its own argument"
)]
async fn run_delivery<S, K, T, E, B, P, W: Copy>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    claims: &K,
    mut body: B,
    probe: P,
    in_flight: Option<W>,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<Decided<T, W>, E>
where
    S: Steps,
    K: Claims,
    B: Body<S::Conn, Result<T, E>>,
    P: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>,
{
    let (mut layout, mut run) = schema_checked(steps, spec, false, inbox_error).await?;
    kept_columns(spec, layout, &remembered, inbox_error)?;
    if spec.precheck && claims.completed_before(steps, run, layout).await {
        tracing::info!(
            outcome = "duplicate",
            "completed marker found before the transaction"
        );
        return kept_duplicate(steps, run, claims.key(), remembered, false, inbox_error).await;
    }
    let (mut retries, mut rechecked, mut uncached) = (0, false, false);
    // Attempts whose body swallowed an error that ended the transaction, nothing committed.
    let mut swallows = 0u32;
    loop {
        let started = Instant::now();
        let attempted = attempt(steps, run, layout, claims, &mut body, in_flight, remembered).await;
        // A commit or a duplicate's rollback put back what `begin` set, in its round trip; a
        // transaction the caller opened refused `begin` before it set anything, and is not
        // the runtime's to end.
        if !matches!(attempted, Ok(Decided::Processed(_) | Decided::Duplicate(_)))
            && !matches!(&attempted, Err(Failure::Database(e)) if crate::backends::refused_inside(e))
        {
            end(steps, run, layout).await;
        }
        let mut failure = match attempted {
            Ok(decided) => {
                telemetry::attempt(retries + 1);
                match &decided {
                    Decided::Processed(_) => {
                        tracing::debug!(outcome = "processed", "committed with its marker")
                    }
                    Decided::Duplicate(_) => {
                        tracing::info!(outcome = "duplicate", "marker exists; body not run");
                        return kept_duplicate(
                            steps,
                            run,
                            claims.key(),
                            remembered,
                            false,
                            inbox_error,
                        )
                        .await;
                    }
                    Decided::InFlight(_) => tracing::info!(
                        outcome = "in_flight",
                        "another delivery holds the marker; body not run"
                    ),
                }
                return Ok(decided);
            }
            Err(failure) => failure,
        };
        if let Failure::Database(e) = &failure
            && !rechecked
            && needs_recheck(e, spec)
        {
            rechecked = true;
            (layout, run) = rechecked_layout(steps, spec, false, inbox_error).await?;
            continue;
        }
        let class = match &mut failure {
            // The body's error learns how many attempts were made, as the runtime's own do.
            Failure::Body(result, ended) => {
                let read = probe(result, retries + 1, None);
                let decided = deadlock_if_ended(read.clone(), *ended);
                // The body's error learns what the runtime decided it is, where its type can
                // keep it: read again after the runtime gives up, it says the same.
                if decided != read {
                    probe(result, retries + 1, decided.clone());
                }
                decided
            }
            Failure::Database(e) => Some(classify(e, &spec.schema)),
            Failure::Aborted => Some(ErrorClass::TransactionAborted),
        };
        // A prepared statement lost or clashing on the server: behind a transaction-mode
        // pooler each transaction may run on another server connection, which other clients'
        // statements of diesel's names share — a fresh connection meets the same, for ever.
        // The connection stops caching statements (diesel's cache: unnamed statements then),
        // once per delivery, and the attempt runs again.
        if class == Some(ErrorClass::StatementLost) && !uncached {
            uncached = true;
            stop_caching(steps);
            continue;
        }
        if class == Some(ErrorClass::Schema) {
            forget_check(steps, spec);
        }
        if class == Some(ErrorClass::ConnectionLost)
            && let Some(error) = idle_bound_hint(spec, started.elapsed())
        {
            let failure: Failure<T, E> =
                Failure::Database(DieselError::QueryBuilderError(Box::new(error)));
            discard(steps, class.as_ref());
            return Err(give_up(spec, failure, class, retries + 1, inbox_error));
        }
        // The body failed after the server had ended its transaction (MariaDB): an error it
        // swallowed ended it, and what failed is a consequence — a row the rollback took
        // away, a write in another transaction. A transient failure, whatever it reads as.
        let ended_under_body = matches!(&failure, Failure::Body(_, true))
            && !matches!(
                class,
                Some(ErrorClass::Transient(_) | ErrorClass::ConnectionLost)
            );
        // The body swallowed an error that ended its transaction — often a deadlock, a
        // serialization failure, a lock timeout, which a fresh transaction gets past:
        // retried as those are, where nothing of it committed, before it is reported.
        let swallowed = match &class {
            Some(class) if *class == ErrorClass::TransactionAborted || ended_under_body => {
                nothing_committed(steps, spec, layout, claims).await
            }
            _ => false,
        };
        // Ended under the body with something of it committed (MariaDB: the marker, by a
        // statement of the body that commits — `BEGIN`, DDL — before it failed): a retry would
        // meet that marker and answer a duplicate for work the body never finished. Reported
        // as a transaction the body ended. (A transient error the body returned is retried as
        // it is: a deadlock ends the transaction too, and a copy of the message may have
        // committed its marker since — the retry answers `Duplicate`, rightly.)
        if ended_under_body && class.is_some() && !swallowed {
            let failure: Failure<T, E> = ended_in_body();
            let class = Some(ErrorClass::Misuse);
            return Err(give_up(spec, failure, class, retries + 1, inbox_error));
        }
        let decision = match &class {
            Some(_) if swallowed => {
                swallows += 1;
                spec.retry.decide(&DEADLOCK, retries, fastrand::f64())
            }
            Some(class) => spec.retry.decide(class, retries, fastrand::f64()),
            None => RetryDecision::GiveUp,
        };
        // Given up on a swallowed error that no fresh transaction was tried against (the
        // retries spent on other failures, or none allowed): the redelivery is that fresh
        // transaction — a transient failure, as the deadlock it most often is, not an alert.
        // One that came back in every fresh transaction tried is the body's own: reported as
        // it is (`TransactionAborted`, an alert; the body's error).
        if swallowed && swallows == 1 && matches!(decision, RetryDecision::GiveUp) {
            failure = match failure {
                Failure::Aborted => {
                    Failure::Database(DieselError::QueryBuilderError(Box::new(Error::Database {
                        class: DEADLOCK,
                        attempts: retries + 1,
                        source: DieselError::QueryBuilderError(Box::new(
                            Error::TransactionAborted {
                                attempts: retries + 1,
                            },
                        )),
                    })))
                }
                Failure::Body(mut result, ended) => {
                    probe(&mut result, retries + 1, Some(DEADLOCK));
                    Failure::Body(result, ended)
                }
                other => other,
            };
            tracing::error!(
                "the body swallowed a database error that ended its transaction, and went on; \
                 nothing of it committed: reported as a transient failure, for the \
                 redelivery to run it again"
            );
            return Err(give_up(
                spec,
                failure,
                Some(DEADLOCK),
                retries + 1,
                inbox_error,
            ));
        }
        match decision {
            RetryDecision::Retry { after } => {
                retries += 1;
                telemetry::retried(spec, class.as_ref().unwrap_or(&ErrorClass::Other));
                tracing::warn!(
                    class = %class.unwrap_or(ErrorClass::Other),
                    retry = retries,
                    after_ms = after.as_millis() as u64,
                    "transient failure; retrying in a fresh transaction"
                );
                steps.pause(after).await;
            }
            RetryDecision::GiveUp => {
                discard(steps, class.as_ref());
                return Err(give_up(spec, failure, class, retries + 1, inbox_error));
            }
        }
    }
}

/// A session lost after its attempt ran longer than the handler's idle bound: most likely the
/// server ended it for sitting idle in the transaction (PostgreSQL
/// `idle_in_transaction_session_timeout`, MariaDB `idle_transaction_timeout`) while the body
/// awaited something else than the database — which the error itself ("connection closed",
/// "server has gone away") does not say. Logged, and returned as the error that names the
/// setting ([`Error::IdleBoundExceeded`]).
fn idle_bound_hint(spec: &HandlerSpec, ran: Duration) -> Option<Error> {
    let bound = Duration::from_millis(u64::from(spec.idle_in_transaction_ms));
    if spec.idle_in_transaction_ms > 0 && ran >= bound {
        tracing::error!(
            ran_ms = ran.as_millis() as u64,
            idle_in_transaction_ms = spec.idle_in_transaction_ms,
            "the connection was lost after the attempt ran past the handler's idle bound: the \
             server ends a session idle in its transaction that long; a body that awaits \
             something else than the database for longer needs a larger \
             `idle_in_transaction_ms`"
        );
        return Some(Error::IdleBoundExceeded {
            idle_in_transaction_ms: spec.idle_in_transaction_ms,
            ran_ms: u64::try_from(ran.as_millis()).unwrap_or(u64::MAX),
        });
    }
    None
}

/// Refuses a handler that stores its results on a table without the `result` column, or
/// one with a fingerprint on a table without `fingerprint`, before anything is written.
fn kept_columns<T, E>(
    spec: &'static HandlerSpec,
    layout: Layout,
    remembered: &Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<(), E> {
    let mut needs = crate::schema::Needs::default();
    if remembered.store.is_some() {
        needs = needs.result();
    }
    if remembered.fingerprint.is_some() {
        needs = needs.fingerprint();
    }
    crate::schema::has_what_is_needed(&spec.schema, layout, needs).map_err(|problem| {
        tracing::error!(error = %problem, "the inbox table has no column the handler writes");
        telemetry::failed(spec, ErrorClass::Schema.label());
        inbox_error(Error::Schema(problem))
    })
}

/// A duplicate of one message (`key`), with what its marker kept, for a handler that keeps
/// something ([`Remembered`]): read after the delivery's own transaction ended, from the
/// committed marker. A marker of a request with another fingerprint is
/// [`Error::KeyReused`] — on the conflict path of a race as on a later delivery: the loser
/// waited for the winner's commit, and reads its marker.
async fn kept_duplicate<S: Steps, T, E, W>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    key: Option<&MessageKey>,
    remembered: Remembered<T>,
    latest: bool,
    inbox_error: fn(Error) -> E,
) -> Result<Decided<T, W>, E> {
    let Some(key) = key.filter(|_| remembered.reads()) else {
        return Ok(Decided::Duplicate(None));
    };
    let kept = read_kept(steps, spec, key, &remembered, latest, inbox_error).await?;
    stored_value(spec, key, kept, remembered, inbox_error).map(Decided::Duplicate)
}

/// What `key`'s marker kept, as the handler needs it.
async fn read_kept<S: Steps, T, E>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    key: &MessageKey,
    remembered: &Remembered<T>,
    latest: bool,
    inbox_error: fn(Error) -> E,
) -> Result<Kept, E> {
    let columns = (remembered.store.is_some(), remembered.fingerprint.is_some());
    steps
        .read_kept(spec, key, columns, latest)
        .await
        .map_err(|source| {
            let error = Error::Database {
                class: classify(&source, &spec.schema),
                attempts: 1,
                source,
            };
            tracing::error!(error = %error, "the duplicate's marker could not be read");
            telemetry::failed(spec, error.class().label());
            inbox_error(error)
        })
}

/// The value a marker stored, as the handler's type; [`Error::KeyReused`] when it was kept
/// for a request with another fingerprint.
fn stored_value<T, E>(
    spec: &'static HandlerSpec,
    key: &MessageKey,
    kept: Kept,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<Option<T>, E> {
    let error = if kept.reused_by(remembered.fingerprint) {
        tracing::warn!(
            outcome = "key_reused",
            "the key's marker is of a request with another fingerprint; body not run"
        );
        Error::KeyReused {
            consumer: spec.consumer.clone(),
            key: key.clone(),
        }
    } else {
        match (remembered.store, kept.result) {
            (Some(store), Some(text)) => match store.decode(&text) {
                Ok(value) => return Ok(Some(value)),
                Err(e) => {
                    tracing::error!(error = %e, "the duplicate's stored result could not be read");
                    e
                }
            },
            _ => return Ok(None),
        }
    };
    telemetry::failed(spec, error.class().label());
    Err(inbox_error(error))
}

/// Checks, the first time a connection runs a handler, that the handler's inbox table can
/// recognise a duplicate, and reads which optional columns it has (its [`Layout`]): on MySQL and MariaDB a plain `INSERT` of the marker succeeds twice
/// on a table whose unique index was dropped or made non-unique, and the body would run
/// twice; PostgreSQL and SQLite refuse `ON CONFLICT` without the index, but with an error that
/// does not say what to fix. The check reads the catalog, outside any transaction; it is
/// remembered per thread for the connection (by its [`identity`]) and the handler, so later
/// deliveries pay a lookup in a short list — until a statement fails for a missing table or
/// column ([`forget_check`]), when the next delivery reads the catalog again. Returns the
/// layout and the settings the handler's statements run with ([`pinned`]), both remembered
/// with the check.
async fn schema_checked<S: Steps, E>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    claim: bool,
    inbox_error: fn(Error) -> E,
) -> Result<(Layout, &'static HandlerSpec), E> {
    let key = check_key(steps, spec);
    let known = CHECKED.with_borrow(|checked| {
        checked
            .iter()
            .find(|(checked, _, _)| *checked == key)
            .map(|&(_, layout, run)| (layout, run))
    });
    if let Some(known) = known {
        return Ok(known);
    }
    let verified = match steps.verify(spec, claim).await {
        // The check's own statements met a transaction-mode pooler's shared server
        // connection (diesel's statement names taken or missing there): uncached, once more.
        Err(SchemaError::Database(e))
            if classify(&e, &spec.schema) == ErrorClass::StatementLost =>
        {
            steps.stop_caching_statements();
            steps.verify(spec, claim).await
        }
        verified => verified,
    };
    match verified {
        Ok(layout) => {
            tracing::debug!(
                target: "inbox::check",
                table = spec.schema.table(),
                consumer = %spec.consumer,
                "checked the inbox table on this connection"
            );
            let run = pinned(spec, layout);
            CHECKED.with_borrow_mut(|checked| {
                // Bounded: connections come and go in a pool; forgetting them all costs one
                // check each of those still in use.
                if checked.len() == CHECKED_MAX {
                    checked.clear();
                }
                checked.push((key, layout, run));
            });
            Ok((layout, run))
        }
        Err(SchemaError::Database(source)) => {
            // The check's own reads failed for a reason the runtime cannot read (a session
            // setting its catalog queries meet, `max_join_size`): nothing about the message —
            // an alert, never a dead letter.
            let class = match classify(&source, &spec.schema) {
                ErrorClass::Other | ErrorClass::UniqueViolation { .. } => ErrorClass::Schema,
                class => class,
            };
            // Outside a transaction only: a joined handler's check runs inside the caller's,
            // whose own rollback must still run.
            if steps.depth() == 0 {
                discard(steps, Some(&class));
            }
            telemetry::failed(spec, class.label());
            Err(inbox_error(Error::Database {
                class,
                attempts: 1,
                source,
            }))
        }
        Err(problem) => {
            tracing::error!(error = %problem, "the inbox table or its session is not as the runtime needs it; refusing to process");
            let error = Error::Schema(problem);
            telemetry::failed(spec, error.class().label());
            Err(inbox_error(error))
        }
    }
}

/// The handler's settings with its table named as the check found it ([`Layout::pinned`]):
/// what its statements run with. The check itself, and what is remembered of it, go by the
/// handler's own settings. Looked up once per check ([`schema_checked`] remembers it), not
/// per delivery.
fn pinned(spec: &'static HandlerSpec, layout: Layout) -> &'static HandlerSpec {
    type Pinned = (usize, &'static str, &'static HandlerSpec);
    static PINNED: std::sync::Mutex<Vec<Pinned>> = std::sync::Mutex::new(Vec::new());
    let Some(table) = layout.pinned else {
        return spec;
    };
    let address = std::ptr::from_ref(spec) as usize;
    let mut pinned = PINNED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, _, found)) = pinned
        .iter()
        .find(|&&(at, name, _)| at == address && name == table)
    {
        return found;
    }
    // One per handler and table, for the life of the process.
    let found: &'static HandlerSpec = Box::leak(Box::new(HandlerSpec {
        schema: inbox_core::InboxSchema::new_unchecked(table, spec.schema.constraint()),
        ..spec.clone()
    }));
    pinned.push((address, table, found));
    found
}

/// The connection (by its [`identity`]) and the handler a check is remembered for.
fn check_key<S: Steps>(steps: &mut S, spec: &HandlerSpec) -> (usize, usize) {
    (steps.identity(), std::ptr::from_ref(spec) as usize)
}

/// What a check is remembered by for a connection of `backend` at `at`, `size` bytes long,
/// whose diesel instrumentation is at `instrumentation`. MySQL and MariaDB: nothing (`0`),
/// the check is remembered per handler — the server refuses the marker of a session that was
/// not checked for the statements it is given ([`SessionMark`](crate::dialect::layout::SessionMark)),
/// and that session is checked then. PostgreSQL and SQLite: the instrumentation's address where it lives
/// outside the connection's own bytes — on the heap, where it stays while the connection
/// moves (diesel-async's `AsyncPgConnection` and `SyncConnectionWrapper` keep it behind an
/// `Arc`; any connection given one with `set_instrumentation`, or by
/// `set_default_instrumentation`, such as the [`Net`](crate::tripwire::net::Net), keeps it
/// in a `Box`) — and otherwise the connection's own address. A pool moves its connections
/// in and out of its idle list, so a connection's address changes with each checkout; keyed
/// by it, the check ran again on most deliveries of a busy pool. An address, a heap one like
/// a connection's, can be taken by a connection to another database after the old one is
/// gone: what is remembered here only names the statements to send, and the server decides
/// whether they may run — each marker insert requires the database and table the check read
/// ([`DatabaseMark`](crate::dialect::layout::DatabaseMark)), and the connection is checked
/// where they are not this session's.
pub(crate) fn identity(
    backend: crate::dialect::Backend,
    at: usize,
    size: usize,
    instrumentation: usize,
) -> usize {
    if backend == crate::dialect::Backend::Mysql {
        return 0;
    }
    match (at..=at.saturating_add(size)).contains(&instrumentation) {
        true => at,
        false => instrumentation,
    }
}

/// Forgets the check of this connection and handler: a statement failed for a missing table
/// or column, so the table changed since (a `key_text` column dropped, the table recreated),
/// and the next delivery reads the catalog again rather than writing what it remembered.
fn forget_check<S: Steps>(steps: &mut S, spec: &HandlerSpec) {
    let key = check_key(steps, spec);
    CHECKED.with_borrow_mut(|checked| checked.retain(|(checked, _, _)| *checked != key));
}

/// Whether a failed statement of the handler's own (begin, claim, commit) says that the table
/// is not what this connection's check found — a column or the unique index gone, the table
/// recreated — or that the server session was not checked for the statements it was given
/// ([`SessionMark`](crate::dialect::layout::SessionMark)), or is an error nothing recognises:
/// on a session the check has not seen, the server speaks whatever language the session
/// was given, not yet English ([`check_table`](crate::schema::check::check_table)); the
/// check sets that, and the next attempt's error, if any, reads as what it is. Once per
/// delivery.
fn needs_recheck(error: &DieselError, spec: &HandlerSpec) -> bool {
    // The runtime's own refusal of a stored result (over its limit, not JSON), not the
    // server's: the same again on any session.
    if let DieselError::QueryBuilderError(inner) = error
        && matches!(inner.downcast_ref::<Error>(), Some(Error::StoredResult(_)))
    {
        return false;
    }
    if crate::dialect::layout::unchecked_session(error) {
        // Every session a MySQL pool opens, once: not news.
        tracing::debug!("this session has not checked the inbox table; checking it");
        return true;
    }
    match classify(error, &spec.schema) {
        ErrorClass::Schema => {
            tracing::info!("a statement found the inbox table not as checked; checking it again");
            true
        }
        ErrorClass::Other => {
            tracing::info!(error = %error, "an error of the runtime's own statement not recognised; checking the session");
            true
        }
        _ => false,
    }
}

/// Checks the table again on this connection, once per delivery: the attempt then runs
/// again with what the check finds, or the delivery fails with `Error::Schema`.
async fn rechecked_layout<S: Steps, E>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    claim: bool,
    inbox_error: fn(Error) -> E,
) -> Result<(Layout, &'static HandlerSpec), E> {
    forget_check(steps, spec);
    schema_checked(steps, spec, claim, inbox_error).await
}

/// A check remembered: the connection and handler, the layout found, the settings the
/// handler's statements run with.
type Checked = ((usize, usize), Layout, &'static HandlerSpec);

/// How many (connection, handler) pairs a thread remembers as checked.
const CHECKED_MAX: usize = 256;

thread_local! {
    static CHECKED: std::cell::RefCell<Vec<Checked>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The outcome of a single message, in the handler's outcome type.
pub(crate) fn outcome<T, A: HandlerOutcome<T>>(
    spec: &'static HandlerSpec,
    key: MessageKey,
    decided: Decided<T, A::InFlightWitness>,
) -> A {
    let consumer = spec.consumer.clone();
    match decided {
        Decided::Processed(value) => A::from_processed(value),
        Decided::Duplicate(stored) => A::from_duplicate(consumer, key, stored),
        Decided::InFlight(witness) => A::from_in_flight(consumer, key, None, witness),
    }
}

/// The outcome of a batch of `len` messages: the body's value, if it ran, and which
/// positions it was given.
pub(crate) fn batch_outcome<T>(len: usize, value: Option<T>, new: &NewMessages) -> BatchOutcome<T> {
    let processed = match value {
        Some(_) => new.positions(),
        None => Vec::new(),
    };
    // `processed` is sorted: the positions in the batch's order.
    let duplicates = (0..len)
        .filter(|at| processed.binary_search(at).is_err())
        .collect();
    BatchOutcome {
        value,
        processed,
        duplicates,
    }
}

/// What a transaction-mode handler claims: one message's marker, or a batch's.
pub(crate) trait Claims {
    /// Inserts the markers that do not exist yet, inside the open transaction, with the
    /// columns `layout` has; `false` when none was new.
    async fn claim<S: Steps>(
        &self,
        steps: &mut S,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> QueryResult<bool>;

    /// Opens the transaction and claims in it: one round trip where the connection sends
    /// both together ([`Steps::begin_with_claim`]). The outer error is the transaction's
    /// start failing, before any claim.
    async fn begin_and_claim<S: Steps>(
        &self,
        steps: &mut S,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> QueryResult<QueryResult<bool>> {
        steps.begin(spec, layout).await?;
        Ok(self.claim(steps, spec, layout).await)
    }

    /// The origin of the messages the body publishes to the outbox: the keys and the
    /// consumer ([`crate::outbox`]).
    fn origin(&self, spec: &'static HandlerSpec) -> crate::outbox::Seed;

    /// The message's key, for one message; `None` for a batch.
    fn key(&self) -> Option<&MessageKey> {
        None
    }

    /// `precheck = true`: whether the work was completed before, read outside any
    /// transaction. A failed read is not an answer: the transaction then decides.
    async fn completed_before<S: Steps>(
        &self,
        _steps: &mut S,
        _spec: &'static HandlerSpec,
        _layout: Layout,
    ) -> bool {
        false
    }
}

impl Claims for MessageKey {
    fn origin(&self, spec: &'static HandlerSpec) -> crate::outbox::Seed {
        crate::outbox::Seed::Key(self.stored_id(), spec.consumer.as_str())
    }

    fn key(&self) -> Option<&MessageKey> {
        Some(self)
    }

    /// Where the connection sends `BEGIN` and the marker together, its duplicate is the
    /// violation of an index of the inbox's name — and confirmed by reading the marker of
    /// this key and consumer once the transaction is rolled back ([`confirm_duplicates`]):
    /// an index redefined under that name since the check (`UNIQUE (message_id)`, say, on a
    /// live MariaDB) refuses a new message of another consumer with the same error, and
    /// MariaDB names no table beside the index. A duplicate costs that one read.
    async fn begin_and_claim<S: Steps>(
        &self,
        steps: &mut S,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> QueryResult<QueryResult<bool>> {
        if let Some(claimed) = steps.begin_with_claim(spec, self, layout).await {
            return Ok(match claimed {
                // Another unique index refused the marker: on a partitioned inbox, the
                // partition's own. A duplicate only where the marker is there once this
                // transaction is rolled back (the other one committed: the insert waited).
                Err(e)
                    if matches!(
                        classify(&e, &spec.schema),
                        ErrorClass::UniqueViolation { .. }
                    ) =>
                {
                    roll_back(steps).await;
                    match steps
                        .markers_present(spec, &[self.stored_id()], false)
                        .await
                    {
                        Ok(found) if found.present == 1 => evidence(spec, found, 1).map(|()| false),
                        _ => Err(e),
                    }
                }
                Ok(false) => {
                    roll_back(steps).await;
                    confirm_duplicates(steps, spec, &[self.stored_id()])
                        .await
                        .map(|()| false)
                }
                claimed => claimed,
            });
        }
        steps.begin(spec, layout).await?;
        Ok(self.claim(steps, spec, layout).await)
    }

    async fn claim<S: Steps>(
        &self,
        steps: &mut S,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> QueryResult<bool> {
        let claimed = steps.claim(spec, self, layout).await?;
        if !claimed {
            confirm_duplicates(steps, spec, &[self.stored_id()]).await?;
        }
        Ok(claimed)
    }

    async fn completed_before<S: Steps>(
        &self,
        steps: &mut S,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> bool {
        match steps
            .claim_step(
                spec,
                self,
                ClaimStep::Precheck {
                    layout,
                    nowait: spec.in_flight_when_locked,
                },
            )
            .await
        {
            Ok(ClaimAnswer::Read(Some((ClaimState::Completed, ..)))) => true,
            Ok(_) => false,
            Err(e) => {
                tracing::debug!(error = %e, "precheck failed; the transaction decides");
                false
            }
        }
    }
}

/// A batch's markers: the distinct stored ids, in a fixed order (so that two batches with
/// keys in common lock them in the same order and do not deadlock), and where each first
/// appears in the batch.
pub(crate) struct BatchClaims<'n> {
    /// Distinct ids, sorted, with the index of the first message carrying each.
    ids: Vec<(uuid::Uuid, usize)>,
    /// The batch's keys, for their texts on a table with `key_text`.
    keys: &'n [MessageKey],
    /// Where the body finds the messages that are new in this attempt.
    new: &'n NewMessages,
}

impl<'n> BatchClaims<'n> {
    pub(crate) fn new(keys: &'n [MessageKey], new: &'n NewMessages) -> Self {
        let mut ids: Vec<(uuid::Uuid, usize)> = keys
            .iter()
            .enumerate()
            .map(|(at, key)| (key.stored_id(), at))
            .collect();
        // Sorted by id, then by position: the first of equal ids is the first delivered.
        ids.sort_unstable();
        ids.dedup_by_key(|(id, _)| *id);
        Self { ids, keys, new }
    }
}

impl Claims for BatchClaims<'_> {
    fn origin(&self, spec: &'static HandlerSpec) -> crate::outbox::Seed {
        crate::outbox::Seed::Origin(crate::outbox::origin(
            self.ids.iter().map(|&(id, _)| id),
            spec.consumer.as_str(),
        ))
    }

    async fn claim<S: Steps>(
        &self,
        steps: &mut S,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> QueryResult<bool> {
        let ids: Vec<uuid::Uuid> = self.ids.iter().map(|(id, _)| *id).collect();
        let texts: Option<Vec<String>> = layout.key_text.then(|| {
            self.ids
                .iter()
                .map(|&(_, at)| key_text(&self.keys[at]))
                .collect()
        });
        // One statement per chunk, in the transaction and in the ids' order: a server takes
        // only so many bind parameters in one statement (PostgreSQL 65 535, SQLite 32 766;
        // two or three per marker), and a batch past that would fail on every redelivery.
        let mut inserted = Vec::new();
        for (n, chunk) in ids.chunks(MARKERS_PER_STATEMENT).enumerate() {
            let texts = texts.as_deref().map(|texts| {
                let start = n * MARKERS_PER_STATEMENT;
                &texts[start..start + chunk.len()]
            });
            inserted.extend(steps.claim_batch(spec, chunk, texts, layout).await?);
        }
        inserted.sort_unstable();
        let existing: Vec<uuid::Uuid> = ids
            .iter()
            .filter(|id| inserted.binary_search(id).is_err())
            .copied()
            .collect();
        for chunk in existing.chunks(MARKERS_PER_STATEMENT) {
            confirm_duplicates(steps, spec, chunk).await?;
        }
        let mut new: Vec<usize> = self
            .ids
            .iter()
            .filter(|(id, _)| inserted.binary_search(id).is_ok())
            .map(|(_, at)| *at)
            .collect();
        new.sort_unstable();
        let any = !new.is_empty();
        self.new.set(new);
        Ok(any)
    }
}

/// Markers per insert statement of a batch: with three bind parameters each, under a quarter
/// of PostgreSQL's limit, under half of SQLite's.
const MARKERS_PER_STATEMENT: usize = 5_000;

/// The positions of the messages of a batch that are new in the current attempt, written by
/// the runtime before each run of the body and read by the body.
#[derive(Debug, Default)]
pub struct NewMessages(std::sync::Mutex<Vec<usize>>);

impl NewMessages {
    fn set(&self, positions: Vec<usize>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = positions;
    }

    /// The positions, in the batch's order.
    pub fn positions(&self) -> Vec<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The new messages of `all`, in the batch's order.
    pub fn select<'m, T>(&self, all: &'m [T]) -> Vec<&'m T> {
        self.positions().into_iter().map(|at| &all[at]).collect()
    }
}

/// Runs `body` in claim mode: its side effect cannot join a transaction, so the inbox row is
/// claimed and committed before it, and stamped after it.
///
/// 1. claim: insert a live claim (attempt 1) unless a row exists; if one does, read it —
///    completed → `Duplicate`; live → `InFlight`; released by a failed attempt → take it over;
///    expired → report it (`StaleClaim`) when the outcome type can say so (`on_expired =
///    "report"` returns [`StaleClaimOutcome`](inbox_core::StaleClaimOutcome)), else take it over. A takeover is a
///    compare-and-set on the attempt counter: of concurrent deliveries, one wins, the others
///    read the row again and find it live;
/// 2. run the body, outside any transaction;
/// 3. `Ok` → stamp `processed_at` where the counter is still this attempt's: 0 rows means
///    the claim was taken over, and this attempt does not stamp (`Error::ClaimLost`);
///    `Err` → release the claim for a redelivery to retry, return the body's error.
///
/// Transient database errors in steps 1 and 3 are retried as `spec.retry` says; the body is
/// not: the broker's redelivery retries it, after the release.
pub(crate) async fn drive_claim<S, T, E, B, A>(
    mut steps: S,
    spec: &'static HandlerSpec,
    claim: ClaimSpec,
    key: MessageKey,
    mut body: B,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<A, E>
where
    S: Steps,
    B: Body<S::Conn, Result<T, E>>,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let (holding, remembered) =
        match claim_started(&mut steps, spec, claim, &key, remembered, inbox_error).await? {
            Started::Answered(answer) => return Ok(answer),
            Started::Holding(holding, remembered) => (holding, remembered),
        };
    let net = steps.net();
    let ran = run_body(spec, &mut body, steps.conn(), None, net).await;
    claim_finished(&mut steps, spec, holding, key, ran, remembered, inbox_error).await
}

/// What phase 1 of claim mode left: the answer, without a claim (a duplicate, a claim in
/// flight, a stale claim reported), or the claim this delivery holds.
pub(crate) enum Started<A, T> {
    Answered(A),
    Holding(Holding, Remembered<T>),
}

/// The claim a delivery holds while its body runs: its attempt, and the table's layout as
/// the claim found it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holding {
    attempt: u32,
    layout: Layout,
    run: &'static HandlerSpec,
    /// Whether the claim's connection had the net ([`tripwire::net`]).
    netted: bool,
    /// When the claim's lease ends at the latest: its lease from before the claim was sent.
    lease_ends: Instant,
    /// The claim's lease.
    lease_ms: u64,
}

/// Phase 1 of claim mode ([`drive_claim`]): the claim, committed on its own.
pub(crate) async fn claim_started<S, T, E, A>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    claim: ClaimSpec,
    key: &MessageKey,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<Started<A, T>, E>
where
    S: Steps,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    tracing::debug!(key = ?key, "handling message");
    // A lease given as an expression (a setting), checked before anything runs; a literal
    // was checked at compile time.
    if !claim.valid() {
        return Err(inbox_error(Error::InvalidLease {
            lease_ms: claim.lease_ms,
        }));
    }
    take_back(steps).await;
    let (mut layout, mut run) = schema_checked(steps, spec, true, inbox_error).await?;
    kept_columns(spec, layout, &remembered, inbox_error)?;
    let (mut retries, mut rechecked, mut uncached) = (0, false, false);
    let (attempt, sent) = loop {
        let sent = Instant::now();
        let acquired = acquire(
            steps,
            run,
            claim,
            layout,
            key,
            A::STALE_CLAIM,
            remembered.fingerprint,
        )
        .await;
        match acquired {
            Ok(Acquired::Reused) => {
                tracing::warn!(
                    outcome = "key_reused",
                    "the key's claim is of a request with another fingerprint; body not run"
                );
                telemetry::failed(spec, ErrorClass::Other.label());
                return Err(inbox_error(Error::KeyReused {
                    consumer: spec.consumer.clone(),
                    key: key.clone(),
                }));
            }
            Ok(Acquired::Attempt(attempt)) => break (attempt, sent),
            Ok(Acquired::Completed) => {
                tracing::info!(outcome = "duplicate", "work completed before; body not run");
                let stored = match remembered.store {
                    Some(_) => {
                        let kept =
                            read_kept(steps, run, key, &remembered, false, inbox_error).await?;
                        stored_value(run, key, kept, remembered, inbox_error)?
                    }
                    None => None,
                };
                return Ok(Started::Answered(A::from_duplicate(
                    spec.consumer.clone(),
                    key.clone(),
                    stored,
                )));
            }
            Ok(Acquired::Live(lease_left)) => {
                tracing::info!(
                    outcome = "in_flight",
                    lease_left_ms = lease_left.map(|left| left.as_millis() as u64),
                    "claimed by a live delivery; body not run"
                );
                return Ok(Started::Answered(A::from_in_flight(
                    spec.consumer.clone(),
                    key.clone(),
                    lease_left,
                    (),
                )));
            }
            Ok(Acquired::Stale(attempts, witness)) => {
                telemetry::stale_claim(spec, "reported");
                tracing::warn!(
                    outcome = "stale_claim",
                    attempts,
                    "a claim's lease ended without completion; left for reconciliation"
                );
                return Ok(Started::Answered(A::from_stale_claim(
                    spec.consumer.clone(),
                    key.clone(),
                    attempts,
                    witness,
                )));
            }
            Err(e) if !rechecked && needs_recheck(&e, spec) => {
                rechecked = true;
                (layout, run) = rechecked_layout(steps, spec, true, inbox_error).await?;
            }
            // A prepared statement lost or clashing behind a transaction-mode pooler: as in
            // transaction mode, the connection stops caching them, once, and claims again.
            Err(e) if !uncached && statement_lost(steps, &e, spec) => uncached = true,
            Err(e) => wait_or_give_up(steps, spec, e, &mut retries, inbox_error).await?,
        }
    };

    tracing::debug!(attempt, "claimed; running the body");
    crash_point!(AfterClaim);
    telemetry::attempt(attempt);
    let netted = steps.net().is_some();
    Ok(Started::Holding(
        Holding {
            attempt,
            layout,
            run,
            netted,
            lease_ends: sent + Duration::from_millis(claim.lease_ms),
            lease_ms: claim.lease_ms,
        },
        remembered,
    ))
}

/// Phase 2 of claim mode on a pool: the body, run with no connection checked out. Every
/// write it sends on a connection with the net escapes; where the net is installed and the
/// claim's connection had none, the body is refused ([`Error::NetMissing`]), as on one
/// connection.
pub(crate) async fn run_detached<T, E, B>(
    spec: &'static HandlerSpec,
    holding: &Holding,
    body: &mut B,
) -> Result<Result<T, E>, Panicked>
where
    B: Body<NoConnection, Result<T, E>>,
{
    /// No net's address: the body has no connection of its own to write on.
    const NO_CONNECTION: usize = 0;
    let net = holding.netted.then_some(NO_CONNECTION);
    run_body(spec, body, &mut NoConnection::new(), None, net).await
}

/// The release of claim mode on a pool after a body that failed or was stopped, which got
/// no usable connection (`source`: the pool's checkout, or the connection's preparation):
/// the claim stays until its lease ends, and the body answers as
/// it would have. (A body that succeeded is stamped, never released.)
pub(crate) fn claim_unsettled<T, E, A>(
    spec: &'static HandlerSpec,
    holding: Holding,
    ran: Result<Result<T, E>, Panicked>,
    source: crate::pool::CheckoutFailure,
    inbox_error: fn(Error) -> E,
) -> Result<A, E> {
    let attempt = holding.attempt;
    match ran {
        Ok(Ok(_)) => unreachable!("a body that succeeded is stamped, not released"),
        Ok(Err(e)) => {
            tracing::error!(
                outcome = "failed",
                attempt,
                error = %source,
                "handler returned an error; no connection of the pool could release its claim"
            );
            telemetry::failed(spec, telemetry::error_type(None));
            Err(e)
        }
        Err(Panicked(payload)) if is_stopped(&*payload) => {
            tracing::error!(error = %source, "no connection of the pool could release the claim of a stopped body");
            telemetry::failed(spec, ErrorClass::Misuse.label());
            Err(inbox_error(stopped(payload)))
        }
        Err(Panicked(payload)) => {
            tracing::error!(
                outcome = "panicked",
                attempt,
                "the handler's body panicked; its claim stays until the lease ends"
            );
            std::panic::resume_unwind(payload)
        }
    }
}

/// A checkout for a claim-mode handler's claim failed: nothing ran.
pub(crate) fn claim_not_started<E>(
    spec: &'static HandlerSpec,
    source: crate::pool::CheckoutFailure,
    inbox_error: fn(Error) -> E,
) -> E {
    tracing::warn!(error = %source, "the pool gave the claim no connection; nothing ran");
    telemetry::failed(spec, ErrorClass::ConnectionLost.label());
    inbox_error(Error::Checkout {
        after_effect: None,
        source,
    })
}

/// How many checkouts the release of a claim made on a pool is given (after that, the claim
/// is left to its lease).
pub(crate) const RELEASE_CHECKOUTS: u32 = 3;

/// Before phase 3 on a connection checked out for it: a connection a cancelled delivery
/// left in error is taken back, and the connection is prepared as phase 1 prepares its own
/// (no transaction open, SQLite's busy timeout).
pub(crate) async fn prepared_for_stamp<S: Steps>(
    steps: &mut S,
    holding: &Holding,
) -> QueryResult<()> {
    take_back(steps).await;
    steps.prepare_claim(holding.run).await
}

/// Phase 2 and 3 of claim mode ([`drive_claim`]): what the body `ran` to, settled on the
/// claim `holding` — released after an error, stamped after success — on `steps`, the
/// connection of the claim or another one.
pub(crate) async fn claim_finished<S, T, E, A>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    holding: Holding,
    key: MessageKey,
    ran: Result<Result<T, E>, Panicked>,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<A, E>
where
    S: Steps,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let Holding { attempt, run, .. } = holding;
    let result = match ran {
        Ok(result) => result,
        Err(Panicked(payload)) if is_stopped(&*payload) => {
            if let Err(error) = steps
                .claim_step(run, &key, ClaimStep::Release { attempt })
                .await
            {
                tracing::error!(error = %error, "releasing the claim of a stopped body failed");
            }
            telemetry::failed(spec, ErrorClass::Misuse.label());
            return Err(inbox_error(stopped(payload)));
        }
        // No transaction is open while a claim-mode body runs. A panic leaves the outcome of
        // the side effect unknown, as a crash does, and is left as one: the claim stays
        // until its lease ends, then is taken over or reported, as the outcome type says.
        Err(Panicked(payload)) => {
            tracing::error!(
                outcome = "panicked",
                attempt,
                "the handler's body panicked; its claim stays until the lease ends"
            );
            std::panic::resume_unwind(payload)
        }
    };
    let value = match result {
        Ok(value) => value,
        Err(e) => {
            match steps
                .claim_step(run, &key, ClaimStep::Release { attempt })
                .await
            {
                Ok(answer) if answer.changed() => {
                    tracing::debug!(
                        outcome = "failed",
                        attempt,
                        "handler returned an error; claim released"
                    )
                }
                Ok(_) => tracing::warn!(
                    outcome = "failed",
                    attempt,
                    "handler returned an error; its claim had been taken over"
                ),
                // The claim stays until its lease ends; then it is reclaimed or reported.
                Err(error) => tracing::error!(
                    outcome = "failed",
                    attempt,
                    error = %error,
                    "handler returned an error; releasing its claim failed"
                ),
            }
            telemetry::failed(spec, telemetry::error_type(None));
            return Err(e);
        }
    };

    let mut stamp = ToStamp::before_stamp(&value, &holding, remembered);
    match claim_stamped(
        steps,
        spec,
        &holding,
        &key,
        value,
        &mut stamp,
        inbox_error,
        None,
    )
    .await
    {
        Ok(answer) => Ok(answer),
        Err(Unstamped::Failed(e)) => Err(e),
        Err(Unstamped::Lost { .. }) => unreachable!("on its own connection, a stamp is not lost"),
    }
}

/// What a stamp writes besides `processed_at`: the result, written where the claim is still
/// this attempt's, just before the stamp. A result that cannot be stored does not stop the
/// stamp — the side effect happened — and is reported after it.
pub(crate) struct ToStamp {
    stored: Option<String>,
    unstorable: Option<Error>,
}

impl ToStamp {
    /// What the stamp of `value` writes; then the test kit's crash point before the stamp.
    pub(crate) fn before_stamp<T>(value: &T, holding: &Holding, remembered: Remembered<T>) -> Self {
        let stamp = Self::new(value, holding.layout, remembered);
        crash_point!(BeforeStamp);
        stamp
    }

    fn new<T>(value: &T, layout: Layout, remembered: Remembered<T>) -> Self {
        match remembered.store.map(|store| store.encode(value, layout)) {
            None => ToStamp {
                stored: None,
                unstorable: None,
            },
            Some(Ok(text)) => ToStamp {
                stored: Some(text),
                unstorable: None,
            },
            Some(Err(problem)) => ToStamp {
                stored: None,
                unstorable: Some(problem),
            },
        }
    }
}

/// A stamp not written: a failure that is the answer, or (on a pool) a connection lost,
/// whose stamp another connection tries.
pub(crate) enum Unstamped<T, E> {
    Failed(E),
    Lost { value: T, error: DieselError },
}

/// Phase 3 of claim mode after a body's success: the stamp, where the claim is still this
/// attempt's. `elsewhere`: the stamp may go to another connection (a pool's), so that a
/// connection lost or refused for writes (`Reconnect`) ends this try as
/// [`Unstamped::Lost`] instead of the effect's loss; the connection is prepared first, as a
/// fresh one.
#[allow(
    clippy::too_many_arguments,
    reason = "the claim, the value and what goes with it, each its own argument"
)]
pub(crate) async fn claim_stamped<S, T, E, A>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    holding: &Holding,
    key: &MessageKey,
    value: T,
    stamp: &mut ToStamp,
    inbox_error: fn(Error) -> E,
    elsewhere: Option<Elsewhere>,
) -> Result<A, Unstamped<T, E>>
where
    S: Steps,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let (attempt, run) = (holding.attempt, holding.run);
    let (mut retries, mut lost) = (0, 0);
    let prepared = match elsewhere {
        Some(_) => prepared_for_stamp(steps, holding).await,
        None => Ok(()),
    };
    let mut prepared = Some(prepared);
    // A try after a connection was lost under the stamp: its answer may have been lost
    // with the connection after the stamp committed.
    let after_loss = matches!(elsewhere, Some(Elsewhere { after_loss: true }));
    loop {
        let stamped = match prepared.take() {
            Some(Err(e)) => Err(e),
            _ => match &stamp.stored {
                Some(text) => match steps
                    .store_result(run, key, text.clone(), None, Some(attempt))
                    .await
                {
                    Ok(_) => {
                        steps
                            .claim_step(run, key, ClaimStep::Stamp { attempt })
                            .await
                    }
                    Err(e) => Err(e),
                },
                None => {
                    steps
                        .claim_step(run, key, ClaimStep::Stamp { attempt })
                        .await
                }
            },
        };
        // No row stamped after a lost answer: the stamp that was lost may be this attempt's
        // own, committed — the row completed at this attempt says so, and is its answer.
        let stamped = match stamped {
            Ok(answer) if after_loss && !answer.changed() => {
                match steps.claim_step(run, key, ClaimStep::Read).await {
                    Ok(ClaimAnswer::Read(Some((ClaimState::Completed, seen, _))))
                        if seen == attempt =>
                    {
                        tracing::info!(attempt, "the stamp whose answer was lost had committed");
                        Ok(ClaimAnswer::Rows(1))
                    }
                    Ok(_) => Ok(answer),
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        match stamped {
            Ok(answer) if answer.changed() => {
                tracing::debug!(outcome = "processed", attempt, "stamped complete");
                if let Some(problem) = stamp.unstorable.take() {
                    tracing::error!(
                        error = %problem,
                        attempt,
                        "the side effect ran and its claim is stamped, but its result is not stored"
                    );
                    telemetry::failed(spec, problem.class().label());
                    return Err(Unstamped::Failed(inbox_error(problem)));
                }
                return Ok(A::from_processed(value));
            }
            Ok(_) => {
                tracing::error!(
                    outcome = "claim_lost",
                    attempt,
                    "the side effect ran, but the claim had been taken over: not stamped"
                );
                telemetry::failed(spec, ErrorClass::ClaimLost.label());
                return Err(Unstamped::Failed(inbox_error(Error::ClaimLost { attempt })));
            }
            // The side effect ran: a statement lost behind a pooler must not leave it
            // unrecorded. The cache off, diesel-async's driver still names what it prepares:
            // a few more tries, on another server connection each.
            Err(e) if lost < 3 && statement_lost(steps, &e, spec) => lost += 1,
            Err(e) => match retry_after(spec, &e, retries) {
                Some(after) => {
                    retries += 1;
                    steps.pause(after).await;
                }
                // On a pool, another connection: this one is gone, or refuses writes.
                None if elsewhere.is_some()
                    && classify(&e, &spec.schema).action() == inbox_core::Action::Reconnect =>
                {
                    tracing::warn!(
                        attempt,
                        error = %e,
                        "stamping the claim failed on its connection; trying another of the pool"
                    );
                    // Not back into the pool for the next try to take again.
                    steps.discard();
                    return Err(Unstamped::Lost { value, error: e });
                }
                // The effect happened: an error of its own, which says so, rather than the
                // database's, which a pump would retry or dead-letter.
                None => {
                    tracing::error!(
                        outcome = "effect_not_recorded",
                        attempt,
                        error = %e,
                        "the side effect ran, but stamping its claim complete failed"
                    );
                    telemetry::failed(spec, ErrorClass::EffectNotRecorded.label());
                    return Err(Unstamped::Failed(inbox_error(Error::EffectNotRecorded {
                        attempt,
                        attempts: retries + 1,
                        source: e,
                    })));
                }
            },
        }
    }
}

/// The last of a pool's tries to stamp a claim failed (`last`) and the lease is over: the
/// effect is not recorded — [`Error::EffectNotRecorded`] after a lost connection,
/// [`Error::Checkout`] after a pool that gave none.
pub(crate) fn stamp_given_up<E>(
    spec: &'static HandlerSpec,
    holding: &Holding,
    last: StampFailure,
    tries: u32,
    inbox_error: fn(Error) -> E,
) -> E {
    let attempt = holding.attempt;
    tracing::error!(
        outcome = "effect_not_recorded",
        attempt,
        tries,
        "the side effect ran, but no connection of the pool stamped its claim in time"
    );
    telemetry::failed(spec, ErrorClass::EffectNotRecorded.label());
    inbox_error(match last {
        StampFailure::Database(source) => Error::EffectNotRecorded {
            attempt,
            attempts: tries,
            source,
        },
        StampFailure::Checkout(source) => Error::Checkout {
            after_effect: Some(attempt),
            source,
        },
    })
}

/// A stamp on a pool's connection, which may be another than the claim's
/// ([`claim_stamped`]): `after_loss` when a try before it lost its connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Elsewhere {
    pub(crate) after_loss: bool,
}

/// Why a pool's try to stamp a claim failed.
pub(crate) enum StampFailure {
    Database(DieselError),
    Checkout(crate::pool::CheckoutFailure),
}

/// How long a pool's stamp keeps trying: for a lease past the claim's lease — a stamp
/// after the lease still completes the work unless a delivery took the claim over, which
/// its compare-and-set then tells (`ClaimLost`) —, at least three tries. After a checkout
/// the pool refused (it waited as long as it is set to) the next try comes at once, not to
/// leave the pool's queue to new claims; after a lost connection, from 50 ms, doubling, up
/// to a second (a server restarting).
pub(crate) struct StampTries {
    until: Instant,
    pause: Duration,
    tries: u32,
    lost: bool,
}

impl StampTries {
    pub(crate) fn new(holding: &Holding) -> Self {
        StampTries {
            until: holding.lease_ends + Duration::from_millis(holding.lease_ms),
            pause: Duration::from_millis(50),
            tries: 0,
            lost: false,
        }
    }

    /// Counts a try that failed (`failure`); the pause before the next one, `None` when
    /// the time is over (after at least three tries).
    pub(crate) fn failed(&mut self, failure: &StampFailure) -> Option<Duration> {
        self.tries += 1;
        if self.tries >= 3 && Instant::now() >= self.until {
            return None;
        }
        match failure {
            StampFailure::Checkout(_) => Some(Duration::from_millis(1)),
            StampFailure::Database(_) => {
                self.lost = true;
                let pause = self.pause;
                self.pause = (self.pause * 2).min(Duration::from_secs(1));
                Some(pause)
            }
        }
    }

    /// What the next try is: after a lost connection or not.
    pub(crate) fn elsewhere(&self) -> Elsewhere {
        Elsewhere {
            after_loss: self.lost,
        }
    }

    pub(crate) fn tries(&self) -> u32 {
        self.tries
    }
}

/// Whether `error` is a prepared statement lost or clashing on the server (a
/// transaction-mode pooler): then the connection stops caching statements, and the caller
/// runs the statement again, once.
fn statement_lost<S: Steps>(steps: &mut S, error: &DieselError, spec: &HandlerSpec) -> bool {
    if classify(error, &spec.schema) != ErrorClass::StatementLost {
        return false;
    }
    stop_caching(steps);
    true
}

/// The connection stops caching prepared statements (diesel's cache: unnamed statements
/// then), and says so.
fn stop_caching<S: Steps>(steps: &mut S) {
    tracing::warn!(
        "a prepared statement was missing or taken on the server (a transaction-mode \
         pooler?): this connection no longer caches prepared statements"
    );
    steps.stop_caching_statements();
}

/// How phase 1 of claim mode ended.
enum Acquired<W> {
    /// This delivery holds the claim of this attempt.
    Attempt(u32),
    Completed,
    /// Held by another delivery, for this long yet (`None`: not read).
    Live(Option<Duration>),
    /// Expired, and reported rather than taken over (after this many attempts).
    Stale(u32, W),
    /// The claim (of any state) was made for a request with another fingerprint.
    Reused,
}

/// Phase 1 of claim mode; each statement commits on its own. `report` is the outcome type's
/// witness that it can answer `StaleClaim`: with one, an expired claim is reported; without,
/// it is taken over.
async fn acquire<S: Steps, W: Copy>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    claim: ClaimSpec,
    layout: Layout,
    key: &MessageKey,
    report: Option<W>,
    fingerprint: Option<Fingerprint>,
) -> QueryResult<Acquired<W>> {
    /// Rounds of insert, read and takeover. Each round that does not decide saw the row
    /// change under it (taken over, or removed); a third in a row means deliveries of the
    /// same message keep racing, and the one reporting `Live` lets the broker retry later.
    const ROUNDS: usize = 3;
    steps.prepare_claim(spec).await?;
    // Rounds whose insert wrote nothing and whose read found nothing: a claim removed in
    // between once, perhaps; every round, the table swallows the insert (a trigger or rule
    // added since the check) — a schema fault, never `InFlight` for ever.
    let mut vanished = 0;
    for _ in 0..ROUNDS {
        let insert = ClaimStep::Insert {
            lease_ms: claim.lease_ms,
            layout,
            fingerprint,
        };
        let sent = Instant::now();
        if steps.claim_step(spec, key, insert).await?.changed() {
            if claim.too_late(sent) {
                give_back(steps, spec, key, 1).await?;
                continue;
            }
            return Ok(Acquired::Attempt(1));
        }
        let ClaimAnswer::Read(row) = steps.claim_step(spec, key, ClaimStep::Read).await? else {
            unreachable!("a read answers with the row")
        };
        let (state, seen, lease_left) = match row {
            Some(row) => row,
            // Removed between the insert and the read: insert again.
            None => {
                vanished += 1;
                continue;
            }
        };
        // The claim of another request under this key: refused whatever its state, in flight
        // or done (the claim's insert wrote its fingerprint).
        if fingerprint.is_some()
            && steps
                .read_kept(spec, key, (false, true), false)
                .await?
                .reused_by(fingerprint)
        {
            return Ok(Acquired::Reused);
        }
        let expired = match (state, report) {
            (ClaimState::Completed, _) => return Ok(Acquired::Completed),
            (ClaimState::Live, _) => return Ok(Acquired::Live(Some(lease_left))),
            (ClaimState::Expired, Some(witness)) => return Ok(Acquired::Stale(seen, witness)),
            (ClaimState::Expired, None) => true,
            (ClaimState::Released, _) => false,
            // A plain read never answers it; were it to, waiting is safe.
            (ClaimState::Unread, _) => return Ok(Acquired::Live(None)),
        };
        let take_over = ClaimStep::TakeOver {
            seen,
            lease_ms: claim.lease_ms,
            expired,
        };
        let sent = Instant::now();
        if steps.claim_step(spec, key, take_over).await?.changed() {
            if claim.too_late(sent) {
                give_back(steps, spec, key, seen + 1).await?;
                continue;
            }
            if expired {
                telemetry::stale_claim(spec, "taken_over");
                tracing::warn!(
                    attempt = seen + 1,
                    "took over a claim whose lease had ended without completion"
                );
            }
            return Ok(Acquired::Attempt(seen + 1));
        }
    }
    if vanished == ROUNDS {
        tracing::error!("every claim insert wrote no row, and no claim is there");
        return Err(swallowed(spec));
    }
    Ok(Acquired::Live(Some(Duration::from_millis(claim.lease_ms))))
}

/// Releases the claim of `attempt`, won too late to run the body under it
/// ([`ClaimSpec::too_late`]): the next round takes it over again with a whole lease, unless
/// another delivery's takeover was faster.
async fn give_back<S: Steps>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    key: &MessageKey,
    attempt: u32,
) -> QueryResult<()> {
    tracing::warn!(
        attempt,
        "the claim took over a quarter of its lease to commit; released, claimed again"
    );
    steps
        .claim_step(spec, key, ClaimStep::Release { attempt })
        .await
        .map(drop)
}

/// Waits before retrying a database error of claim mode, or returns it as the handler's error
/// when it is not transient or the retries are used up.
async fn wait_or_give_up<S: Steps, E>(
    steps: &mut S,
    spec: &HandlerSpec,
    error: DieselError,
    retries: &mut u32,
    inbox_error: fn(Error) -> E,
) -> Result<(), E> {
    match retry_after(spec, &error, *retries) {
        Some(after) => {
            *retries += 1;
            steps.pause(after).await;
            Ok(())
        }
        None => {
            let class = classify(&error, &spec.schema);
            if class == ErrorClass::Schema {
                forget_check(steps, spec);
            }
            discard(steps, Some(&class));
            let failure = Failure::<(), E>::Database(error);
            Err(give_up(
                spec,
                failure,
                Some(class),
                *retries + 1,
                inbox_error,
            ))
        }
    }
}

/// The pause before retrying a database error of claim mode, or `None` to give up.
fn retry_after(spec: &HandlerSpec, error: &DieselError, retries: u32) -> Option<Duration> {
    let class = classify(error, &spec.schema);
    match spec.retry.decide(&class, retries, fastrand::f64()) {
        RetryDecision::Retry { after } => {
            telemetry::retried(spec, &class);
            tracing::warn!(
                class = %class,
                retry = retries + 1,
                after_ms = after.as_millis() as u64,
                "transient failure; retrying"
            );
            Some(after)
        }
        RetryDecision::GiveUp => None,
    }
}

/// The error a run gives up with, recorded on its span (`error.type`, `inbox.attempt`) and
/// counted.
fn give_up<T, E>(
    spec: &HandlerSpec,
    failure: Failure<T, E>,
    class: Option<ErrorClass>,
    attempts: u32,
    inbox_error: fn(Error) -> E,
) -> E {
    telemetry::attempt(attempts);
    let error_type = match &failure {
        Failure::Body(..) => telemetry::error_type(class.as_ref()),
        Failure::Aborted => ErrorClass::TransactionAborted.label(),
        Failure::Database(DieselError::AlreadyInTransaction) => ErrorClass::Misuse.label(),
        Failure::Database(DieselError::QueryBuilderError(inner)) if inner.is::<Error>() => inner
            .downcast_ref::<Error>()
            .map_or("other", |error| error.class().label()),
        Failure::Database(_) => class.as_ref().unwrap_or(&ErrorClass::Other).label(),
    };
    telemetry::failed(spec, error_type);
    match failure {
        Failure::Body(Err(e), _) => {
            tracing::debug!(outcome = "failed", "handler returned an error; rolled back");
            e
        }
        Failure::Body(Ok(_), _) => unreachable!("a body failure holds the body's Err"),
        Failure::Aborted => {
            tracing::error!(
                outcome = "aborted",
                "handler returned Ok over an aborted transaction (a swallowed database error); \
                 rolled back"
            );
            inbox_error(Error::TransactionAborted { attempts })
        }
        Failure::Database(DieselError::AlreadyInTransaction) => {
            tracing::error!(
                outcome = "misuse",
                "the handler was called inside an open transaction; nothing ran"
            );
            inbox_error(Error::CalledInsideTransaction)
        }
        // The inbox's own error, carried through a statement's `QueryResult`: as it is.
        Failure::Database(DieselError::QueryBuilderError(inner)) if inner.is::<Error>() => {
            let error = *inner.downcast::<Error>().expect("checked by `is`");
            tracing::error!(outcome = "failed", error = %error, "refused");
            inbox_error(error)
        }
        Failure::Database(source) => {
            let class = class.unwrap_or(ErrorClass::Other);
            tracing::warn!(outcome = "failed", class = %class, attempts, error = %source, "rolled back");
            inbox_error(Error::Database {
                class,
                attempts,
                source,
            })
        }
    }
}

async fn attempt<S, K, T, E, B, W: Copy>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    layout: Layout,
    claims: &K,
    body: &mut B,
    in_flight: Option<W>,
    remembered: Remembered<T>,
) -> Result<Decided<T, W>, Failure<T, E>>
where
    S: Steps,
    K: Claims,
    B: Body<S::Conn, Result<T, E>>,
{
    let claimed = claims
        .begin_and_claim(steps, spec, layout)
        .await
        .map_err(Failure::Database)?;
    if spec.in_flight_when_locked {
        // The short lock wait was for the marker: the body waits for locks as usual.
        if let Err(e) = steps
            .wait_for_locks(spec, matches!(claimed, Ok(true)))
            .await
        {
            roll_back(steps).await;
            match &claimed {
                // The claim's own error is the one that says what happened.
                Err(_) => tracing::warn!(error = %e, "putting back the lock wait failed"),
                Ok(_) => return Err(Failure::Database(e)),
            }
        }
    }
    match claimed {
        Ok(true) => {
            // The request's fingerprint, with the marker: a delivery that meets the marker
            // sees it once this transaction commits, and then with it. A handler that stores
            // its result writes both in one statement after the body.
            if let (Some(fingerprint), Some(key), None) =
                (remembered.fingerprint, claims.key(), &remembered.store)
                && let Err(e) = steps.write_fingerprint(spec, key, fingerprint).await
            {
                roll_back(steps).await;
                return Err(Failure::Database(e));
            }
        }
        Ok(false) => {
            // ROLLBACK, not COMMIT: nothing was written, and on PostgreSQL a commit would
            // flush the WAL for the sequence value the conflicting insert consumed. With it,
            // what `begin` set for the session is put back.
            if let Err(e) = steps.roll_back_and_end(spec, layout).await {
                tracing::error!(error = %e, "rollback failed");
                roll_back(steps).await;
                end(steps, spec, layout).await;
            }
            return Ok(Decided::Duplicate(None));
        }
        Err(e) => {
            let e = deadlock_unread(steps, spec, layout, e).await;
            roll_back(steps).await;
            // Another delivery's uncommitted marker: answered at once instead of waited for,
            // when the outcome type can say so.
            if let Some(witness) = in_flight
                && spec.in_flight_when_locked
                && classify(&e, &spec.schema)
                    == ErrorClass::Transient(inbox_core::TransientKind::LockWaitTimeout)
            {
                return Ok(Decided::InFlight(witness));
            }
            return Err(Failure::Database(refused_marker(e, &spec.schema)));
        }
    }
    let net = steps.net();
    let origin = Some(claims.origin(spec));
    let result = match run_body(spec, body, steps.conn(), origin, net).await {
        Ok(result) => result,
        Err(Panicked(payload)) if is_stopped(&*payload) => {
            roll_back(steps).await;
            return Err(Failure::Database(DieselError::QueryBuilderError(Box::new(
                stopped(payload),
            ))));
        }
        Err(Panicked(payload)) => {
            // Before the panic goes on: roll back, so that the connection is usable again and
            // the marker's lock is released for a redelivery at once.
            roll_back(steps).await;
            end(steps, spec, layout).await;
            tracing::error!(
                outcome = "panicked",
                "the handler's body panicked; its transaction was rolled back"
            );
            std::panic::resume_unwind(payload)
        }
    };
    // The result, stored with the marker in this transaction.
    if let (Ok(value), Some(store), Some(key)) = (&result, remembered.store, claims.key()) {
        let written = match store.encode(value, layout) {
            Ok(text) => {
                steps
                    .store_result(spec, key, text, remembered.fingerprint, None)
                    .await
            }
            Err(problem) => Err(DieselError::QueryBuilderError(Box::new(problem))),
        };
        if let Err(e) = written {
            roll_back(steps).await;
            return Err(Failure::Database(e));
        }
    }
    if result.is_ok() {
        crash_point!(BeforeCommit);
    }
    match result {
        Ok(value) => match steps.commit(spec, layout).await {
            Ok(()) => {
                crash_point!(AfterCommit);
                Ok(Decided::Processed(value))
            }
            Err(e) => {
                // A failed COMMIT may or may not have ended the transaction.
                roll_back(steps).await;
                if crate::dialect::ended_in_body(&e) {
                    steps.discard_foreign().await;
                    return Err(ended_in_body());
                }
                match classify(&e, &spec.schema) {
                    ErrorClass::TransactionAborted => Err(Failure::Aborted),
                    _ => Err(Failure::Database(e)),
                }
            }
        },
        Err(e) => {
            let ended = layout.mariadb && steps.ended_by_server().await;
            let ended_in_body = !layout.mariadb && steps.ended_in_body().await;
            roll_back(steps).await;
            if ended_in_body {
                steps.discard_foreign().await;
                return Err(self::ended_in_body());
            }
            Err(Failure::Body(Err(e), ended))
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
async fn run_body<C, R, B: Body<C, R>>(
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

/// The payload of a panic in the handler's body, resumed once the transaction is rolled back.
pub(crate) struct Panicked(Box<dyn Any + Send>);

/// Whether the body was stopped by the tripwire — a write the net stopped, a checkout a
/// guarded pool refused, a handler's connection without the net the process installed —
/// rather than by a panic of its own.
fn is_stopped(payload: &(dyn Any + Send)) -> bool {
    payload.is::<tripwire::net::Escaped>()
        || payload.is::<tripwire::InsideHandler>()
        || payload.is::<tripwire::net::NetMissing>()
}

/// The inbox's error for a body the tripwire stopped ([`is_stopped`]).
fn stopped(payload: Box<dyn Any + Send>) -> Error {
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
async fn roll_back<S: Steps>(steps: &mut S) {
    if let Err(e) = steps.roll_back().await {
        tracing::error!(error = %e, "rollback failed");
    }
}

/// Puts back what the transaction's `begin` set for the session. A failure is logged, not
/// returned: the transaction has ended, and what it decided stands.
async fn end<S: Steps>(steps: &mut S, spec: &'static HandlerSpec, layout: Layout) {
    if let Err(e) = steps.end(spec, layout).await {
        tracing::warn!(error = %e, "putting back the session's settings failed");
    }
}

/// The driver against scripted steps: what it does on a deadlock, and with claims that
/// change under it — without a server, in the order it does it.
#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use diesel::result::DatabaseErrorKind;
    use inbox_core::{Consumer, InFlightOutcome, InboxSchema, RetryPolicy, StaleClaimOutcome};

    use super::*;
    use crate::Isolation;
    use crate::io::complete_now;
    use crate::runtime::sync::Immediate;

    #[test]
    fn a_check_is_remembered_by_what_stays_with_the_connection() {
        // Inside the connection's bytes (an inline `NoInstrumentation`, at its end for a
        // zero-sized one): the connection's address.
        let pg = crate::dialect::Backend::Postgres;
        assert_eq!(identity(pg, 1000, 64, 1000), 1000);
        assert_eq!(identity(pg, 1000, 64, 1032), 1000);
        assert_eq!(identity(pg, 1000, 64, 1064), 1000);
        // Elsewhere (a box, an `Arc`): the instrumentation's, wherever the connection is.
        assert_eq!(identity(pg, 1000, 64, 5000), 5000);
        assert_eq!(identity(pg, 2000, 64, 5000), 5000);
        assert_eq!(identity(pg, 1000, 64, 999), 999);
        // MySQL and MariaDB: per handler; the session mark checks each session.
        let mysql = crate::dialect::Backend::Mysql;
        assert_eq!(
            identity(mysql, 1000, 64, 5000),
            identity(mysql, 2000, 64, 7000)
        );
    }

    static SPEC: HandlerSpec = HandlerSpec {
        consumer: Consumer::from_validated("credit"),
        schema: InboxSchema::DEFAULT,
        retry: RetryPolicy::new(3),
        isolation: Isolation::ServerDefault,
        sqlite_busy_timeout_ms: HandlerSpec::SQLITE_BUSY_TIMEOUT_MS,
        precheck: false,
        idle_in_transaction_ms: HandlerSpec::IDLE_IN_TRANSACTION_MS,
        in_flight_when_locked: false,
    };

    const CLAIM: ClaimSpec = ClaimSpec { lease_ms: 1_000 };

    /// What the steps did (the body writes there too, as its "connection"), and what the
    /// marker's claims answer, in turn.
    #[derive(Default)]
    struct Script {
        did: Vec<String>,
        claims: VecDeque<QueryResult<bool>>,
        claim_steps: VecDeque<ClaimAnswer>,
    }

    impl Steps for &mut Script {
        type Conn = Vec<String>;

        fn net(&mut self) -> Option<usize> {
            None
        }

        fn identity(&mut self) -> usize {
            std::ptr::from_mut(&mut self.did) as usize
        }

        fn discard(&mut self) {}

        fn conn(&mut self) -> &mut Vec<String> {
            &mut self.did
        }

        async fn begin(&mut self, _: &'static HandlerSpec, _: Layout) -> QueryResult<()> {
            self.did.push("begin".into());
            Ok(())
        }

        async fn end(&mut self, _: &'static HandlerSpec, _: Layout) -> QueryResult<()> {
            Ok(())
        }

        async fn claim(
            &mut self,
            _: &'static HandlerSpec,
            _: &MessageKey,
            _: Layout,
        ) -> QueryResult<bool> {
            self.did.push("claim".into());
            self.claims.pop_front().expect("scripted")
        }

        async fn claim_batch(
            &mut self,
            _: &'static HandlerSpec,
            _: &[uuid::Uuid],
            _: Option<&[String]>,
            _: Layout,
        ) -> QueryResult<Vec<uuid::Uuid>> {
            unreachable!("one message")
        }

        async fn commit(&mut self, _: &'static HandlerSpec, _: Layout) -> QueryResult<()> {
            self.did.push("commit".into());
            Ok(())
        }

        async fn roll_back_and_end(
            &mut self,
            _: &'static HandlerSpec,
            _: Layout,
        ) -> QueryResult<()> {
            self.did.push("roll back".into());
            Ok(())
        }

        async fn roll_back(&mut self) -> QueryResult<()> {
            self.did.push("roll back".into());
            Ok(())
        }

        async fn verify(
            &mut self,
            _: &'static HandlerSpec,
            _: bool,
        ) -> Result<Layout, SchemaError> {
            Ok(Layout::default())
        }

        async fn wait_for_locks(&mut self, _: &'static HandlerSpec, _: bool) -> QueryResult<()> {
            Ok(())
        }

        async fn ended_by_server(&mut self) -> bool {
            false
        }

        fn stop_caching_statements(&mut self) {}

        async fn prepare_claim(&mut self, _: &'static HandlerSpec) -> QueryResult<()> {
            Ok(())
        }

        async fn claim_step(
            &mut self,
            _: &'static HandlerSpec,
            _: &MessageKey,
            step: ClaimStep,
        ) -> QueryResult<ClaimAnswer> {
            let name = match step {
                ClaimStep::Insert { .. } => "insert".to_owned(),
                ClaimStep::Read | ClaimStep::Precheck { .. } => "read".to_owned(),
                ClaimStep::TakeOver { seen, .. } => format!("take over {seen}"),
                ClaimStep::Stamp { attempt } => format!("stamp {attempt}"),
                ClaimStep::Release { attempt } => format!("release {attempt}"),
            };
            self.did.push(name);
            Ok(self.claim_steps.pop_front().expect("scripted"))
        }

        async fn markers_present(
            &mut self,
            _: &'static HandlerSpec,
            ids: &[uuid::Uuid],
            _: bool,
        ) -> QueryResult<Presence> {
            self.did.push("confirm".into());
            Ok(Presence {
                present: ids.len(),
                completed: ids.len(),
                live_claims: 0,
            })
        }

        fn depth(&mut self) -> u32 {
            0
        }

        async fn savepoint(&mut self) -> QueryResult<()> {
            unreachable!("not scripted")
        }

        async fn release(&mut self) -> QueryResult<()> {
            unreachable!("not scripted")
        }

        async fn store_result(
            &mut self,
            _: &'static HandlerSpec,
            _: &MessageKey,
            text: String,
            fingerprint: Option<Fingerprint>,
            _: Option<u32>,
        ) -> QueryResult<usize> {
            let with = if fingerprint.is_some() {
                " and fingerprint"
            } else {
                ""
            };
            self.did.push(format!("store {text}{with}"));
            Ok(1)
        }

        async fn read_kept(
            &mut self,
            _: &'static HandlerSpec,
            _: &MessageKey,
            _: (bool, bool),
            _: bool,
        ) -> QueryResult<Kept> {
            self.did.push("read kept".into());
            Ok(Kept::default())
        }

        async fn write_fingerprint(
            &mut self,
            _: &'static HandlerSpec,
            _: &MessageKey,
            _: Fingerprint,
        ) -> QueryResult<usize> {
            self.did.push("fingerprint".into());
            Ok(1)
        }

        async fn pause(&mut self, _: Duration) {
            self.did.push("pause".into());
        }
    }

    fn body(did: &mut Vec<String>) -> Result<(), Error> {
        did.push("body".into());
        Ok(())
    }

    fn deadlock() -> DieselError {
        DieselError::DatabaseError(
            DatabaseErrorKind::Unknown,
            Box::new("deadlock detected".to_owned()),
        )
    }

    #[test]
    fn a_deadlock_on_the_marker_is_retried_in_a_fresh_transaction() {
        let mut script = Script {
            claims: VecDeque::from([Err(deadlock()), Ok(true)]),
            ..Script::default()
        };
        let key = MessageKey::integer(1);
        let decided = complete_now(drive(
            &mut script,
            &SPEC,
            &key,
            Immediate(body),
            |_, _, _| None,
            None::<std::convert::Infallible>,
            Remembered::nothing(),
            std::convert::identity,
        ));
        assert!(matches!(decided, Ok(Decided::Processed(()))));
        assert_eq!(
            script.did,
            [
                "begin",
                "claim",
                "roll back",
                "pause",
                "begin",
                "claim",
                "body",
                "commit"
            ]
        );
    }

    /// Message 1 in claim mode, against the script, answered in the outcome type `A`.
    fn claim<A: HandlerOutcome<(), InFlightWitness = ()>>(script: &mut Script) -> Result<A, Error> {
        complete_now(drive_claim(
            script,
            &SPEC,
            CLAIM,
            MessageKey::integer(1),
            Immediate(body),
            Remembered::nothing(),
            std::convert::identity,
        ))
    }

    #[test]
    fn a_claim_taken_over_between_the_read_and_the_takeover_is_in_flight() {
        let mut script = Script {
            claim_steps: VecDeque::from([
                ClaimAnswer::Rows(0),
                ClaimAnswer::Read(Some((ClaimState::Released, 1, Duration::ZERO))),
                // Another delivery took it over first: the next round finds its live claim.
                ClaimAnswer::Rows(0),
                ClaimAnswer::Rows(0),
                ClaimAnswer::Read(Some((ClaimState::Live, 2, Duration::ZERO))),
            ]),
            ..Script::default()
        };
        let outcome = claim(&mut script);
        assert!(
            matches!(outcome, Ok(InFlightOutcome::InFlight { .. })),
            "{outcome:?}"
        );
        assert_eq!(
            script.did,
            ["insert", "read", "take over 1", "insert", "read"]
        );
    }

    #[test]
    fn a_released_claim_is_taken_over_and_stamped_by_its_attempt() {
        let mut script = Script {
            claim_steps: VecDeque::from([
                ClaimAnswer::Rows(0),
                ClaimAnswer::Read(Some((ClaimState::Released, 1, Duration::ZERO))),
                ClaimAnswer::Rows(1),
                ClaimAnswer::Rows(1),
            ]),
            ..Script::default()
        };
        let outcome = claim(&mut script);
        assert!(
            matches!(outcome, Ok(InFlightOutcome::Processed(()))),
            "{outcome:?}"
        );
        assert_eq!(
            script.did,
            ["insert", "read", "take over 1", "body", "stamp 2"]
        );
    }

    #[test]
    fn a_stamp_that_finds_the_claim_taken_over_is_claim_lost() {
        let mut script = Script {
            claim_steps: VecDeque::from([ClaimAnswer::Rows(1), ClaimAnswer::Rows(0)]),
            ..Script::default()
        };
        let outcome: Result<InFlightOutcome<()>, _> = claim(&mut script);
        assert!(
            matches!(outcome, Err(Error::ClaimLost { attempt: 1 })),
            "{outcome:?}"
        );
        assert_eq!(script.did, ["insert", "body", "stamp 1"]);
    }

    /// An expired claim, read after the insert found the row.
    fn expired_claim() -> Script {
        Script {
            claim_steps: VecDeque::from([
                ClaimAnswer::Rows(0),
                ClaimAnswer::Read(Some((ClaimState::Expired, 1, Duration::ZERO))),
                ClaimAnswer::Rows(1),
                ClaimAnswer::Rows(1),
            ]),
            ..Script::default()
        }
    }

    #[test]
    fn an_expired_claim_is_reported_when_the_outcome_type_holds_stale_claims() {
        let mut script = expired_claim();
        let outcome = claim(&mut script);
        assert!(
            matches!(
                outcome,
                Ok(StaleClaimOutcome::StaleClaim { attempts: 1, .. })
            ),
            "{outcome:?}"
        );
        assert_eq!(script.did, ["insert", "read"]);
    }

    #[test]
    fn an_expired_claim_is_taken_over_when_the_outcome_type_has_no_stale_claims() {
        let mut script = expired_claim();
        let outcome = claim(&mut script);
        assert!(
            matches!(outcome, Ok(InFlightOutcome::Processed(()))),
            "{outcome:?}"
        );
        assert_eq!(
            script.did,
            ["insert", "read", "take over 1", "body", "stamp 2"]
        );
    }
}
