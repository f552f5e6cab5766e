//! The handler's connection as the runtime's steps see it: the connection itself, or the
//! variant of an application's enum of connections.

use super::*;
use crate::runtime::handle::Handle;

/// The handler's connection, given to the body, and the connection the runtime's statements
/// run on: the same one, or an application's enum of connections and its variant
/// ([`HandlerConnection`]).
pub(crate) struct Projected<'c, O, C> {
    pub(super) outer: &'c mut O,
    pub(super) project: fn(&mut O) -> &mut C,
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
impl<O: Send, C: InboxConnection> crate::io::Io for Projected<'_, O, C> {
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

    async fn run<Q>(&mut self, query: Q) -> QueryResult<usize>
    where
        Q: diesel::query_builder::QueryFragment<C::Backend> + diesel::query_builder::QueryId + Send,
    {
        self.io().run(query).await
    }

    async fn insert_marker(
        &mut self,
        insert: crate::dialect::marker::ClaimMarker<'_, C::Backend>,
    ) -> QueryResult<usize> {
        self.io().insert_marker(insert).await
    }

    async fn insert_markers(
        &mut self,
        insert: crate::dialect::marker::ClaimMarkers<
            '_,
            C::Backend,
            <C::Backend as crate::dialect::BindId>::IdSql,
        >,
    ) -> QueryResult<Vec<uuid::Uuid>> {
        self.io().insert_markers(insert).await
    }

    async fn begin_sql(&mut self, sql: &str) -> QueryResult<()> {
        self.io().begin_sql(sql).await
    }

    async fn begin_transaction(&mut self) -> QueryResult<()> {
        self.io().begin_transaction().await
    }

    async fn commit_transaction(&mut self) -> QueryResult<()> {
        self.io().commit_transaction().await
    }

    async fn rollback_transaction(&mut self) -> QueryResult<()> {
        self.io().rollback_transaction().await
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
impl<O: Send, C: InboxConnection> crate::io::Transactions for Projected<'_, O, C> {
    type Conn = O;

    fn conn(&mut self) -> &mut O {
        self.outer
    }
}

impl<O: Send, C: InboxConnection> Handle for Projected<'_, O, C> {
    type Conn = O;
    type Armed = ();

    fn conn(&mut self) -> &mut O {
        self.outer
    }

    fn instrumentation(&mut self) -> &mut dyn diesel::connection::Instrumentation {
        diesel::Connection::instrumentation(self.inner())
    }

    fn place(&mut self) -> (usize, usize) {
        (
            std::ptr::from_mut(self.inner()).cast::<u8>() as usize,
            size_of::<C>(),
        )
    }

    fn arm(&mut self) {}

    fn stop_caching_statements(&mut self) {
        self.inner()
            .set_prepared_statement_cache_size(diesel::connection::CacheSize::Disabled);
    }
}
