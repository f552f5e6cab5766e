//! One connection interface for both IO models: the statements the runtime sends — text and
//! binds — and an [`Io`] that runs them, implemented by [`Blocking`] over a sync diesel
//! connection and by [`Awaiting`] over a diesel-async one.
//!
//! The algorithms (the purge's batches, the startup check's catalog, get-or-create's
//! transactions) are written once as `async fn`s over `Io`. The async entry points await
//! them; the sync ones run them with [`complete_now`]: every method of `Blocking` has done
//! its work when it returns, so the future completes in its first poll.

use std::borrow::Cow;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use diesel::QueryResult;
use diesel::connection::TransactionManagerStatus;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};

use crate::dialect::Dialect;

/// A value bound to a statement.
#[derive(Debug, Clone)]
pub enum Bind {
    BigInt(i64),
    Text(String),
}

/// A statement: SQL text with `?` (or `$n`) placeholders, and the values bound to them.
#[derive(Debug, Clone)]
pub struct Sql {
    text: Cow<'static, str>,
    binds: Vec<Bind>,
}

impl Sql {
    pub(crate) fn new(text: impl Into<Cow<'static, str>>) -> Self {
        Self {
            text: text.into(),
            binds: Vec::new(),
        }
    }

    pub(crate) fn bind_i64(mut self, value: i64) -> Self {
        self.binds.push(Bind::BigInt(value));
        self
    }

    pub(crate) fn bind_text(mut self, value: impl Into<String>) -> Self {
        self.binds.push(Bind::Text(value.into()));
        self
    }

    /// The statement as diesel runs it: a boxed `sql_query`, prepared and cached by its text.
    pub(crate) fn query<DB: Dialect>(&self) -> BoxedSqlQuery<'_, DB, SqlQuery> {
        self.binds.iter().fold(
            diesel::sql_query(self.text.as_ref()).into_boxed(),
            |query, bind| match bind {
                Bind::BigInt(value) => DB::bind_i64(query, value),
                Bind::Text(value) => DB::bind_text(query, value),
            },
        )
    }
}

/// What the runtime's algorithms do with a connection, sync or async.
pub(crate) trait Io {
    /// The diesel backend the statements are for.
    type Backend: Dialect;

    /// Runs a statement; the rows it changed.
    async fn execute(&mut self, sql: &Sql) -> QueryResult<usize>;

    /// Runs a query; its rows.
    async fn load<R: Row>(&mut self, sql: &Sql) -> QueryResult<Vec<R>>;

    /// The transaction manager's state: whether a transaction is open, or broken.
    fn transaction_status(&mut self) -> &mut TransactionManagerStatus;

    /// Waits, between batches or before a retry.
    async fn sleep(&mut self, pause: Duration);
}

/// A row the runtime reads: one the derive `QueryableByName` reads on every enabled backend.
pub trait Row: Send + 'static + rows::OnPostgres + rows::OnMysql + rows::OnSqlite {}

impl<R: Send + 'static + rows::OnPostgres + rows::OnMysql + rows::OnSqlite> Row for R {}

/// [`Row`]'s parts, one per backend, empty where the backend's feature is off: each backend's
/// [`Dialect`] reads rows through its own part, where the backend is a concrete type.
pub mod rows {
    #[cfg(feature = "postgres")]
    pub trait OnPostgres: diesel::QueryableByName<diesel::pg::Pg> {}
    #[cfg(feature = "postgres")]
    impl<R: diesel::QueryableByName<diesel::pg::Pg>> OnPostgres for R {}
    #[cfg(not(feature = "postgres"))]
    pub trait OnPostgres {}
    #[cfg(not(feature = "postgres"))]
    impl<R> OnPostgres for R {}

    #[cfg(feature = "mysql")]
    pub trait OnMysql: diesel::QueryableByName<diesel::mysql::Mysql> {}
    #[cfg(feature = "mysql")]
    impl<R: diesel::QueryableByName<diesel::mysql::Mysql>> OnMysql for R {}
    #[cfg(not(feature = "mysql"))]
    pub trait OnMysql {}
    #[cfg(not(feature = "mysql"))]
    impl<R> OnMysql for R {}

    #[cfg(feature = "sqlite")]
    pub trait OnSqlite: diesel::QueryableByName<diesel::sqlite::Sqlite> {}
    #[cfg(feature = "sqlite")]
    impl<R: diesel::QueryableByName<diesel::sqlite::Sqlite>> OnSqlite for R {}
    #[cfg(not(feature = "sqlite"))]
    pub trait OnSqlite {}
    #[cfg(not(feature = "sqlite"))]
    impl<R> OnSqlite for R {}
}

/// A statement run on a sync connection of a backend `DB`, whose query diesel can run there:
/// what each backend's [`Dialect::execute`] calls, with `DB` concrete.
pub(crate) fn execute<DB, C>(conn: &mut C, sql: &Sql) -> QueryResult<usize>
where
    DB: Dialect,
    C: diesel::Connection<Backend = DB>,
    for<'f> BoxedSqlQuery<'f, DB, SqlQuery>: diesel::query_dsl::methods::ExecuteDsl<C>,
{
    diesel::RunQueryDsl::execute(sql.query::<DB>(), conn)
}

/// A query run on a sync connection: what each backend's [`Dialect::load`] calls.
pub(crate) fn load<DB, C, R>(conn: &mut C, sql: &Sql) -> QueryResult<Vec<R>>
where
    DB: Dialect,
    C: diesel::connection::LoadConnection<Backend = DB>,
    for<'f> BoxedSqlQuery<'f, DB, SqlQuery>: diesel::query_dsl::LoadQuery<'f, C, R>,
{
    diesel::RunQueryDsl::load(sql.query::<DB>(), conn)
}

/// A statement run on a diesel-async connection: what each backend's
/// [`Dialect::execute_async`] calls.
#[cfg(feature = "async")]
pub(crate) async fn execute_async<DB, C>(conn: &mut C, sql: &Sql) -> QueryResult<usize>
where
    DB: Dialect,
    C: diesel_async::AsyncConnection<Backend = DB>,
    for<'f> BoxedSqlQuery<'f, DB, SqlQuery>: diesel_async::methods::ExecuteDsl<C>,
{
    diesel_async::RunQueryDsl::execute(sql.query::<DB>(), conn).await
}

/// A query run on a diesel-async connection: what each backend's [`Dialect::load_async`]
/// calls.
#[cfg(feature = "async")]
pub(crate) fn load_async<'c, DB, C, R>(
    conn: &'c mut C,
    sql: &'c Sql,
) -> impl Future<Output = QueryResult<Vec<R>>> + Send + 'c
where
    DB: Dialect,
    C: diesel_async::AsyncConnection<Backend = DB>,
    R: Send + 'static,
    BoxedSqlQuery<'c, DB, SqlQuery>: diesel_async::methods::LoadQuery<'c, C, R>,
{
    diesel_async::RunQueryDsl::load(sql.query::<DB>(), conn)
}

/// A sync diesel connection as an [`Io`]: each method completes before it returns.
pub(crate) struct Blocking<'c, C>(pub(crate) &'c mut C);

impl<C> Io for Blocking<'_, C>
where
    C: diesel::connection::LoadConnection<
            TransactionManager = diesel::connection::AnsiTransactionManager,
        >,
    C::Backend: Dialect,
{
    type Backend = C::Backend;

    async fn execute(&mut self, sql: &Sql) -> QueryResult<usize> {
        C::Backend::execute(self.0, sql)
    }

    async fn load<R: Row>(&mut self, sql: &Sql) -> QueryResult<Vec<R>> {
        C::Backend::load(self.0, sql)
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

#[cfg(feature = "async")]
impl<C> Io for Awaiting<'_, C>
where
    C: diesel_async::AsyncConnection,
    C::Backend: Dialect,
{
    type Backend = C::Backend;

    async fn execute(&mut self, sql: &Sql) -> QueryResult<usize> {
        C::Backend::execute_async(self.0, sql).await
    }

    async fn load<R: Row>(&mut self, sql: &Sql) -> QueryResult<Vec<R>> {
        C::Backend::load_async(self.0, sql).await
    }

    fn transaction_status(&mut self) -> &mut TransactionManagerStatus {
        use diesel_async::TransactionManager;
        C::TransactionManager::transaction_manager_status_mut(self.0)
    }

    async fn sleep(&mut self, pause: Duration) {
        tokio::time::sleep(pause).await;
    }
}

/// What get-or-create needs beyond statements: the connection itself, for the caller's
/// closures, and its transactions — a savepoint inside an open one.
pub(crate) trait Transactions: Io {
    /// The connection the caller's closures are given.
    type Conn;

    fn conn(&mut self) -> &mut Self::Conn;

    /// A transaction, or a savepoint inside the open one.
    async fn begin(&mut self) -> QueryResult<()>;

    /// `serialize_on`'s transaction: one holding the write lock from its start where the
    /// backend has one (SQLite's `BEGIN IMMEDIATE`), READ COMMITTED on PostgreSQL.
    async fn begin_write(&mut self) -> QueryResult<()>;

    async fn commit(&mut self) -> QueryResult<()>;

    async fn roll_back(&mut self) -> QueryResult<()>;
}

impl<C: crate::InboxConnection> Transactions for Blocking<'_, C> {
    type Conn = C;

    fn conn(&mut self) -> &mut C {
        self.0
    }

    async fn begin(&mut self) -> QueryResult<()> {
        use diesel::connection::TransactionManager;
        diesel::connection::AnsiTransactionManager::begin_transaction(self.0)
    }

    async fn begin_write(&mut self) -> QueryResult<()> {
        self.0.begin_write_transaction()
    }

    async fn commit(&mut self) -> QueryResult<()> {
        use diesel::connection::TransactionManager;
        diesel::connection::AnsiTransactionManager::commit_transaction(self.0)
    }

    async fn roll_back(&mut self) -> QueryResult<()> {
        use diesel::connection::TransactionManager;
        diesel::connection::AnsiTransactionManager::rollback_transaction(self.0)
    }
}

#[cfg(feature = "async")]
impl<C: crate::AsyncInboxConnection> Transactions for Awaiting<'_, C> {
    type Conn = C;

    fn conn(&mut self) -> &mut C {
        self.0
    }

    async fn begin(&mut self) -> QueryResult<()> {
        use diesel_async::TransactionManager;
        C::TransactionManager::begin_transaction(self.0).await
    }

    async fn begin_write(&mut self) -> QueryResult<()> {
        self.0.begin_write_transaction().await
    }

    async fn commit(&mut self) -> QueryResult<()> {
        use diesel_async::TransactionManager;
        C::TransactionManager::commit_transaction(self.0).await
    }

    async fn roll_back(&mut self) -> QueryResult<()> {
        use diesel_async::TransactionManager;
        C::TransactionManager::rollback_transaction(self.0).await
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
