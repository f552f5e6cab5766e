//! deadpool (feature `deadpool`): a pool whose checkouts inside a handler are refused with
//! an error, and hooks for the plain pool.
//!
//! ```
//! use diesel::SqliteConnection;
//! use diesel_async::pooled_connection::AsyncDieselConnectionManager;
//! use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
//! use diesel_async::{AsyncConnection, SimpleAsyncConnection};
//! use inbox_diesel::tripwire::{self, OnTrip};
//! use inbox_diesel::{idempotent, InboxSchema, Uuid};
//!
//! type BoxError = Box<dyn std::error::Error + Send + Sync>;
//! type Conn = SyncConnectionWrapper<SqliteConnection>;
//! type Manager = AsyncDieselConnectionManager<Conn>;
//! struct Context { pool: tripwire::deadpool::GuardedPool<Manager> }
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
//! let pool = deadpool::managed::Pool::builder(Manager::new(":memory:"))
//!     .max_size(2)
//!     // The net under code that checks out of the plain pool: `ctx.pool.inner().get()`.
//!     .post_create(tripwire::deadpool::hook(OnTrip::Log))
//!     .post_recycle(tripwire::deadpool::hook(OnTrip::Log))
//!     .build()?;
//! let ctx = Context { pool: tripwire::deadpool::GuardedPool::new(pool) };
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
//! # What deadpool lets a hook do
//!
//! deadpool (0.13) runs its hooks inside `Pool::get`, in the task that checks out:
//! `pre_recycle` and `post_recycle` around the manager's `recycle` of an idle connection,
//! `post_create` after the manager opened a new one. A hook that returns an error does not
//! fail the checkout: from `pre_recycle` or `post_recycle`, deadpool closes that connection
//! and takes the next idle one — a refusing hook would close every idle connection of the
//! pool in turn — and only from `post_create` does the error reach the caller
//! (`PoolError::PostCreateHook`), after the new connection was closed. A panic in a hook
//! closes that one connection (deadpool's `UnreadyObject` detaches it and gives its slot
//! back). Hence [`GuardedPool`] for the refusal, and [`hook`] for what reaches the plain pool.
//!
//! # Cost
//!
//! [`GuardedPool::get`] reads one thread-local before deadpool's `get`; each [`hook`] one more, in
//! the boxed call deadpool makes for each hook. Counted with callgrind on SQLite, a checkout
//! of 1 582 instructions (`RecyclingMethod::Fast`) costs 93 more through [`GuardedPool`], 36 more
//! with the hooks.

use deadpool::managed::{self, Hook, Manager, Object, PoolError, Timeouts};

use super::{CheckoutError, OnTrip, on_checkout, refuse_checkout};

/// A deadpool pool that refuses a checkout inside an `#[idempotent]` handler's body with
/// [`CheckoutError::InsideHandler`], before it touches the pool.
///
/// Give helpers this type instead of `deadpool::managed::Pool` (diesel-async's
/// `deadpool::Pool<C>` is `GuardedPool<AsyncDieselConnectionManager<C>>` here): it has no
/// `Deref` to the plain pool, so a helper cannot be handed the unguarded pool by accident;
/// [`inner`](GuardedPool::inner) says so on purpose.
pub struct GuardedPool<M: Manager, W: From<Object<M>> = Object<M>>(managed::Pool<M, W>);

impl<M: Manager, W: From<Object<M>>> GuardedPool<M, W> {
    /// Guards `pool`.
    pub fn new(pool: managed::Pool<M, W>) -> Self {
        GuardedPool(pool)
    }

    /// `deadpool::managed::Pool::get`, refused inside a handler.
    pub async fn get(&self) -> Result<W, CheckoutError<PoolError<M::Error>>> {
        refuse_checkout()?;
        self.0.get().await.map_err(CheckoutError::Failed)
    }

    /// `deadpool::managed::Pool::timeout_get`, refused inside a handler.
    pub async fn timeout_get(
        &self,
        timeouts: &Timeouts,
    ) -> Result<W, CheckoutError<PoolError<M::Error>>> {
        refuse_checkout()?;
        self.0
            .timeout_get(timeouts)
            .await
            .map_err(CheckoutError::Failed)
    }

    /// The plain pool, for what the guard does not forward (`status`, `resize`, …). A
    /// checkout through it is not refused; only the [`hook`]s see it.
    pub fn inner(&self) -> &managed::Pool<M, W> {
        &self.0
    }

    /// The plain pool.
    pub fn into_inner(self) -> managed::Pool<M, W> {
        self.0
    }
}

guarded_pool_impls! {
    impl[M: Manager, W: From<Object<M>>] GuardedPool<M, W>, wrapping managed::Pool<M, W>;
    Debug where [M: std::fmt::Debug, M::Type: std::fmt::Debug]
}

/// A deadpool hook that logs (or panics at) a checkout inside an `#[idempotent]` handler's
/// body. Install it twice — `post_recycle` sees a checkout of an idle connection,
/// `post_create` one of a connection opened for it:
///
/// ```text
/// Pool::builder(manager)
///     .post_create(tripwire::deadpool::hook(OnTrip::Log))
///     .post_recycle(tripwire::deadpool::hook(OnTrip::Log))
/// ```
///
/// It never returns an error (which would make deadpool close the connection and try the
/// next: see the [module documentation](self)). With [`OnTrip::Panic`], deadpool closes the
/// connection the panic interrupted.
pub fn hook<M: Manager>(on: OnTrip) -> Hook<M> {
    Hook::sync_fn(move |_, _| {
        on_checkout(on);
        Ok(())
    })
}
