//! The async runtime: the expansion of `#[idempotent]` on an `async fn`, on diesel-async.
//!
//! The steps and the retry loop are the sync runtime's (`driver::drive`), awaited; the SQL
//! is the same (`backend.rs`).

use std::future::Future;
use std::time::Duration;

use diesel::QueryResult;
use diesel_async::AsyncConnection;
use inbox_core::{BatchOutcome, ErrorClass, KeyError, MessageKey, Outcome};
use tracing::Instrument;

use crate::__private::HandlerSpec;
use crate::claim::ClaimSpec;
use crate::dialect::claim::{ClaimAnswer, ClaimStep};
use crate::dialect::layout::Layout;
use crate::driver::{self, BatchClaims, NewMessages, Steps};
use crate::io::Awaiting;
use crate::{Error, NoConnection};

/// A diesel-async connection an `async fn` `#[idempotent]` handler can run on.
///
/// Implemented for `AsyncPgConnection` (features `async` and `postgres`),
/// `AsyncMysqlConnection` (features `async` and `mysql`) and
/// `SyncConnectionWrapper<SqliteConnection>` (features `async` and `sqlite`). Declare the
/// handler's connection parameter as `&mut` one of them; a pooled connection (diesel-async's
/// deadpool, bb8 or mobc support) derefs to it, so `handler(&mut pooled, &msg).await`
/// compiles as it is.
///
/// The methods are the runtime's; they are not meant to be called directly.
///
/// # Cancellation
///
/// A handler's future may be dropped at any `.await` — by a timeout, a `select!`, a shutdown.
/// Nothing half-done can commit: the marker and the body's writes commit in one `COMMIT`, sent
/// only after the body has finished. What is left is a connection inside an open transaction,
/// which diesel-async's transaction manager still counts as open:
///
/// - bb8 checks a connection when it comes back and closes a broken one at once; the server
///   rolls the transaction back and its locks are released;
/// - deadpool and mobc check a connection when it is next checked out and discard it then;
///   until then the abandoned transaction holds its locks — on PostgreSQL the marker of that
///   message (a redelivery waits for it) and the rows the body wrote, on SQLite the whole
///   database. The handler bounds that on PostgreSQL and MariaDB: the server ends a handler
///   transaction idle for `idle_in_transaction_ms` (10 s by default). MySQL has no such
///   bound: use bb8 there where handlers can be cancelled;
/// - a connection used without a pool refuses the next handler call with
///   [`Error::CalledInsideTransaction`](crate::Error::CalledInsideTransaction) until it is
///   dropped.
///
/// A body that *panics* is different: the runtime catches the panic at the body's poll, rolls
/// the transaction back, and lets the panic go on, so the connection comes back clean.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a connection an async #[idempotent] handler can run on",
    label = "declare this parameter as `&mut AsyncPgConnection`, `&mut AsyncMysqlConnection` or `&mut SyncConnectionWrapper<SqliteConnection>`",
    note = "a pooled connection derefs to its connection: declare `&mut AsyncPgConnection` and \
            call the handler with `&mut pooled_connection`",
    note = "the handler's connection is its first `&mut …Connection` parameter; if that one is \
            another client, name the database connection with `conn = …`"
)]
pub trait AsyncInboxConnection:
    AsyncConnection<Backend: crate::dialect::Dialect> + Send + sealed::Sealed
{
    /// Opens the handler's transaction.
    #[doc(hidden)]
    fn begin_inbox_transaction(
        &mut self,
        spec: &'static HandlerSpec,
        mariadb: bool,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// After the handler's transaction ended: puts back what `begin_inbox_transaction` set
    /// for the session.
    #[doc(hidden)]
    fn end_inbox_transaction(
        &mut self,
        _spec: &'static HandlerSpec,
        _mariadb: bool,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        async { Ok(()) }
    }

    /// `on_locked = "in_flight"`: lock waits as the session had them, after the marker's claim.
    #[doc(hidden)]
    fn wait_for_locks(
        &mut self,
        _spec: &'static HandlerSpec,
        _claimed: bool,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        async { Ok(()) }
    }

    /// Inserts the marker unless it exists; `Ok(false)` when it already did. `text`: the
    /// key's text, written to `key_text`.
    #[doc(hidden)]
    fn claim_marker(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Inserts the markers of `ids` that do not exist; returns those it inserted. `texts`:
    /// the keys' texts, in the order of `ids`, written to `key_text`.
    #[doc(hidden)]
    fn claim_markers(
        &mut self,
        spec: &'static HandlerSpec,
        ids: &[uuid::Uuid],
        texts: Option<&[String]>,
        layout: Layout,
    ) -> impl Future<Output = QueryResult<Vec<uuid::Uuid>>> + Send;

    /// Commits the handler's transaction, failing if it had been aborted.
    #[doc(hidden)]
    fn commit_inbox_transaction(&mut self) -> impl Future<Output = QueryResult<()>> + Send;

    /// Rolls the handler's transaction back if it is open.
    #[doc(hidden)]
    fn roll_back_inbox_transaction(&mut self) -> impl Future<Output = QueryResult<()>> + Send;

    /// Opens a transaction holding the write lock from its start where the backend has one
    /// (SQLite's `BEGIN IMMEDIATE`).
    #[doc(hidden)]
    fn begin_write_transaction(&mut self) -> impl Future<Output = QueryResult<()>> + Send;

    /// Claim mode: checks that no transaction is open and prepares the connection.
    #[doc(hidden)]
    fn prepare_claim(
        &mut self,
        spec: &'static HandlerSpec,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// The backend, for the SQL that is not written once.
    #[doc(hidden)]
    const BACKEND: crate::schema::Backend;
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

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

impl<C, R, B> driver::Body<C, R> for Cloned<B>
where
    B: Clone + for<'c> AsyncBody<&'c mut C, R, Fut: Send>,
{
    async fn call(&mut self, conn: &mut C) -> R {
        (self.0.clone())(conn).await
    }
}

/// A claim-mode body: each run is a clone, given no connection.
struct ClonedWithoutConnection<B>(B);

impl<C, R, B> driver::Body<C, R> for ClonedWithoutConnection<B>
where
    B: Clone + for<'c> AsyncBody<&'c mut NoConnection, R, Fut: Send>,
{
    async fn call(&mut self, _: &mut C) -> R {
        let mut none = NoConnection::new();
        (self.0.clone())(&mut none).await
    }
}

/// Runs `body` once per message key and consumer, on a diesel-async connection; see
/// `driver::drive` for the steps.
pub async fn run_async<C, T, E, B, P>(
    conn: &mut C,
    spec: &'static HandlerSpec,
    key: Result<MessageKey, KeyError>,
    body: B,
    probe: P,
    inbox_error: fn(Error) -> E,
) -> Result<Outcome<T>, E>
where
    C: AsyncInboxConnection,
    B: Clone + for<'c> AsyncBody<&'c mut C, Result<T, E>, Fut: Send>,
    P: Fn(&Result<T, E>) -> Option<ErrorClass>,
{
    let key = key.map_err(|e| inbox_error(Error::InvalidKey(e)))?;
    // The stored id, not the key: a key can be business data (an e-mail address) or carry
    // control characters; the key itself is logged escaped, at DEBUG (`driver`).
    let span = tracing::info_span!(
        "inbox",
        consumer = spec.consumer.as_str(),
        message_id = %key.stored_id()
    );
    let value = driver::drive(Awaiting(conn), spec, &key, Cloned(body), probe, inbox_error)
        .instrument(span)
        .await?;
    Ok(driver::outcome(spec, key, value))
}

/// Runs `body` once for the messages of a batch that are new, in one transaction, on a
/// diesel-async connection; see `driver::drive` for the steps.
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
    P: Fn(&Result<T, E>) -> Option<ErrorClass>,
{
    let keys = keys.map_err(|e| inbox_error(Error::InvalidKey(e)))?;
    if keys.is_empty() {
        return Ok(driver::batch_outcome(0, None, new));
    }
    let span = tracing::info_span!(
        "inbox",
        consumer = spec.consumer.as_str(),
        batch = keys.len()
    );
    let claims = BatchClaims::new(&keys, new);
    let value = driver::drive(
        Awaiting(conn),
        spec,
        &claims,
        Cloned(body),
        probe,
        inbox_error,
    )
    .instrument(span)
    .await?;
    Ok(driver::batch_outcome(keys.len(), value.value(), new))
}

/// Runs `body` in claim mode, on a diesel-async connection; see `driver::drive_claim` for
/// the steps.
pub async fn run_claim_async<C, T, E, B>(
    conn: &mut C,
    spec: &'static HandlerSpec,
    claim: ClaimSpec,
    key: Result<MessageKey, KeyError>,
    body: B,
    inbox_error: fn(Error) -> E,
) -> Result<Outcome<T>, E>
where
    C: AsyncInboxConnection,
    B: Clone + for<'c> AsyncBody<&'c mut NoConnection, Result<T, E>, Fut: Send>,
{
    let key = key.map_err(|e| inbox_error(Error::InvalidKey(e)))?;
    let span = tracing::info_span!("inbox", consumer = spec.consumer.as_str(), mode = "claim");
    driver::drive_claim(
        Awaiting(conn),
        spec,
        claim,
        key,
        ClonedWithoutConnection(body),
        inbox_error,
    )
    .instrument(span)
    .await
}

impl<C: AsyncInboxConnection> Steps for Awaiting<'_, C> {
    type Conn = C;

    fn conn(&mut self) -> &mut C {
        self.0
    }

    async fn begin(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()> {
        self.0.begin_inbox_transaction(spec, layout.mariadb).await
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
        self.0.claim_marker(spec, key, layout).await
    }

    async fn claim_batch(
        &mut self,
        spec: &'static HandlerSpec,
        ids: &[uuid::Uuid],
        texts: Option<&[String]>,
        layout: Layout,
    ) -> QueryResult<Vec<uuid::Uuid>> {
        self.0.claim_markers(spec, ids, texts, layout).await
    }

    async fn commit(&mut self) -> QueryResult<()> {
        self.0.commit_inbox_transaction().await
    }

    async fn roll_back(&mut self) -> QueryResult<()> {
        self.0.roll_back_inbox_transaction().await
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

    async fn verify(
        &mut self,
        spec: &'static HandlerSpec,
    ) -> Result<Layout, crate::verify::SchemaError> {
        crate::schema::verify_layout_async(self.0, &spec.schema).await
    }

    async fn claim_step(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        step: ClaimStep,
    ) -> QueryResult<ClaimAnswer> {
        crate::claim::step(self, &spec.schema, spec.consumer.as_str(), key, step).await
    }

    async fn pause(&mut self, delay: Duration) {
        tokio::time::sleep(delay).await;
    }
}

/// The items of [`AsyncInboxConnection`] that read the same on the diesel-async connections
/// of the server backends: `$variant` names the [`Backend`](crate::schema::Backend), `$backend`
/// diesel's backend type. A macro rather than generic functions: their bounds on
/// diesel-async's query traits the compiler cannot prove `Send` for every lifetime.
#[cfg(any(feature = "postgres", feature = "mysql"))]
macro_rules! server_steps {
    ($variant:ident, $backend:ty) => {
        const BACKEND: crate::schema::Backend = crate::schema::Backend::$variant;

        /// PostgreSQL: READ COMMITTED, so that each statement sees what committed before it.
        async fn begin_write_transaction(&mut self) -> QueryResult<()> {
            use diesel_async::TransactionManager;
            match Self::BACKEND {
                crate::schema::Backend::Postgres => {
                    diesel_async::AnsiTransactionManager::begin_transaction_sql(
                        self,
                        "BEGIN ISOLATION LEVEL READ COMMITTED",
                    )
                    .await
                }
                _ => diesel_async::AnsiTransactionManager::begin_transaction(self).await,
            }
        }

        /// `Ok` when no transaction is open.
        async fn roll_back_inbox_transaction(&mut self) -> QueryResult<()> {
            use diesel_async::TransactionManager;
            match diesel_async::AnsiTransactionManager::rollback_transaction(self).await {
                Err(diesel::result::Error::NotInTransaction) => Ok(()),
                other => other,
            }
        }

        async fn prepare_claim(&mut self, _spec: &'static HandlerSpec) -> QueryResult<()> {
            use diesel_async::TransactionManager;
            crate::backend::refuse_open_transaction(
                diesel_async::AnsiTransactionManager::transaction_manager_status_mut(self),
            )
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

    use super::*;
    use diesel::pg::Pg;
    use diesel_async::{AnsiTransactionManager, TransactionManager};

    use crate::dialect::marker::ClaimMarker;

    impl sealed::Sealed for AsyncPgConnection {}

    impl AsyncInboxConnection for AsyncPgConnection {
        server_steps!(Postgres, Pg);

        async fn begin_inbox_transaction(
            &mut self,
            spec: &'static HandlerSpec,
            _: bool,
        ) -> QueryResult<()> {
            AnsiTransactionManager::begin_transaction_sql(self, &spec.postgres_begin_sql()).await
        }

        async fn wait_for_locks(
            &mut self,
            _spec: &'static HandlerSpec,
            claimed: bool,
        ) -> QueryResult<()> {
            match claimed {
                true => self.batch_execute(HandlerSpec::POSTGRES_LOCK_WAIT).await,
                false => Ok(()),
            }
        }

        async fn claim_marker(
            &mut self,
            spec: &'static HandlerSpec,
            key: &MessageKey,
            layout: Layout,
        ) -> QueryResult<bool> {
            let id = key.stored_id();
            let text = layout
                .key_text
                .then(|| crate::dialect::layout::key_text(key));
            let claim = ClaimMarker::<Pg>::new(
                &spec.schema,
                spec.consumer.as_str(),
                &id,
                text.as_deref(),
                None,
            );
            let rows: Vec<i64> = RunQueryDsl::load(claim, self).await?;
            Ok(!rows.is_empty())
        }

        async fn claim_markers(
            &mut self,
            spec: &'static HandlerSpec,
            ids: &[uuid::Uuid],
            texts: Option<&[String]>,
            _layout: Layout,
        ) -> QueryResult<Vec<uuid::Uuid>> {
            let claim = crate::dialect::marker::ClaimMarkers::<Pg, diesel::sql_types::Uuid>::new(
                &spec.schema,
                spec.consumer.as_str(),
                ids,
                texts,
            );
            RunQueryDsl::load(claim, self).await
        }

        /// PostgreSQL answers `COMMIT` in an aborted transaction with a silent `ROLLBACK`. The
        /// sync runtime sends `SELECT 1` in the same round trip as `COMMIT`; diesel-async's
        /// transaction manager sends its own `COMMIT`, so the `SELECT 1` that fails with 25P02
        /// in exactly that case goes first, on its own.
        async fn commit_inbox_transaction(&mut self) -> QueryResult<()> {
            SimpleAsyncConnection::batch_execute(self, "SELECT 1").await?;
            AnsiTransactionManager::commit_transaction(self).await
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use diesel::SqliteConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

    use super::*;
    use crate::InboxConnection;

    impl sealed::Sealed for SyncConnectionWrapper<SqliteConnection> {}

    /// SQLite runs on a blocking thread: each step is the sync runtime's own, sent there.
    impl AsyncInboxConnection for SyncConnectionWrapper<SqliteConnection> {
        const BACKEND: crate::schema::Backend = crate::schema::Backend::Sqlite;

        async fn begin_inbox_transaction(
            &mut self,
            spec: &'static HandlerSpec,
            _: bool,
        ) -> QueryResult<()> {
            self.spawn_blocking(move |conn| conn.begin_inbox_transaction(spec, false))
                .await
        }

        async fn begin_write_transaction(&mut self) -> QueryResult<()> {
            self.spawn_blocking(move |conn| conn.begin_write_transaction())
                .await
        }

        async fn claim_marker(
            &mut self,
            spec: &'static HandlerSpec,
            key: &MessageKey,
            layout: Layout,
        ) -> QueryResult<bool> {
            let key = key.clone();
            self.spawn_blocking(move |conn| {
                conn.claim_marker(&spec.schema, spec.consumer.as_str(), &key, layout)
            })
            .await
        }

        async fn claim_markers(
            &mut self,
            spec: &'static HandlerSpec,
            ids: &[uuid::Uuid],
            texts: Option<&[String]>,
            layout: Layout,
        ) -> QueryResult<Vec<uuid::Uuid>> {
            let ids = ids.to_vec();
            let texts = texts.map(<[String]>::to_vec);
            self.spawn_blocking(move |conn| {
                conn.claim_markers(
                    &spec.schema,
                    spec.consumer.as_str(),
                    &ids,
                    texts.as_deref(),
                    layout,
                )
            })
            .await
        }

        async fn commit_inbox_transaction(&mut self) -> QueryResult<()> {
            self.spawn_blocking(|conn| conn.commit_inbox_transaction())
                .await
        }

        async fn roll_back_inbox_transaction(&mut self) -> QueryResult<()> {
            self.spawn_blocking(|conn| conn.roll_back_inbox_transaction())
                .await
        }

        async fn prepare_claim(&mut self, spec: &'static HandlerSpec) -> QueryResult<()> {
            self.spawn_blocking(move |conn| conn.prepare_claim(spec))
                .await
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use diesel::mysql::Mysql;
    use diesel_async::{
        AnsiTransactionManager, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection,
        TransactionManager,
    };

    use super::*;
    use crate::dialect::marker::{ClaimMarker, inserted_unless_duplicate};

    impl sealed::Sealed for AsyncMysqlConnection {}

    impl AsyncInboxConnection for AsyncMysqlConnection {
        server_steps!(Mysql, Mysql);

        async fn begin_inbox_transaction(
            &mut self,
            spec: &'static HandlerSpec,
            mariadb: bool,
        ) -> QueryResult<()> {
            AnsiTransactionManager::begin_transaction_sql(self, &spec.mysql_begin_sql(mariadb))
                .await
        }

        async fn end_inbox_transaction(
            &mut self,
            spec: &'static HandlerSpec,
            mariadb: bool,
        ) -> QueryResult<()> {
            if mariadb && spec.idle_in_transaction_ms > 0 {
                RunQueryDsl::execute(diesel::sql_query(HandlerSpec::MARIADB_IDLE_RESTORE), self)
                    .await?;
            }
            Ok(())
        }

        async fn wait_for_locks(
            &mut self,
            _spec: &'static HandlerSpec,
            _claimed: bool,
        ) -> QueryResult<()> {
            SimpleAsyncConnection::batch_execute(self, HandlerSpec::MYSQL_LOCK_WAIT).await
        }

        async fn claim_marker(
            &mut self,
            spec: &'static HandlerSpec,
            key: &MessageKey,
            layout: Layout,
        ) -> QueryResult<bool> {
            let id = key.stored_id();
            let text = layout
                .key_text
                .then(|| crate::dialect::layout::key_text(key));
            let claim = ClaimMarker::<Mysql>::new(
                &spec.schema,
                spec.consumer.as_str(),
                &id,
                text.as_deref(),
                layout.session_mark,
            );
            let inserted = RunQueryDsl::execute(claim, self).await;
            Ok(inserted_unless_duplicate(inserted, &spec.schema)? > 0)
        }

        /// Row by row, as the sync connection does.
        async fn claim_markers(
            &mut self,
            spec: &'static HandlerSpec,
            ids: &[uuid::Uuid],
            texts: Option<&[String]>,
            layout: Layout,
        ) -> QueryResult<Vec<uuid::Uuid>> {
            let mut inserted = Vec::with_capacity(ids.len());
            for (n, id) in ids.iter().enumerate() {
                let text = texts.map(|texts| texts[n].as_str());
                let claim = ClaimMarker::<Mysql>::new(
                    &spec.schema,
                    spec.consumer.as_str(),
                    id,
                    text,
                    layout.session_mark,
                );
                let result = RunQueryDsl::execute(claim, self).await;
                if inserted_unless_duplicate(result, &spec.schema)? > 0 {
                    inserted.push(*id);
                }
            }
            Ok(inserted)
        }

        async fn commit_inbox_transaction(&mut self) -> QueryResult<()> {
            AnsiTransactionManager::commit_transaction(self).await
        }
    }
}
