//! Claim mode on a pool: the claim and the stamp each take a connection of their own, and
//! the side effect between them holds none.
//!
//! A claim-mode handler ([`idempotent`](crate::idempotent), `mode = "claim"`) commits its
//! claim before the side effect and its stamp after it, each on its own; the side effect —
//! an e-mail, a POST to a slow inbox — runs outside any transaction. Given a connection, the
//! handler holds it, idle, for as long as the side effect takes. Given a pool in its place,
//! it checks a connection out for the claim, gives it back before the body, and checks one
//! out again for the stamp (or the release after an error): ten deliveries POSTing at once
//! hold no connection while they wait.
//!
//! ```
//! # #[cfg(all(feature = "sqlite", feature = "r2d2"))] {
//! use diesel::connection::SimpleConnection;
//! use diesel::prelude::*;
//! use diesel::r2d2::{ConnectionManager, Pool};
//! use inbox_diesel::{InFlightOutcome, InboxSchema, idempotent, schema};
//!
//! # #[derive(Debug)] struct AppError;
//! # impl From<inbox_diesel::Error> for AppError { fn from(_: inbox_diesel::Error) -> Self { AppError } }
//! struct SignedUp { id: i64, email: String }
//!
//! #[idempotent(consumer = "welcome-mail", key = msg.id, mode = "claim")]
//! fn send_welcome(
//!     pool: &Pool<ConnectionManager<SqliteConnection>>,
//!     msg: &SignedUp,
//! ) -> Result<(), AppError> {
//!     // No connection is held here: the claim's went back to the pool.
//!     println!("mailing {}", msg.email);
//!     Ok(())
//! }
//!
//! let dir = std::env::temp_dir().join(format!("inbox-pool-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let file = dir.join("app.db");
//! # let _ = std::fs::remove_file(&file);
//! let pool = Pool::builder()
//!     .max_size(1)
//!     .build(ConnectionManager::<SqliteConnection>::new(file.to_str().unwrap()))
//!     .unwrap();
//! pool.get()
//!     .unwrap()
//!     .batch_execute(&schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))
//!     .unwrap();
//! let msg = SignedUp { id: 7, email: "ada@example.com".into() };
//! assert!(matches!(send_welcome(&pool, &msg), Ok(InFlightOutcome::Processed(()))));
//! assert!(matches!(send_welcome(&pool, &msg), Ok(InFlightOutcome::Duplicate { .. })));
//! # }
//! ```
//!
//! The pools taken: r2d2's (feature `r2d2`, sync handlers), bb8's and deadpool's through
//! diesel-async (features `bb8`, `deadpool`, `async fn` handlers), and each one's
//! [`tripwire`](crate::tripwire) `GuardedPool`; an application's own pool type implements
//! [`ConnectionPool`] and [`ClaimPool`] or [`AsyncClaimPool`]. The macro takes a parameter of type
//! `&…Pool<…>` (or one named by `conn = …`) as the handler's connection in claim mode; the
//! body is given [`NoConnection`](crate::NoConnection) in its place, as with a connection.
//!
//! What changes with a pool:
//! - **A failed checkout** before the claim is [`Error::Checkout`](crate::Error::Checkout):
//!   nothing ran (class `ConnectionLost`: redeliver later).
//! - **The stamp keeps trying, for twice the claim's lease**: a checkout that fails (the
//!   pool busy with other work) is tried again at once, keeping the stamp's place among the
//!   pool's waiters; a connection that is lost or refuses writes under the stamp (a
//!   failover, a pooler's restart, an operator's kill — a dead connection the pool handed
//!   out) is discarded and the stamp goes to another, pausing from 50 ms up to a second.
//!   Past the lease a stamp still completes the work unless a delivery has taken the claim
//!   over (then `ClaimLost`); a stamp whose answer was lost with its connection, and which
//!   had committed, is found so on the next connection. After twice the lease the effect is
//!   not recorded: [`Error::EffectNotRecorded`](crate::Error::EffectNotRecorded), or
//!   [`Error::Checkout`](crate::Error::Checkout) with its attempt when the pool gave none —
//!   the claim stays open until a redelivery takes it over or reports it. A release after
//!   the body's error gets three checkouts; without one the claim is left to its lease, and
//!   the body's error is returned.
//! - **Two connections**: the stamp may run on another connection than the claim; each is
//!   checked as on one connection (the startup check, the session's settings).
//! - **Transaction mode** has no such form: its body runs in the transaction, on the
//!   connection, from the marker to the commit.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::ops::DerefMut;

/// The error of a pool's checkout.
pub type CheckoutFailure = Box<dyn std::error::Error + Send + Sync>;

/// A pool of connections, as a claim-mode handler takes it: the connection it hands out.
/// With [`ClaimPool`] (sync handlers) or [`AsyncClaimPool`] (`async fn` handlers), what an
/// application's own pool type implements to be taken in place of a connection.
///
/// ```
/// # #[cfg(all(feature = "sqlite", feature = "r2d2"))] {
/// use diesel::SqliteConnection;
/// use diesel::r2d2::{ConnectionManager, Pool, PooledConnection};
/// use inbox_diesel::pool::{CheckoutFailure, ClaimPool, ConnectionPool};
///
/// /// An application's pool, wrapping r2d2's.
/// pub struct DbPool {
///     pool: Pool<ConnectionManager<SqliteConnection>>,
/// }
///
/// impl ConnectionPool for DbPool {
///     type Connection = SqliteConnection;
/// }
///
/// impl ClaimPool for DbPool {
///     type Checkout<'a> = PooledConnection<ConnectionManager<SqliteConnection>>;
///     fn checkout(&self) -> Result<Self::Checkout<'_>, CheckoutFailure> {
///         Ok(self.pool.get()?)
///     }
/// }
/// # }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a pool a claim-mode handler takes in place of its connection",
    label = "neither `&mut` a connection nor `&` a pool",
    note = "a claim-mode handler's connection parameter is `&mut` a connection or `&` a pool: r2d2's, bb8's or deadpool's, or an application's own type implementing `inbox_diesel::pool::ConnectionPool` and `ClaimPool` (or `AsyncClaimPool`)"
)]
pub trait ConnectionPool {
    /// The pool's connection.
    type Connection;
}

/// A pool a sync claim-mode handler takes in place of its connection.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a pool a claim-mode handler takes in place of its connection",
    label = "neither `&mut` a connection nor `&` a pool",
    note = "a claim-mode handler's connection parameter is `&mut` a connection or `&` a pool: r2d2's (feature `r2d2`), or an application's own type implementing `inbox_diesel::pool::ConnectionPool` and `ClaimPool`"
)]
pub trait ClaimPool: ConnectionPool {
    /// A connection checked out, back in the pool when dropped.
    type Checkout<'a>: DerefMut<Target = Self::Connection>
    where
        Self: 'a;

    /// Takes a connection, waiting as long as the pool is set to.
    fn checkout(&self) -> Result<Self::Checkout<'_>, CheckoutFailure>;
}

/// A pool an `async fn` claim-mode handler takes in place of its connection.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a pool an `async fn` claim-mode handler takes in place of its connection",
    label = "neither `&mut` a connection nor `&` a pool",
    note = "an `async fn` claim-mode handler's connection parameter is `&mut` a connection or `&` a pool: bb8's or deadpool's through diesel-async (features `bb8`, `deadpool`), or an application's own type implementing `inbox_diesel::pool::ConnectionPool` and `AsyncClaimPool`"
)]
pub trait AsyncClaimPool: ConnectionPool + Sync {
    /// A connection checked out, back in the pool when dropped.
    type Checkout<'a>: DerefMut<Target = Self::Connection> + Send
    where
        Self: 'a;

    /// Takes a connection, waiting as long as the pool is set to.
    fn checkout(&self) -> impl Future<Output = Result<Self::Checkout<'_>, CheckoutFailure>> + Send;
}

/// What a claim-mode handler's connection parameter is: a connection, or a pool.
#[doc(hidden)]
pub enum ClaimOn<'a, C, P> {
    Connection(&'a mut C),
    Pool(&'a P),
}

/// A claim-mode handler's connection parameter: `&mut` a connection, or `&` a pool.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "a claim-mode handler's connection parameter is `&mut` a connection or `&` a pool; `{Self}` is neither",
    label = "not a connection or a pool",
    note = "a pool of the application's own implements `inbox_diesel::pool::ConnectionPool` and `ClaimPool` (sync handlers) or `AsyncClaimPool` (`async fn` handlers)"
)]
pub trait ClaimTarget {
    type Connection;
    type Pool;
    fn __inbox_claim_target(&mut self) -> ClaimOn<'_, Self::Connection, Self::Pool>;
}

impl<C> ClaimTarget for &mut C {
    type Connection = C;
    type Pool = NoPool<C>;
    fn __inbox_claim_target(&mut self) -> ClaimOn<'_, C, NoPool<C>> {
        ClaimOn::Connection(&mut **self)
    }
}

impl<P: ConnectionPool> ClaimTarget for &P {
    type Connection = P::Connection;
    type Pool = P;
    fn __inbox_claim_target(&mut self) -> ClaimOn<'_, P::Connection, P> {
        ClaimOn::Pool(*self)
    }
}

/// The pool of a handler given a connection: there is none.
#[doc(hidden)]
pub struct NoPool<C>(Infallible, PhantomData<fn() -> C>);

impl<C> ConnectionPool for NoPool<C> {
    type Connection = C;
}

impl<C> ClaimPool for NoPool<C> {
    type Checkout<'a>
        = NoCheckout<C>
    where
        Self: 'a;
    fn checkout(&self) -> Result<NoCheckout<C>, CheckoutFailure> {
        match self.0 {}
    }
}

impl<C> AsyncClaimPool for NoPool<C> {
    type Checkout<'a>
        = NoCheckout<C>
    where
        Self: 'a;
    #[allow(clippy::manual_async_fn, reason = "the trait's future is `Send`")]
    fn checkout(&self) -> impl Future<Output = Result<NoCheckout<C>, CheckoutFailure>> + Send {
        async move { match self.0 {} }
    }
}

/// The checkout of [`NoPool`]: there is none (and no `Send` asked of the connection).
#[doc(hidden)]
pub struct NoCheckout<C>(Infallible, PhantomData<fn() -> C>);

impl<C> std::ops::Deref for NoCheckout<C> {
    type Target = C;
    fn deref(&self) -> &C {
        match self.0 {}
    }
}

impl<C> DerefMut for NoCheckout<C> {
    fn deref_mut(&mut self) -> &mut C {
        match self.0 {}
    }
}

#[cfg(feature = "r2d2")]
mod r2d2_pools {
    use diesel::r2d2::{ManageConnection, Pool, PooledConnection};

    use super::{CheckoutFailure, ClaimPool, ConnectionPool};
    use crate::tripwire::r2d2::GuardedPool;

    impl<M: ManageConnection> ConnectionPool for Pool<M> {
        type Connection = M::Connection;
    }

    impl<M: ManageConnection> ConnectionPool for GuardedPool<M> {
        type Connection = M::Connection;
    }

    impl<M: ManageConnection> ClaimPool for Pool<M> {
        type Checkout<'a>
            = PooledConnection<M>
        where
            Self: 'a;
        fn checkout(&self) -> Result<PooledConnection<M>, CheckoutFailure> {
            self.get().map_err(Into::into)
        }
    }

    /// The runtime's own checkouts, outside the handler's body: not refused.
    impl<M: ManageConnection> ClaimPool for GuardedPool<M> {
        type Checkout<'a>
            = PooledConnection<M>
        where
            Self: 'a;
        fn checkout(&self) -> Result<PooledConnection<M>, CheckoutFailure> {
            self.inner().checkout()
        }
    }
}

/// The impls of an async pool crate's pool and of its tripwire `GuardedPool`: the pool checks
/// out with its own `get`, the guarded one through the pool inside it.
#[cfg(any(feature = "bb8", feature = "deadpool"))]
macro_rules! async_claim_pools {
    (
        impl<M: $manager:path> for $pool:ty, $guarded:ty
        where [$($bounds:tt)*]
        {
            type Connection = $connection:ty;
            type Checkout<$a:lifetime> = $checkout:ty;
        }
    ) => {
        async_claim_pools!(@one $manager, $pool, [$($bounds)*], $connection, $a, $checkout,
            |pool| pool.get().await.map_err(Into::into));
        // The runtime's own checkouts, outside the handler's body: not refused.
        async_claim_pools!(@one $manager, $guarded, [$($bounds)*], $connection, $a, $checkout,
            |pool| pool.inner().checkout().await);
    };
    (
        @one $manager:path, $ty:ty, [$($bounds:tt)*], $connection:ty, $a:lifetime, $checkout:ty,
        |$this:ident| $get:expr
    ) => {
        impl<M: $manager> ConnectionPool for $ty {
            type Connection = $connection;
        }

        impl<M: $manager> AsyncClaimPool for $ty
        where
            $($bounds)*
        {
            type Checkout<$a>
                = $checkout
            where
                Self: $a;
            #[allow(clippy::manual_async_fn, reason = "the trait's future is `Send`")]
            fn checkout(
                &self,
            ) -> impl Future<Output = Result<Self::Checkout<'_>, CheckoutFailure>> + Send {
                let $this = self;
                async move { $get }
            }
        }
    };
}

#[cfg(feature = "bb8")]
mod bb8_pools {
    use bb8::{ManageConnection, Pool, PooledConnection, RunError};

    use super::{AsyncClaimPool, CheckoutFailure, ConnectionPool};
    use crate::tripwire::bb8::GuardedPool;

    async_claim_pools! {
        impl<M: ManageConnection> for Pool<M>, GuardedPool<M>
        where [RunError<M::Error>: std::error::Error + Send + Sync + 'static]
        {
            type Connection = M::Connection;
            type Checkout<'a> = PooledConnection<'a, M>;
        }
    }
}

#[cfg(feature = "deadpool")]
mod deadpool_pools {
    use deadpool::managed::{Manager, Object, Pool, PoolError};

    use super::{AsyncClaimPool, CheckoutFailure, ConnectionPool};
    use crate::tripwire::deadpool::GuardedPool;

    async_claim_pools! {
        impl<M: Manager> for Pool<M>, GuardedPool<M>
        where [M::Type: Send, PoolError<M::Error>: std::error::Error + Send + Sync + 'static]
        {
            type Connection = M::Type;
            type Checkout<'a> = Object<M>;
        }
    }
}
