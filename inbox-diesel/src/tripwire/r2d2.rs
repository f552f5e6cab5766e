//! r2d2 (feature `r2d2`): a pool whose checkouts inside a handler are refused with an error,
//! and an event handler for the plain pool.
//!
//! ```
//! use diesel::connection::SimpleConnection;
//! use diesel::prelude::*;
//! use diesel::r2d2::ConnectionManager;
//! use inbox_diesel::tripwire::{self, OnTrip};
//! use inbox_diesel::{idempotent, InboxSchema, Uuid};
//!
//! type BoxError = Box<dyn std::error::Error + Send + Sync>;
//! type Pool = tripwire::r2d2::GuardedPool<ConnectionManager<SqliteConnection>>;
//! struct Context { pool: Pool }
//! struct Msg { id: Uuid }
//!
//! /// Checks its own connection out: the handler cannot see it, the pool can.
//! fn audit(ctx: &Context, what: &str) -> Result<(), BoxError> {
//!     let mut conn = ctx.pool.get()?;
//!     conn.batch_execute(&format!("CREATE TABLE IF NOT EXISTS audit (what TEXT);
//!                                  INSERT INTO audit VALUES ('{what}')"))?;
//!     Ok(())
//! }
//!
//! #[idempotent(consumer = "credit", key = msg.id)]
//! fn on_credit(conn: &mut SqliteConnection, ctx: &Context, msg: &Msg) -> Result<(), BoxError> {
//!     audit(ctx, "credit")?;
//!     Ok(())
//! }
//!
//! # fn main() -> Result<(), BoxError> {
//! let pool = diesel::r2d2::Pool::builder()
//!     .max_size(2)
//!     // The net under code that checks out of the plain pool: `ctx.pool.inner().get()`.
//!     .event_handler(Box::new(tripwire::r2d2::Tripwire::new(OnTrip::Log)))
//!     .build(ConnectionManager::<SqliteConnection>::new(":memory:"))?;
//! let ctx = Context { pool: Pool::new(pool) };
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! conn.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))?;
//!
//! let refused = on_credit(&mut conn, &ctx, &Msg { id: Uuid::from_u128(1) }).unwrap_err();
//! // The handler answers with the refusal, whatever its body made of it: a bug (`Alert`).
//! let refused = refused.downcast_ref::<inbox_diesel::Error>().unwrap();
//! assert!(matches!(refused, inbox_diesel::Error::CheckoutInsideHandler(h) if h.consumer() == "credit"));
//! // Outside a handler the pool works as before.
//! audit(&ctx, "outside a handler")?;
//! # Ok(())
//! # }
//! ```
//!
//! # What r2d2 lets a hook do
//!
//! r2d2 (0.8) calls [`HandleEvent::handle_checkout`] in `Pool::get` and `get_timeout`, on the
//! thread that checks out, after the connection has been taken from the pool and wrapped in
//! its `PooledConnection`, just before returning it. The event handler returns nothing, so
//! it cannot refuse with an error; a panic there drops the `PooledConnection`, which hands
//! the connection back — and diesel's `ConnectionManager::has_broken` answers `true` while
//! the thread panics, so r2d2 closes it and opens another in its place. `Pool::try_get` calls
//! no event handler at all. `ManageConnection::is_valid` (with `test_on_check_out`) could
//! fail the checkout, but r2d2 then closes the connection and tries the next until its
//! connection timeout: 30 s by default, every idle connection closed on the way.
//! [`CustomizeConnection::on_acquire`](diesel::r2d2::CustomizeConnection) runs when a
//! connection is opened, on r2d2's own threads. Hence [`GuardedPool`] for the refusal, and
//! [`Tripwire`] for what reaches the plain pool.
//!
//! # Cost
//!
//! [`GuardedPool::get`] reads one thread-local before r2d2's `get`; [`Tripwire`] reads it in the
//! checkout event; neither touches the pool's lock. Counted with callgrind on SQLite, a
//! checkout of 2 416 instructions costs 32 more through [`GuardedPool`], 22 more with [`Tripwire`].

use std::time::Duration;

use diesel::r2d2::event::{AcquireEvent, CheckinEvent, CheckoutEvent, ReleaseEvent, TimeoutEvent};
use diesel::r2d2::{self as r2d2, HandleEvent, ManageConnection, PoolError, PooledConnection};

use super::{CheckoutError, InsideHandler, OnTrip, on_checkout, refuse_checkout};

/// An r2d2 pool that refuses a checkout inside an `#[idempotent]` handler's body with
/// [`CheckoutError::InsideHandler`], before it touches the pool.
///
/// Give helpers this type instead of `r2d2::Pool`: it has no `Deref` to the plain pool, so a
/// helper cannot be handed the unguarded pool by accident; [`inner`](GuardedPool::inner) says so
/// on purpose.
pub struct GuardedPool<M: ManageConnection>(r2d2::Pool<M>);

impl<M: ManageConnection> GuardedPool<M> {
    /// Guards `pool`.
    pub fn new(pool: r2d2::Pool<M>) -> Self {
        GuardedPool(pool)
    }

    /// `r2d2::Pool::get`, refused inside a handler.
    pub fn get(&self) -> Result<PooledConnection<M>, CheckoutError<PoolError>> {
        refuse_checkout()?;
        self.0.get().map_err(CheckoutError::Failed)
    }

    /// `r2d2::Pool::get_timeout`, refused inside a handler.
    pub fn get_timeout(
        &self,
        timeout: Duration,
    ) -> Result<PooledConnection<M>, CheckoutError<PoolError>> {
        refuse_checkout()?;
        self.0.get_timeout(timeout).map_err(CheckoutError::Failed)
    }

    /// `r2d2::Pool::try_get`, refused inside a handler.
    pub fn try_get(&self) -> Result<Option<PooledConnection<M>>, InsideHandler> {
        refuse_checkout()?;
        Ok(self.0.try_get())
    }

    /// The plain pool, for what the guard does not forward (`state`, `max_size`, …). A
    /// checkout through it is not refused; only an event handler ([`Tripwire`]) sees it.
    pub fn inner(&self) -> &r2d2::Pool<M> {
        &self.0
    }

    /// The plain pool.
    pub fn into_inner(self) -> r2d2::Pool<M> {
        self.0
    }
}

guarded_pool_impls! {
    impl[M: ManageConnection] GuardedPool<M>, wrapping r2d2::Pool<M>;
    Debug where [M: std::fmt::Debug]
}

/// An r2d2 event handler that logs (or panics at) a checkout inside an `#[idempotent]`
/// handler's body: `Pool::builder().event_handler(Box::new(Tripwire::new(OnTrip::Log)))`.
///
/// r2d2 takes one event handler; one of your own goes behind it with
/// [`and_then`](Tripwire::and_then), and sees every event first.
///
/// With [`OnTrip::Panic`], the panic comes from inside r2d2's `Pool::get`: the caller never
/// holds the connection, and r2d2 closes it and opens another (see the
/// [module documentation](self)).
#[derive(Debug)]
pub struct Tripwire {
    on: OnTrip,
    then: Option<Box<dyn HandleEvent>>,
}

impl Tripwire {
    /// Does what `on` says at a checkout inside a handler.
    pub fn new(on: OnTrip) -> Self {
        Tripwire { on, then: None }
    }

    /// Forwards every event to `handler`, before its own check.
    pub fn and_then(mut self, handler: impl HandleEvent + 'static) -> Self {
        self.then = Some(Box::new(handler));
        self
    }

    /// Hands an event to the handler set with [`and_then`](Tripwire::and_then), if any.
    fn forward(&self, send: impl FnOnce(&dyn HandleEvent)) {
        if let Some(then) = &self.then {
            send(&**then);
        }
    }
}

impl HandleEvent for Tripwire {
    fn handle_acquire(&self, event: AcquireEvent) {
        self.forward(|then| then.handle_acquire(event));
    }

    fn handle_release(&self, event: ReleaseEvent) {
        self.forward(|then| then.handle_release(event));
    }

    /// Forwarded first: a handler that counts checkouts and checkins sees the checkin of a
    /// connection this check panics on.
    fn handle_checkout(&self, event: CheckoutEvent) {
        self.forward(|then| then.handle_checkout(event));
        on_checkout(self.on);
    }

    fn handle_timeout(&self, event: TimeoutEvent) {
        self.forward(|then| then.handle_timeout(event));
    }

    fn handle_checkin(&self, event: CheckinEvent) {
        self.forward(|then| then.handle_checkin(event));
    }
}
