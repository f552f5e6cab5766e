//! The runtime's [`Steps`], written once over a connection of either IO model: a
//! [`Handle`] is the connection's statements and transactions ([`Io`]) and the little the
//! steps read of the connection itself. Each IO model has one: [`Projected`] for a sync
//! connection (or the variant of an application's enum of them), [`Awaiting`] for a
//! diesel-async one. What differs between backends is their [`Session`].
//!
//! [`Projected`]: super::sync::Projected
//! [`Awaiting`]: crate::io::Awaiting

use std::time::Duration;

use diesel::QueryResult;
use inbox_core::MessageKey;

use crate::backends::Session;
use crate::dialect::catalog::Catalogs;
use crate::dialect::claim::{ClaimAnswer, ClaimStep};
use crate::dialect::layout::Layout;
use crate::dialect::marker::{Keeps, MarkerValues};
use crate::io::Io;
use crate::runtime::found::{Kept, Presence};
use crate::runtime::steps::Steps;
use crate::runtime::{checked, claim, stored};
use crate::schema::check::SchemaError;
use crate::spec::HandlerSpec;
use crate::value::Fingerprint;

/// A connection as the runtime's steps take it: its statements ([`Io`]), and what the steps
/// read of the connection itself.
pub(crate) trait Handle: Io {
    /// The connection the handler's body is given.
    type Conn;

    /// What [`arm`](Self::arm) returns: a guard over the statement about to be sent.
    type Armed: Disarm;

    /// Whether a delivery on this connection can be cancelled mid-way, its future dropped
    /// (an async handler): see [`Steps::CANCELLABLE`].
    const CANCELLABLE: bool = false;

    fn conn(&mut self) -> &mut Self::Conn;

    /// The connection's diesel instrumentation: where its [`Net`](crate::tripwire::net::Net)
    /// is, and part of what its startup check is remembered by.
    fn instrumentation(&mut self) -> &mut dyn diesel::connection::Instrumentation;

    /// The address and the size of the connection the runtime's statements run on.
    fn place(&mut self) -> (usize, usize);

    /// Armed before a statement that can wait on a lock (the marker's insert): on a
    /// diesel-async connection, a future dropped while it waits cancels it on the server
    /// ([`CancelIfDropped`](crate::backends::CancelIfDropped)).
    fn arm(&mut self) -> Self::Armed;

    /// Whether the connection's transaction manager says a statement of its own was cut off
    /// in the middle: see [`Steps::broken`].
    fn broken(&mut self) -> bool {
        false
    }

    /// Turns diesel's prepared-statement cache off: see [`Steps::stop_caching_statements`].
    fn stop_caching_statements(&mut self);
}

/// A guard [`Handle::arm`] returns, disarmed when the statement answered.
pub(crate) trait Disarm {
    fn disarm(self);
}

/// A sync connection's statement is never cut off by a dropped future.
impl Disarm for () {
    fn disarm(self) {}
}

#[cfg(feature = "async")]
impl Disarm for crate::backends::CancelIfDropped {
    fn disarm(self) {
        crate::backends::CancelIfDropped::disarm(self);
    }
}

/// How deep the transactions the manager counts are: 0 outside any, or where it is in error.
pub(crate) fn depth(status: &mut diesel::connection::TransactionManagerStatus) -> u32 {
    status
        .transaction_depth()
        .ok()
        .flatten()
        .map_or(0, std::num::NonZeroU32::get)
}

impl<H: Handle> Steps for H {
    type Conn = H::Conn;

    const CANCELLABLE: bool = H::CANCELLABLE;

    fn conn(&mut self) -> &mut H::Conn {
        Handle::conn(self)
    }

    fn net(&mut self) -> Option<usize> {
        crate::tripwire::net::Net::id(self.instrumentation())
    }

    fn identity(&mut self) -> usize {
        identity(self, <H::Backend as Catalogs>::MARKS_SESSIONS)
    }

    /// As the identity of a PostgreSQL connection: what stays with it, on every backend.
    fn address(&mut self) -> usize {
        identity(self, false)
    }

    fn in_transaction(&mut self) -> bool {
        H::CANCELLABLE && matches!(self.transaction_status().transaction_depth(), Ok(Some(_)))
    }

    fn broken(&mut self) -> bool {
        Handle::broken(self)
    }

    fn abandon(&mut self) -> bool {
        let open = self.in_transaction();
        if open {
            self.transaction_status().set_in_error();
        }
        open
    }

    fn in_error(&mut self) -> bool {
        self.transaction_status().transaction_depth().is_err()
    }

    fn discard(&mut self) {
        self.transaction_status().set_in_error();
    }

    fn forget_transaction(&mut self) {
        *self.transaction_status() = Default::default();
    }

    async fn begin(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()> {
        H::Backend::begin(self, spec, layout)
            .await
            .map_err(crate::io::status::inside_callers)
    }

    async fn begin_with_claim(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
        keeps: Keeps,
    ) -> Option<QueryResult<bool>> {
        let armed = self.arm();
        let claimed = H::Backend::begin_with_claim(self, spec, key, layout, keeps).await;
        armed.disarm();
        claimed
    }

    fn defers_marker(&mut self, spec: &'static HandlerSpec, keeps: Keeps) -> bool {
        H::Backend::defers_marker(spec, keeps)
    }

    /// Armed: the insert waits for a marker another transaction holds uncommitted.
    async fn commit_with_marker(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
        values: MarkerValues<'_>,
    ) -> QueryResult<()> {
        let armed = self.arm();
        let committed = H::Backend::commit_with_marker(self, spec, key, layout, values).await;
        armed.disarm();
        committed
    }

    async fn end(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()> {
        H::Backend::end(self, spec, layout.mariadb).await
    }

    async fn claim(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
    ) -> QueryResult<bool> {
        let armed = self.arm();
        let claimed = H::Backend::claim_marker(self, spec, key, layout).await;
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
        let armed = self.arm();
        let claimed = H::Backend::claim_markers(self, spec, ids, texts, layout).await;
        armed.disarm();
        claimed
    }

    async fn commit(&mut self, spec: &'static HandlerSpec, layout: Layout) -> QueryResult<()> {
        H::Backend::commit(self, spec, layout.mariadb).await
    }

    async fn roll_back_and_end(
        &mut self,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> QueryResult<()> {
        H::Backend::roll_back_and_end(self, spec, layout.mariadb).await
    }

    async fn roll_back(&mut self) -> QueryResult<()> {
        H::Backend::roll_back(self).await
    }

    async fn roll_back_abandoned(&mut self) -> QueryResult<()> {
        H::Backend::roll_back_abandoned(self).await
    }

    fn stop_caching_statements(&mut self) {
        Handle::stop_caching_statements(self);
    }

    async fn ended_by_server(&mut self) -> bool {
        claim::ended_by_server(self).await
    }

    async fn ended_in_body(&mut self) -> bool {
        H::Backend::ended_in_body(self).await
    }

    async fn discard_foreign(&mut self) {
        let _ = self.batch("ROLLBACK").await;
        self.forget_transaction();
    }

    async fn verify(
        &mut self,
        spec: &'static HandlerSpec,
        claim: bool,
    ) -> Result<Layout, SchemaError> {
        H::Backend::prepare_check(self, spec)
            .await
            .map_err(SchemaError::Database)?;
        crate::schema::check::check_table(self, &spec.schema, claim).await
    }

    async fn wait_for_locks(
        &mut self,
        spec: &'static HandlerSpec,
        claimed: bool,
    ) -> QueryResult<()> {
        H::Backend::wait_for_locks(self, spec, claimed).await
    }

    async fn prepare_claim(&mut self, spec: &'static HandlerSpec) -> QueryResult<()> {
        H::Backend::prepare_claim(self, spec).await
    }

    async fn claim_step(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        step: ClaimStep,
    ) -> QueryResult<ClaimAnswer> {
        claim::step(self, &spec.schema, spec.consumer.as_str(), key, step).await
    }

    async fn markers_present(
        &mut self,
        spec: &'static HandlerSpec,
        ids: &[uuid::Uuid],
        latest: bool,
    ) -> QueryResult<Presence> {
        claim::present(self, &spec.schema, spec.consumer.as_str(), ids, latest).await
    }

    fn depth(&mut self) -> u32 {
        depth(self.transaction_status())
    }

    async fn savepoint(&mut self) -> QueryResult<()> {
        self.begin_transaction().await
    }

    async fn release(&mut self) -> QueryResult<()> {
        self.commit_transaction().await
    }

    async fn store_result(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        text: String,
        fingerprint: Option<Fingerprint>,
        attempt: Option<u32>,
    ) -> QueryResult<usize> {
        let consumer = spec.consumer.as_str();
        stored::write(
            self,
            &spec.schema,
            consumer,
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
        stored::read(self, &spec.schema, consumer, key, columns, latest).await
    }

    async fn write_fingerprint(
        &mut self,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        fingerprint: Fingerprint,
    ) -> QueryResult<usize> {
        let consumer = spec.consumer.as_str();
        stored::write_fingerprint(self, &spec.schema, consumer, key, fingerprint).await
    }

    async fn pause(&mut self, delay: Duration) {
        self.sleep(delay).await;
    }
}

/// What the connection's startup check is remembered by: 0 `per_handler`, or what stays
/// with the connection ([`checked::identity`]).
fn identity<H: Handle>(handle: &mut H, per_handler: bool) -> usize {
    let (at, size) = handle.place();
    let instrumentation = std::ptr::from_mut(handle.instrumentation());
    checked::identity(per_handler, at, size, instrumentation.cast::<u8>() as usize)
}
