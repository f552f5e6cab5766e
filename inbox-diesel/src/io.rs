//! The one seam between the two IO models: an [`Io`] runs the runtime's statements
//! ([`Sql`], the marker's and claim mode's query fragments) and its transactions as the
//! connection's transaction manager counts them — implemented by [`Blocking`] over a sync
//! diesel connection and by [`Awaiting`] over a diesel-async one, the only two.
//!
//! Everything above is written once as `async fn`s over `Io`: each backend's handler
//! transaction ([`Session`], implemented in `backends/`), the runtime's steps, the purge's
//! batches, the startup check's catalog, get-or-create's transactions. The async entry
//! points await them; the sync ones run them with [`complete_now`]: every method of
//! `Blocking` has done its work when it returns, so the future completes in its first poll.

use std::borrow::Cow;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use diesel::QueryResult;
use diesel::connection::TransactionManagerStatus;
use diesel::query_builder::{QueryFragment, QueryId};
use uuid::Uuid;

use crate::dialect::catalog::{Catalogs, FactRow};
use crate::dialect::claim::{ClaimRead, ClaimRow, ClaimSql, ReadsClaims};
use crate::dialect::layout::Layout;
use crate::dialect::marker::{ClaimMarker, ClaimMarkers, InsertsMarkers, Keeps, MarkerValues};
use crate::dialect::{BindId, Row, Rows, Sql};
use crate::spec::HandlerSpec;
use inbox_core::{InboxSchema, MessageKey};

use crate::error::schema::SchemaError;

pub(crate) mod status;

/// What the runtime's algorithms do with a connection, sync or async: its statements, and
/// its transactions as the connection's transaction manager counts them. Every future is
/// `Send`, so that what is written once over `Io` is `Send` on a diesel-async connection
/// wherever the connection's type is generic.
pub trait Io: Send {
    /// The diesel backend the statements are for.
    type Backend: Session;

    /// Runs a statement; the rows it changed.
    fn execute(&mut self, sql: &Sql) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Runs a query; its rows.
    fn load<R: Row>(&mut self, sql: &Sql) -> impl Future<Output = QueryResult<Vec<R>>> + Send;

    /// Runs SQL without parameters over the simple protocol (`batch_execute`).
    fn batch(&mut self, sql: &str) -> impl Future<Output = QueryResult<()>> + Send;

    /// Runs a query fragment that returns no rows (prepared once, cached by its SQL): MySQL's
    /// marker inserts.
    fn run<Q>(&mut self, query: Q) -> impl Future<Output = QueryResult<usize>> + Send
    where
        Q: QueryFragment<Self::Backend> + QueryId + Send;

    /// Inserts one marker ([`InsertsMarkers::insert_marker`]): the rows it returned.
    fn insert_marker(
        &mut self,
        insert: ClaimMarker<'_, Self::Backend>,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Inserts markers ([`InsertsMarkers::insert_markers`]): the ids of those it inserted.
    fn insert_markers(
        &mut self,
        insert: ClaimMarkers<'_, Self::Backend, <Self::Backend as BindId>::IdSql>,
    ) -> impl Future<Output = QueryResult<Vec<Uuid>>> + Send;

    /// Runs a claim-mode statement (a query fragment: prepared once, cached by its SQL).
    fn execute_claim(
        &mut self,
        sql: ClaimSql<'_, Self::Backend>,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Reads a claim's state and attempt counter.
    fn read_claim(
        &mut self,
        sql: ClaimRead<'_, Self::Backend>,
    ) -> impl Future<Output = QueryResult<Vec<ClaimRow>>> + Send;

    /// Opens a transaction with `sql` (which must open exactly one), counted by the
    /// transaction manager as if it had sent its own `BEGIN`.
    fn begin_sql(&mut self, sql: &str) -> impl Future<Output = QueryResult<()>> + Send;

    /// The transaction manager's `BEGIN`: a transaction, or a savepoint inside the open one.
    fn begin_transaction(&mut self) -> impl Future<Output = QueryResult<()>> + Send;

    /// The transaction manager's `COMMIT` (or savepoint release).
    fn commit_transaction(&mut self) -> impl Future<Output = QueryResult<()>> + Send;

    /// The transaction manager's `ROLLBACK` (or rollback to the savepoint).
    fn rollback_transaction(&mut self) -> impl Future<Output = QueryResult<()>> + Send;

    /// The transaction manager's state: whether a transaction is open, or broken.
    fn transaction_status(&mut self) -> &mut TransactionManagerStatus;

    /// Waits, between batches or before a retry.
    fn sleep(&mut self, pause: Duration) -> impl Future<Output = ()> + Send;
}

/// The handler's transaction on one backend, written once for both IO models over
/// [`Io`]: how it opens (with the marker, where the backend can), claims, commits, rolls
/// back and puts back what it set for the session. Each backend's file implements it; the
/// runtime's steps call it with a sync connection's [`Blocking`](crate::io::Blocking) or a
/// diesel-async connection's [`Awaiting`](crate::io::Awaiting).
pub trait Session: crate::dialect::Dialect + InsertsMarkers + Catalogs {
    /// The statement that opens the handler's transaction, as the startup check's `layout`
    /// says (a MariaDB server; PostgreSQL messages to be set to English).
    fn begin_statement(spec: &'static HandlerSpec, layout: Layout) -> Cow<'static, str>;

    /// The statement that opens the handler's transaction with `key`'s marker inserted in
    /// it, in one round trip; `None` where the backend opens and claims in two steps (or
    /// the statement would not fit). Where the backend [defers](Self::defers_marker) a
    /// marker that `keeps` anything, the statement takes the key's lock and fails with
    /// [`MARKER_SEEN`](crate::dialect::marker::MARKER_SEEN) where the marker exists instead.
    fn begin_with_marker_statement(
        _spec: &'static HandlerSpec,
        _key: &MessageKey,
        _layout: Layout,
        _keeps: Keeps,
    ) -> Option<String> {
        None
    }

    /// What to send instead after `begun`, the statement of
    /// [`begin_with_marker_statement`](Self::begin_with_marker_statement), failed with
    /// `error`: `None`, the failure stands (PostgreSQL: the insert prepared on a session
    /// that lacked it).
    fn begin_again_statement(
        _spec: &'static HandlerSpec,
        _layout: Layout,
        _keeps: Keeps,
        _begun: &str,
        _error: &diesel::result::Error,
    ) -> Option<String> {
        None
    }

    /// Whether the marker of `spec`'s handler, keeping `keeps` beside its key (a stored
    /// result, a fingerprint), is written at the commit
    /// ([`commit_with_marker_statement`](Self::commit_with_marker_statement)) rather than
    /// at the start: one version of its row, where an insert and then an update of what it
    /// keeps would write two. The start then takes the key's lock, which a concurrent
    /// delivery waits for as it would for the marker, and looks for a marker committed
    /// before ([`begin_with_marker_statement`](Self::begin_with_marker_statement)). The
    /// inbox's unique index still decides: a marker that committed without the lock (a
    /// process of an older version) refuses the insert at the commit, the body's work is
    /// rolled back and the delivery answered as the duplicate it is.
    fn defers_marker(_spec: &'static HandlerSpec, _keeps: Keeps) -> bool {
        false
    }

    /// The marker's insert with `values`, then `COMMIT`, for a transaction
    /// [`begin_with_marker_statement`](Self::begin_with_marker_statement) opened with its
    /// marker [deferred](Self::defers_marker); `None` where the backend defers none.
    fn commit_with_marker_statement(
        _spec: &'static HandlerSpec,
        _key: &MessageKey,
        _layout: Layout,
        _values: MarkerValues<'_>,
    ) -> Option<String> {
        None
    }

    /// The statement that puts back what [`begin`](Self::begin) set for the session, after
    /// the handler's transaction ended — one that rolls back a transaction still open too;
    /// `None` where there is nothing to put back.
    fn end_statement(_mariadb: bool) -> Option<&'static str> {
        None
    }

    /// `on_locked = "in_flight"`: the statement that puts lock waits back as the session
    /// had them, after the marker's claim (`claimed`: it succeeded); `None`, nothing to send.
    fn lock_wait_statement(_claimed: bool) -> Option<&'static str> {
        None
    }

    /// The statement that opens [`begin_write`](Self::begin_write)'s transaction; `None`:
    /// the transaction manager's own.
    const BEGIN_WRITE: Option<&'static str> = None;

    /// Opens the handler's transaction ([`begin_statement`](Self::begin_statement)).
    fn begin<I: Io<Backend = Self>>(
        io: &mut I,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        async move { io.begin_sql(&Self::begin_statement(spec, layout)).await }
    }

    /// Opens the handler's transaction with `key`'s marker claimed in it, in one round trip
    /// where the backend can ([`begin_with_marker_statement`](Self::begin_with_marker_statement));
    /// `None` where it opens and claims in two steps, or a transaction is already open (the
    /// runtime's own begin then reports it). `Ok(false)`: the inbox's own index refused the
    /// marker, a duplicate proven by the server. After an error or a duplicate the
    /// transaction is counted open (it is aborted on the server), for the runtime's rollback
    /// to end it.
    ///
    /// With its marker [deferred](Self::defers_marker) (`keeps`), `Ok(true)` says that no
    /// marker exists yet and the key's lock is held; `Ok(false)` that the marker exists.
    fn begin_with_claim<I: Io<Backend = Self>>(
        io: &mut I,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
        keeps: Keeps,
    ) -> impl Future<Output = Option<QueryResult<bool>>> + Send {
        async move {
            if !status::none_open(io.transaction_status()) {
                return None;
            }
            let sql = Self::begin_with_marker_statement(spec, key, layout, keeps)?;
            let mut begun = io.begin_sql(&sql).await;
            if let Err(e) = &begun
                && let Some(again) = Self::begin_again_statement(spec, layout, keeps, &sql, e)
            {
                begun = io.begin_sql(&again).await;
            }
            Some(
                match status::claimed(begun, &spec.schema, io.transaction_status()) {
                    Err(e) if crate::dialect::marker::marker_seen(&e) => Ok(false),
                    claimed => claimed,
                },
            )
        }
    }

    /// Inserts the marker [deferred](Self::defers_marker) with `values` and commits, in one
    /// round trip ([`commit_with_marker_statement`](Self::commit_with_marker_statement)),
    /// as [`commit`](Self::commit) does otherwise. A refusal by the inbox's unique index is
    /// returned as it is: a marker committed without the key's lock.
    fn commit_with_marker<I: Io<Backend = Self>>(
        io: &mut I,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
        values: MarkerValues<'_>,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let sql = Self::commit_with_marker_statement(spec, key, layout, values);
        async move {
            let Some(sql) = sql else {
                return Err(diesel::result::Error::QueryBuilderError(
                    "the backend writes no marker at the commit".into(),
                ));
            };
            status::open(io.transaction_status())?;
            io.batch(&sql).await?;
            status::ended(io.transaction_status())
        }
    }

    /// After the handler's transaction ended (committed or rolled back): puts back what
    /// [`begin`](Self::begin) set for the session ([`end_statement`](Self::end_statement)).
    fn end<I: Io<Backend = Self>>(
        io: &mut I,
        _spec: &'static HandlerSpec,
        mariadb: bool,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        async move {
            let Some(sql) = Self::end_statement(mariadb) else {
                return Ok(());
            };
            io.batch(sql).await?;
            status::ended(io.transaction_status())
        }
    }

    /// `on_locked = "in_flight"`: lock waits as the session had them, after the marker's
    /// claim ([`lock_wait_statement`](Self::lock_wait_statement)).
    fn wait_for_locks<I: Io<Backend = Self>>(
        io: &mut I,
        _spec: &'static HandlerSpec,
        claimed: bool,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        async move {
            match Self::lock_wait_statement(claimed) {
                Some(sql) => io.batch(sql).await,
                None => Ok(()),
            }
        }
    }

    /// Inserts the marker unless it exists; `Ok(false)` when it already did. The key's text
    /// is written to `key_text` where the table has it. Written for a backend whose insert
    /// returns a row only where it wrote one (`ON CONFLICT … DO NOTHING RETURNING`:
    /// PostgreSQL, SQLite).
    fn claim_marker<I: Io<Backend = Self>>(
        io: &mut I,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
    ) -> impl Future<Output = QueryResult<bool>> + Send {
        async move {
            let id = key.stored_id();
            let text = layout
                .key_text
                .then(|| crate::dialect::layout::key_text(key));
            let consumer = spec.consumer.as_str();
            let insert =
                ClaimMarker::new(&spec.schema, consumer, &id, text.as_deref(), layout.mark());
            Ok(io.insert_marker(insert).await? > 0)
        }
    }

    /// Inserts the markers of `ids` (distinct) that do not exist yet; returns those it
    /// inserted. `texts`: the keys' texts, in the order of `ids`, written to `key_text`.
    /// Written, as [`claim_marker`](Self::claim_marker), for a backend whose insert returns
    /// the ids it wrote.
    fn claim_markers<I: Io<Backend = Self>>(
        io: &mut I,
        spec: &'static HandlerSpec,
        ids: &[Uuid],
        texts: Option<&[String]>,
        layout: Layout,
    ) -> impl Future<Output = QueryResult<Vec<Uuid>>> + Send {
        async move {
            let consumer = spec.consumer.as_str();
            let insert = ClaimMarkers::new(&spec.schema, consumer, ids, texts, layout.mark());
            io.insert_markers(insert).await
        }
    }

    /// Before the startup check's catalog reads, the first time a connection runs the
    /// handler.
    fn prepare_check<I: Io<Backend = Self>>(
        _io: &mut I,
        _spec: &'static HandlerSpec,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        async { Ok(()) }
    }

    /// Claim mode: checks that no transaction is open — each claim statement must commit on
    /// its own — and prepares the connection for them.
    fn prepare_claim<I: Io<Backend = Self>>(
        io: &mut I,
        _spec: &'static HandlerSpec,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let open = refuse_open_transaction(io.transaction_status());
        async move { open }
    }

    /// Commits the handler's transaction, failing if the transaction had been aborted, and
    /// puts back what [`begin`](Self::begin) set for the session: after it succeeded, the
    /// runtime sends no [`end`](Self::end).
    fn commit<I: Io<Backend = Self>>(
        io: &mut I,
        _spec: &'static HandlerSpec,
        _mariadb: bool,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        io.commit_transaction()
    }

    /// Rolls back the transaction of a duplicate and puts back what `begin` set for the
    /// session, as [`commit`](Self::commit) does: the [`end_statement`](Self::end_statement),
    /// which rolls back too, where there is one (MariaDB: one round trip).
    fn roll_back_and_end<I: Io<Backend = Self>>(
        io: &mut I,
        spec: &'static HandlerSpec,
        mariadb: bool,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        async move {
            match Self::end_statement(mariadb) {
                Some(_) => Self::end(io, spec, mariadb).await,
                None => Self::roll_back(io).await,
            }
        }
    }

    /// Opens the transaction of [`unique::serialize_on`](crate::unique::serialize_on): one
    /// that holds the database's write lock from its start where the backend has one
    /// (SQLite's `BEGIN IMMEDIATE`), one whose statements each see what committed before
    /// them on PostgreSQL (READ COMMITTED), a plain one elsewhere
    /// ([`BEGIN_WRITE`](Self::BEGIN_WRITE)).
    fn begin_write<I: Io<Backend = Self>>(
        io: &mut I,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        async move {
            match Self::BEGIN_WRITE {
                Some(sql) => io.begin_sql(sql).await,
                None => io.begin_transaction().await,
            }
        }
    }

    /// Rolls the handler's transaction back if it is open; `Ok` when none is.
    fn roll_back<I: Io<Backend = Self>>(
        io: &mut I,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        async move {
            match io.rollback_transaction().await {
                Err(diesel::result::Error::NotInTransaction) => Ok(()),
                other => other,
            }
        }
    }

    /// After the body failed: whether the transaction open is no longer the one the handler
    /// began — the body's own `ROLLBACK` or `COMMIT` ended it. `false` where the backend
    /// cannot tell: SQLite rolls a transaction back itself on some errors (a busy database,
    /// a full disk), so its savepoint's absence after a body's error does not say the body
    /// did; MySQL's and MariaDB's failures are read otherwise ([`Steps::ended_by_server`](crate::runtime::steps::Steps)).
    fn ended_in_body<I: Io<Backend = Self>>(_io: &mut I) -> impl Future<Output = bool> + Send {
        async { false }
    }

    /// The startup check, told of claim handlers: a session on which claim mode's
    /// statements would not commit each on its own refused (MySQL's `autocommit` off).
    fn refuse_autocommit_off<I: Io<Backend = Self>>(
        _io: &mut I,
        _schema: &InboxSchema,
    ) -> impl Future<Output = Result<(), SchemaError>> + Send {
        async { Ok(()) }
    }

    /// The startup check: a pooler that allows no transaction refused (PgBouncer in
    /// statement mode).
    fn refuse_statement_pooling<I: Io<Backend = Self>>(
        _io: &mut I,
        _schema: &InboxSchema,
    ) -> impl Future<Output = Result<(), SchemaError>> + Send {
        async { Ok(()) }
    }

    /// The startup check, before its reads: a statement timeout too short for them lifted,
    /// in a transaction of their own. Whether it began that transaction, which the check
    /// then ends.
    fn lift_statement_timeout<I: Io<Backend = Self>>(
        _io: &mut I,
    ) -> impl Future<Output = bool> + Send {
        async { false }
    }

    /// The startup check, first: the server's messages in English on this session, which
    /// the runtime reads some failures from. Whether it changed a setting that the handler's
    /// transactions then set again for themselves (PostgreSQL, [`Layout::english`]).
    /// `in_transaction`: the check's reads run in a transaction of their own
    /// ([`lift_statement_timeout`](Self::lift_statement_timeout)), which a refusal must not
    /// leave aborted.
    fn english_messages<I: Io<Backend = Self>>(
        _io: &mut I,
        _schema: &InboxSchema,
        _in_transaction: bool,
    ) -> impl Future<Output = Result<bool, SchemaError>> + Send {
        async { Ok(false) }
    }

    /// The startup check, told of claim handlers: a role whose new sessions speak another
    /// language refused (PostgreSQL: claim mode's statements run on whichever server session
    /// a pooler has free).
    fn refuse_default_messages_for_claims<I: Io<Backend = Self>>(
        _io: &mut I,
        _schema: &InboxSchema,
    ) -> impl Future<Output = Result<(), SchemaError>> + Send {
        async { Ok(()) }
    }

    /// The startup check, with the catalog: the server's version and its packet limit
    /// (MySQL, MariaDB); nothing elsewhere.
    fn read_server<I: Io<Backend = Self>>(
        _io: &mut I,
    ) -> impl Future<Output = QueryResult<(String, u64)>> + Send {
        async { Ok((String::new(), 0)) }
    }

    /// The startup check, of a table that exists: the facts the catalog's query cannot
    /// read (MySQL and MariaDB: the privileges the handler's statements take, the server's
    /// durability); none elsewhere. `server` as [`read_server`](Self::read_server) read it.
    fn more_facts<I: Io<Backend = Self>>(
        _io: &mut I,
        _schema: &InboxSchema,
        _claim: bool,
        _key_text: bool,
        _server: &str,
    ) -> impl Future<Output = QueryResult<Vec<FactRow>>> + Send {
        async { Ok(Vec::new()) }
    }

    /// Rolls back the transaction a cancelled handler left open, which the manager no longer
    /// counts (sent as it is), and puts back what its `begin` set for the session, which it
    /// never did.
    fn roll_back_abandoned<I: Io<Backend = Self>>(
        io: &mut I,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        io.batch("ROLLBACK")
    }
}

/// `AlreadyInTransaction` when the transaction manager whose `status` this is — diesel's or
/// diesel-async's, which share the type — has a transaction open: claim mode's statements
/// and purge's batches must commit as they run, not when the caller's transaction does.
pub(crate) fn refuse_open_transaction(
    status: &mut diesel::connection::TransactionManagerStatus,
) -> QueryResult<()> {
    match status.transaction_depth()? {
        Some(_) => Err(diesel::result::Error::AlreadyInTransaction),
        None => Ok(()),
    }
}

/// A sync diesel connection as an [`Io`]: each method completes before it returns.
pub(crate) struct Blocking<'c, C>(pub(crate) &'c mut C);

impl<C> Io for Blocking<'_, C>
where
    C: diesel::connection::LoadConnection<
            TransactionManager = diesel::connection::AnsiTransactionManager,
        > + Send,
    C::Backend: Session,
{
    type Backend = C::Backend;

    async fn execute(&mut self, sql: &Sql) -> QueryResult<usize> {
        crate::dialect::execute(self.0, sql)
    }

    async fn load<R: Row>(&mut self, sql: &Sql) -> QueryResult<Vec<R>> {
        C::Backend::load(self.0, sql)
    }

    async fn batch(&mut self, sql: &str) -> QueryResult<()> {
        diesel::connection::SimpleConnection::batch_execute(self.0, sql)
    }

    async fn run<Q>(&mut self, query: Q) -> QueryResult<usize>
    where
        Q: QueryFragment<C::Backend> + QueryId + Send,
    {
        diesel::query_dsl::methods::ExecuteDsl::execute(query, self.0)
    }

    async fn insert_marker(&mut self, insert: ClaimMarker<'_, C::Backend>) -> QueryResult<usize> {
        C::Backend::insert_marker(self.0, insert)
    }

    async fn insert_markers(
        &mut self,
        insert: ClaimMarkers<'_, C::Backend, <C::Backend as BindId>::IdSql>,
    ) -> QueryResult<Vec<Uuid>> {
        C::Backend::insert_markers(self.0, insert)
    }

    async fn execute_claim(&mut self, sql: ClaimSql<'_, C::Backend>) -> QueryResult<usize> {
        crate::dialect::execute_claim(self.0, sql)
    }

    async fn read_claim(&mut self, sql: ClaimRead<'_, C::Backend>) -> QueryResult<Vec<ClaimRow>> {
        C::Backend::read_claim(self.0, sql)
    }

    async fn begin_sql(&mut self, sql: &str) -> QueryResult<()> {
        diesel::connection::AnsiTransactionManager::begin_transaction_sql(self.0, sql)
    }

    async fn begin_transaction(&mut self) -> QueryResult<()> {
        use diesel::connection::TransactionManager;
        diesel::connection::AnsiTransactionManager::begin_transaction(self.0)
    }

    async fn commit_transaction(&mut self) -> QueryResult<()> {
        use diesel::connection::TransactionManager;
        diesel::connection::AnsiTransactionManager::commit_transaction(self.0)
    }

    async fn rollback_transaction(&mut self) -> QueryResult<()> {
        use diesel::connection::TransactionManager;
        diesel::connection::AnsiTransactionManager::rollback_transaction(self.0)
    }

    fn transaction_status(&mut self) -> &mut TransactionManagerStatus {
        use diesel::connection::TransactionManager;
        diesel::connection::AnsiTransactionManager::transaction_manager_status_mut(self.0)
    }

    async fn sleep(&mut self, pause: Duration) {
        std::thread::sleep(pause);
    }
}

/// A diesel-async connection as an [`Io`].
#[cfg(feature = "async")]
pub(crate) struct Awaiting<'c, C>(pub(crate) &'c mut C);

/// How a diesel-async connection's transaction manager opens a transaction with SQL
/// ([`Io::begin_sql`]): diesel-async's `AnsiTransactionManager` has it for PostgreSQL and
/// MySQL, and SQLite's, run on a blocking thread, is diesel's.
#[cfg(feature = "async")]
pub trait BeginWithSql {
    /// Opens a transaction with `sql`, counted by the transaction manager.
    fn begin_sql(&mut self, sql: &str) -> impl Future<Output = QueryResult<()>> + Send;
}

#[cfg(feature = "async")]
impl<C> Io for Awaiting<'_, C>
where
    C: diesel_async::AsyncConnection<Backend: Session> + BeginWithSql + Send,
{
    type Backend = C::Backend;

    async fn execute(&mut self, sql: &Sql) -> QueryResult<usize> {
        crate::dialect::execute_async(self.0, sql).await
    }

    async fn load<R: Row>(&mut self, sql: &Sql) -> QueryResult<Vec<R>> {
        C::Backend::load_async(self.0, sql).await
    }

    async fn batch(&mut self, sql: &str) -> QueryResult<()> {
        diesel_async::SimpleAsyncConnection::batch_execute(self.0, sql).await
    }

    async fn run<Q>(&mut self, query: Q) -> QueryResult<usize>
    where
        Q: QueryFragment<C::Backend> + QueryId + Send,
    {
        diesel_async::methods::ExecuteDsl::execute(query, self.0).await
    }

    async fn insert_marker(&mut self, insert: ClaimMarker<'_, C::Backend>) -> QueryResult<usize> {
        C::Backend::insert_marker_async(self.0, insert).await
    }

    async fn insert_markers(
        &mut self,
        insert: ClaimMarkers<'_, C::Backend, <C::Backend as BindId>::IdSql>,
    ) -> QueryResult<Vec<Uuid>> {
        C::Backend::insert_markers_async(self.0, insert).await
    }

    async fn execute_claim(&mut self, sql: ClaimSql<'_, C::Backend>) -> QueryResult<usize> {
        crate::dialect::execute_claim_async(self.0, sql).await
    }

    async fn read_claim(&mut self, sql: ClaimRead<'_, C::Backend>) -> QueryResult<Vec<ClaimRow>> {
        C::Backend::read_claim_async(self.0, sql).await
    }

    async fn begin_sql(&mut self, sql: &str) -> QueryResult<()> {
        BeginWithSql::begin_sql(self.0, sql).await
    }

    async fn begin_transaction(&mut self) -> QueryResult<()> {
        use diesel_async::TransactionManager;
        C::TransactionManager::begin_transaction(self.0).await
    }

    async fn commit_transaction(&mut self) -> QueryResult<()> {
        use diesel_async::TransactionManager;
        C::TransactionManager::commit_transaction(self.0).await
    }

    async fn rollback_transaction(&mut self) -> QueryResult<()> {
        use diesel_async::TransactionManager;
        C::TransactionManager::rollback_transaction(self.0).await
    }

    fn transaction_status(&mut self) -> &mut TransactionManagerStatus {
        use diesel_async::TransactionManager;
        C::TransactionManager::transaction_manager_status_mut(self.0)
    }

    async fn sleep(&mut self, pause: Duration) {
        tokio::time::sleep(pause).await;
    }
}

/// What get-or-create needs beyond [`Io`]: the connection itself, for the caller's closures,
/// and `serialize_on`'s transaction.
pub(crate) trait Transactions: Io + Sized {
    /// The connection the caller's closures are given.
    type Conn;

    fn conn(&mut self) -> &mut Self::Conn;

    /// `serialize_on`'s transaction: one holding the write lock from its start where the
    /// backend has one (SQLite's `BEGIN IMMEDIATE`), READ COMMITTED on PostgreSQL.
    async fn begin_write(&mut self) -> QueryResult<()> {
        Self::Backend::begin_write(self).await
    }
}

impl<C> Transactions for Blocking<'_, C>
where
    Self: Io,
{
    type Conn = C;

    fn conn(&mut self) -> &mut C {
        self.0
    }
}

#[cfg(feature = "async")]
impl<C> Transactions for Awaiting<'_, C>
where
    Self: Io,
{
    type Conn = C;

    fn conn(&mut self) -> &mut C {
        self.0
    }
}

/// Runs a future that never waits to completion in one poll: how the sync entry points run
/// the algorithms over [`Blocking`].
pub(crate) fn complete_now<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("the steps of a sync connection never wait"),
    }
}
