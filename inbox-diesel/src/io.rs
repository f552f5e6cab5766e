//! One connection interface for both IO models: an [`Io`] that runs the runtime's
//! statements ([`Sql`]), implemented by [`Blocking`] over a sync diesel connection and by
//! [`Awaiting`] over a diesel-async one.
//!
//! The algorithms (the purge's batches, the startup check's catalog, get-or-create's
//! transactions) are written once as `async fn`s over `Io`. The async entry points await
//! them; the sync ones run them with [`complete_now`]: every method of `Blocking` has done
//! its work when it returns, so the future completes in its first poll.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use diesel::QueryResult;
use diesel::connection::TransactionManagerStatus;

use crate::dialect::claim::{ClaimRead, ClaimSql, ReadsClaims};
use crate::dialect::{Dialect, Row, Rows, Sql};

/// What the runtime's algorithms do with a connection, sync or async.
pub(crate) trait Io {
    /// The diesel backend the statements are for.
    type Backend: Dialect;

    /// Runs a statement; the rows it changed.
    async fn execute(&mut self, sql: &Sql) -> QueryResult<usize>;

    /// Runs a query; its rows.
    async fn load<R: Row>(&mut self, sql: &Sql) -> QueryResult<Vec<R>>;

    /// Runs SQL without parameters over the simple protocol (`batch_execute`).
    async fn batch(&mut self, sql: &str) -> QueryResult<()>;

    /// Runs a claim-mode statement (a query fragment: prepared once, cached by its SQL).
    async fn execute_claim(&mut self, sql: ClaimSql<'_, Self::Backend>) -> QueryResult<usize>;

    /// Reads a claim's state and attempt counter.
    async fn read_claim(
        &mut self,
        sql: ClaimRead<'_, Self::Backend>,
    ) -> QueryResult<Vec<crate::dialect::claim::ClaimRow>>;

    /// The transaction manager's state: whether a transaction is open, or broken.
    fn transaction_status(&mut self) -> &mut TransactionManagerStatus;

    /// Waits, between batches or before a retry.
    async fn sleep(&mut self, pause: Duration);
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
        crate::dialect::execute(self.0, sql)
    }

    async fn load<R: Row>(&mut self, sql: &Sql) -> QueryResult<Vec<R>> {
        C::Backend::load(self.0, sql)
    }

    async fn batch(&mut self, sql: &str) -> QueryResult<()> {
        diesel::connection::SimpleConnection::batch_execute(self.0, sql)
    }

    async fn execute_claim(&mut self, sql: ClaimSql<'_, C::Backend>) -> QueryResult<usize> {
        crate::dialect::execute_claim(self.0, sql)
    }

    async fn read_claim(
        &mut self,
        sql: ClaimRead<'_, C::Backend>,
    ) -> QueryResult<Vec<crate::dialect::claim::ClaimRow>> {
        C::Backend::read_claim(self.0, sql)
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
        crate::dialect::execute_async(self.0, sql).await
    }

    async fn load<R: Row>(&mut self, sql: &Sql) -> QueryResult<Vec<R>> {
        C::Backend::load_async(self.0, sql).await
    }

    async fn batch(&mut self, sql: &str) -> QueryResult<()> {
        diesel_async::SimpleAsyncConnection::batch_execute(self.0, sql).await
    }

    async fn execute_claim(&mut self, sql: ClaimSql<'_, C::Backend>) -> QueryResult<usize> {
        crate::dialect::execute_claim_async(self.0, sql).await
    }

    async fn read_claim(
        &mut self,
        sql: ClaimRead<'_, C::Backend>,
    ) -> QueryResult<Vec<crate::dialect::claim::ClaimRow>> {
        C::Backend::read_claim_async(self.0, sql).await
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

impl<C: crate::backends::InboxConnection> Transactions for Blocking<'_, C> {
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
impl<C: crate::backends::AsyncInboxConnection> Transactions for Awaiting<'_, C> {
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
