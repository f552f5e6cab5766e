//! bb8 (feature `bb8`): a pool whose checkouts inside a handler are refused with an error,
//! and a check on checkout for the plain pool.
//!
//! ```
//! use diesel::SqliteConnection;
//! use diesel_async::pooled_connection::{
//!     AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
//! };
//! use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
//! use diesel_async::{AsyncConnection, SimpleAsyncConnection};
//! use inbox_diesel::tripwire::{self, OnTrip};
//! use inbox_diesel::{idempotent, InboxSchema, Uuid};
//!
//! type BoxError = Box<dyn std::error::Error + Send + Sync>;
//! type Conn = SyncConnectionWrapper<SqliteConnection>;
//! type Manager = AsyncDieselConnectionManager<Conn>;
//! struct Context { pool: tripwire::bb8::GuardedPool<Manager> }
//! struct Msg { id: Uuid }
//!
//! /// Checks its own connection out: the handler cannot see it, the pool can.
//! async fn audit(ctx: &Context, what: &str) -> Result<(), BoxError> {
//!     let mut conn = ctx.pool.get().await?;
//!     let sql = format!("CREATE TABLE IF NOT EXISTS audit (what TEXT);
//!                        INSERT INTO audit VALUES ('{what}')");
//!     conn.batch_execute(&sql).await?;
//!     Ok(())
//! }
//!
//! #[idempotent(consumer = "credit", key = msg.id)]
//! async fn on_credit(conn: &mut Conn, ctx: &Context, msg: &Msg) -> Result<(), BoxError> {
//!     audit(ctx, "credit").await?;
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let mut config = ManagerConfig::default();
//! // The net under code that checks out of the plain pool: `ctx.pool.inner().get()`.
//! config.recycling_method =
//!     tripwire::bb8::recycling_method(OnTrip::Log, RecyclingMethod::Verified);
//! let manager = Manager::new_with_config(":memory:", config);
//! let pool = bb8::Pool::builder().max_size(2).build(manager).await?;
//! let ctx = Context { pool: tripwire::bb8::GuardedPool::new(pool) };
//! let mut conn = Conn::establish(":memory:").await?;
//! conn.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))
//!     .await?;
//!
//! let refused = on_credit(&mut conn, &ctx, &Msg { id: Uuid::from_u128(1) }).await.unwrap_err();
//! // The handler answers with the refusal, whatever its body made of it: a bug (`Alert`).
//! let refused = refused.downcast_ref::<inbox_diesel::Error>().unwrap();
//! assert!(matches!(refused, inbox_diesel::Error::CheckoutInsideHandler(h) if h.consumer() == "credit"));
//! // Outside a handler the pool works as before.
//! audit(&ctx, "outside a handler").await?;
//! # Ok(())
//! # }
//! ```
//!
//! # What bb8 lets a hook do
//!
//! bb8 (0.9) has no checkout hook. `CustomizeConnection::on_acquire` runs when a connection
//! is opened, mostly in a task bb8 spawns to fill the pool — not in the task that checks out.
//! The one call on each checkout, in that task, is `ManageConnection::is_valid` (with
//! `test_on_check_out`, the default), which diesel-async's manager answers with its
//! [`RecyclingMethod`]. An error there does not fail the checkout: bb8 closes the connection
//! and takes the next, until its connection timeout (30 s by default) — every connection
//! handed to it closed on the way. A panic there drops the `PooledConnection`, and
//! diesel-async's `has_broken` answers `true` while the thread panics: bb8 closes that one
//! connection and opens another in its place. Hence [`GuardedPool`] for the refusal, and
//! [`recycling_method`] for what reaches the plain pool.
//!
//! # Cost
//!
//! [`GuardedPool::get`] reads one thread-local before bb8's `get`; [`recycling_method`] one more in
//! bb8's check on checkout, and a boxed future around the method it wraps. Counted with
//! callgrind on SQLite, a checkout of 1 231 instructions (`RecyclingMethod::Fast`) costs 57
//! more through [`GuardedPool`], 339 more with [`recycling_method`] around `Fast` — against some
//! 12 000 for the `SELECT 1` of the default `RecyclingMethod::Verified`.

use std::sync::Arc;

use bb8::{ManageConnection, PooledConnection, RunError};
use diesel_async::pooled_connection::{PoolableConnection, RecyclingMethod};

use super::{CheckoutError, OnTrip, on_checkout, refuse_checkout};

/// A bb8 pool that refuses a checkout inside an `#[idempotent]` handler's body with
/// [`CheckoutError::InsideHandler`], before it touches the pool.
///
/// Give helpers this type instead of `bb8::Pool` (diesel-async's `bb8::Pool<C>` is
/// `GuardedPool<AsyncDieselConnectionManager<C>>` here): it has no `Deref` to the plain
/// pool, so a helper cannot be handed the unguarded pool by accident;
/// [`inner`](GuardedPool::inner) says so on purpose.
pub struct GuardedPool<M: ManageConnection>(bb8::Pool<M>);

impl<M: ManageConnection> GuardedPool<M> {
    /// Guards `pool`.
    pub fn new(pool: bb8::Pool<M>) -> Self {
        GuardedPool(pool)
    }

    /// `bb8::Pool::get`, refused inside a handler.
    pub async fn get(&self) -> Result<PooledConnection<'_, M>, CheckoutError<RunError<M::Error>>> {
        refuse_checkout()?;
        self.0.get().await.map_err(CheckoutError::Failed)
    }

    /// `bb8::Pool::get_owned`, refused inside a handler.
    pub async fn get_owned(
        &self,
    ) -> Result<PooledConnection<'static, M>, CheckoutError<RunError<M::Error>>> {
        refuse_checkout()?;
        self.0.get_owned().await.map_err(CheckoutError::Failed)
    }

    /// The plain pool, for what the guard does not forward (`state`, `add`, …). A checkout
    /// through it is not refused; only [`recycling_method`] sees it.
    pub fn inner(&self) -> &bb8::Pool<M> {
        &self.0
    }

    /// The plain pool.
    pub fn into_inner(self) -> bb8::Pool<M> {
        self.0
    }
}

guarded_pool_impls! {
    impl[M: ManageConnection] GuardedPool<M>, wrapping bb8::Pool<M>;
    Debug where []
}

/// diesel-async's check of a connection on checkout, `then` (its default is
/// `RecyclingMethod::Verified`, a `SELECT 1`), after the tripwire: it logs (or panics at) a
/// checkout inside an `#[idempotent]` handler's body. Set it as
/// `ManagerConfig::recycling_method` of the `AsyncDieselConnectionManager` the bb8 pool is
/// built with, and keep bb8's `test_on_check_out` (the default): bb8 runs it at each
/// checkout, in the checking task.
///
/// The tripwire never fails the check (which would make bb8 close the connection and try the
/// next: see the [module documentation](self)); `then` fails it as it would alone. With
/// [`OnTrip::Panic`], bb8 closes the connection the panic interrupted.
pub fn recycling_method<C>(on: OnTrip, then: RecyclingMethod<C>) -> RecyclingMethod<C>
where
    C: PoolableConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel_async::methods::ExecuteDsl<C>,
{
    // The check diesel-async's managers run, through the trait they call it on; shared with
    // each check's future, which must not borrow the closure.
    let then = Arc::new(then);
    RecyclingMethod::CustomFunction(Box::new(move |conn: &mut C| {
        on_checkout(on);
        let then = then.clone();
        Box::pin(async move { conn.ping(&then).await })
    }))
}
