//! The handler's connection as the runtime's steps see it: the connection itself, or the
//! variant of an application's enum of connections.

use super::*;

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
    ) -> QueryResult<crate::runtime::found::Presence> {
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
