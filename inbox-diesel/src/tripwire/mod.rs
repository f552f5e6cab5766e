//! The run-time tripwire: a pool checkout inside an `#[idempotent]` handler, refused.
//!
//! The compile-time check sees the handler's body, not the bodies of the functions it calls.
//! Real code writes through its own helpers, and a helper that takes a pool — or a context
//! that holds one — checks a connection out *inside*: `report(&ctx.pool, form)`. That
//! connection is not the handler's transaction. Its writes commit on their own, whatever the
//! inbox decides, and a redelivery of the message applies them again.
//!
//! So while a handler's body runs — inside its transaction in transaction mode (single
//! messages and batches), between the claim and the stamp in claim mode — the runtime marks
//! the thread (a `fn` handler) or the handler's future (an `async fn` handler) with the
//! handler's consumer name, and the pool integrations here — the modules `r2d2`, `deadpool`
//! and `bb8`, each behind the feature of that name — ask for that mark at each checkout:
//!
//! | pool | refuses with an error, pool untouched | hook: a checkout through the pool itself |
//! |---|---|---|
//! | r2d2 (feature `r2d2`) | `r2d2::GuardedPool` | `r2d2::Tripwire`, an event handler: logs, or panics |
//! | deadpool (feature `deadpool`) | `deadpool::GuardedPool` | `deadpool::hook`, for `post_create` and `post_recycle`: logs, or panics |
//! | bb8 (feature `bb8`) | `bb8::GuardedPool` | `bb8::recycling_method`, run by bb8's check on checkout: logs, or panics |
//! | any other (mobc, your own `get_conn`) | [`refuse_checkout`]`()?` in your checkout function | [`on_checkout`] in any hook the pool runs on the caller's thread or task |
//!
//! The wrappers refuse a checkout under the mark before they touch the pool, with
//! [`CheckoutError::InsideHandler`]; the helper's `?` hands it up, the handler's transaction
//! rolls back, and the redelivery finds nothing half-done. Whatever the body made of the
//! refusal — handed it up inside an error of its own, or swallowed it and went on —, the
//! handler answers [`Error::CheckoutInsideHandler`](crate::Error::CheckoutInsideHandler)
//! (class `Misuse`: an alert, never a dead letter, whatever the application's error type
//! would have been settled as). No pool lets
//! one of its hooks do that: r2d2's checkout event returns nothing; an error from a deadpool
//! hook or a bb8 check makes the pool close the connection it was about to hand out (deadpool
//! then tries the next one: a refusing hook would close every idle connection in turn); a
//! panic costs the pool that one connection (diesel's r2d2 and bb8 managers take a connection
//! that comes back during a panic for broken, as it may be inside a transaction; deadpool
//! drops one interrupted in a hook). So each hook either logs an error naming the handler
//! ([`OnTrip::Log`]) or panics ([`OnTrip::Panic`]: the write never runs, the pool opens a
//! connection in place of the one closed, and the panic takes down the handler — a process
//! built with `panic = "abort"` exits). Install the wrapper where handlers' helpers check
//! out, and a hook as the net under code that holds the plain pool.
//!
//! ```
//! use diesel::connection::SimpleConnection;
//! use diesel::prelude::*;
//! use inbox_diesel::tripwire;
//! use inbox_diesel::{idempotent, InboxSchema, Uuid};
//!
//! type BoxError = Box<dyn std::error::Error + Send + Sync>;
//! struct Msg { id: Uuid }
//! /// What a service hands its handlers: here, where the audit trail lives.
//! struct Context { audit_url: String }
//!
//! /// A helper that looks harmless at the call site; inside, it checks a connection out.
//! fn audit(ctx: &Context, what: &str) -> Result<(), BoxError> {
//!     tripwire::refuse_checkout()?; // what a guarded pool's `get()` does first
//!     let mut audit = SqliteConnection::establish(&ctx.audit_url)?;
//!     audit.batch_execute(&format!("INSERT INTO audit VALUES ('{what}')"))?;
//!     Ok(())
//! }
//!
//! #[idempotent(consumer = "credit", key = msg.id)]
//! fn on_credit(conn: &mut SqliteConnection, ctx: &Context, msg: &Msg) -> Result<(), BoxError> {
//!     assert_eq!(tripwire::inside_handler().map(|h| h.consumer()), Some("credit"));
//!     audit(ctx, "credit")?; // refused: its write would commit once per delivery
//!     Ok(())
//! }
//!
//! # fn main() -> Result<(), BoxError> {
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! conn.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))?;
//! let ctx = Context { audit_url: ":memory:".into() };
//! let refused = on_credit(&mut conn, &ctx, &Msg { id: Uuid::from_u128(1) }).unwrap_err();
//! match refused.downcast_ref::<inbox_diesel::Error>() {
//!     Some(inbox_diesel::Error::CheckoutInsideHandler(inside)) => {
//!         assert_eq!(inside.consumer(), "credit")
//!     }
//!     other => panic!("{other:?}"),
//! }
//! // Cleared when the handler returns: outside a handler, nothing is refused.
//! assert!(tripwire::inside_handler().is_none());
//! assert!(tripwire::refuse_checkout().is_ok());
//! # Ok(())
//! # }
//! ```
//!
//! # What the mark covers, and what it does not
//!
//! - It covers the body and everything the body calls on the same thread, or, for an
//!   `async fn` handler, inside the body's future — set at each poll of that future and put
//!   back after it, so other tasks polled by the same thread in between are not marked. It
//!   needs no particular executor (no task-local).
//! - It does not follow work the body hands to another thread or task: `std::thread::spawn`,
//!   `tokio::spawn`, `spawn_blocking`, a channel to a worker. A checkout there is not seen.
//! - It sees checkouts, not connections: a connection checked out *before* the handler was
//!   called (a second connection kept in a context, a global behind a mutex) and used inside
//!   is not seen. Keep such connections out of handlers' reach; the compile-time check
//!   refuses the forms it can see.
//! - Each pool sees only the checkouts that reach its hook: r2d2's `try_get` runs no event
//!   handler; bb8 runs its check on checkout only with `test_on_check_out` (the default);
//!   a checkout through the plain pool of a wrapper (`r2d2::GuardedPool::inner` and the like)
//!   meets only the hooks.
//! - A checkout that must commit on its own (an audit trail that records rolled-back
//!   attempts too) says so: [`allow_outside_transaction`] lifts the mark for a closure,
//!   [`allow_outside_transaction_async`] for a future. The reason it takes is for the
//!   reader; `grep -rn outside_transaction` finds these next to the compile-time exceptions.
//!
//! # Cost
//!
//! Setting the mark is two writes of a thread-local `Cell` around each poll of the body (a
//! `fn` handler's body runs in one poll); a check is one read. Counted with callgrind on the
//! SQLite benchmark, the `#[idempotent]` path runs 25 more instructions per message, 0.03 %
//! of about 94 400; a guarded checkout costs 30–95 instructions more than the plain pool's,
//! a hook 20–40 (bb8's, around a boxed future, 340) — BENCHMARKS.md has the figures and the
//! commands.

/// What each pool crate's `GuardedPool` has as the plain pool inside it has: `Clone`,
/// `Debug` (with the bounds the plain pool's takes) and `From` the plain pool.
#[cfg(any(feature = "bb8", feature = "deadpool", feature = "r2d2"))]
macro_rules! guarded_pool_impls {
    (impl[$($generics:tt)*] $guarded:ty, wrapping $pool:ty; Debug where [$($debug:tt)*]) => {
        impl<$($generics)*> Clone for $guarded {
            fn clone(&self) -> Self {
                GuardedPool(self.0.clone())
            }
        }

        impl<$($generics)*> std::fmt::Debug for $guarded
        where
            $($debug)*
        {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_tuple("GuardedPool").field(&self.0).finish()
            }
        }

        impl<$($generics)*> From<$pool> for $guarded {
            fn from(pool: $pool) -> Self {
                GuardedPool(pool)
            }
        }
    };
}

#[cfg(feature = "bb8")]
pub mod bb8;
#[cfg(feature = "deadpool")]
pub mod deadpool;
pub mod net;
#[cfg(feature = "r2d2")]
pub mod r2d2;

use std::cell::Cell;
use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::pin;

thread_local! {
    /// The consumer of the handler whose body this thread is running (or polling), if any.
    /// `const`-initialised and without a destructor: reading and writing it is a plain
    /// thread-local access, with no lazy registration and no failure at thread exit.
    static MARK: Cell<Option<&'static str>> = const { Cell::new(None) };
    /// The first checkout [`refuse_checkout`] refused during the current poll of a
    /// handler's body: the body ends with it (see `net::handled_on`).
    pub(crate) static REFUSED: Cell<Option<InsideHandler>> = const { Cell::new(None) };
}

/// Sets the mark until dropped, then puts back what was there before: nested handlers see
/// their own consumer, and a panic that unwinds through the body clears it.
struct Mark {
    previous: Option<&'static str>,
}

impl Mark {
    #[inline]
    fn set(consumer: Option<&'static str>) -> Mark {
        Mark {
            previous: MARK.replace(consumer),
        }
    }
}

impl Drop for Mark {
    #[inline]
    fn drop(&mut self) {
        MARK.set(self.previous);
    }
}

/// The mark of this thread: what [`carried`](net::Blocking) takes to a blocking thread.
#[cfg(all(feature = "async", feature = "sqlite"))]
pub(crate) fn current_mark() -> Option<&'static str> {
    MARK.get()
}

/// Runs `f` with the mark set to `consumer`, then puts back the one before.
#[cfg(all(feature = "async", feature = "sqlite"))]
pub(crate) fn with_mark<R>(consumer: Option<&'static str>, f: impl FnOnce() -> R) -> R {
    let _mark = Mark::set(consumer);
    f()
}

/// Runs `future` with the mark set to `consumer` during each of its polls, and only then.
///
/// A thread-local held across an `.await` would stay set while the thread polls other tasks
/// in between; set per poll, it marks exactly the code of this future, on any executor. The
/// sync runtime polls the body once, and its body runs to its end in that poll.
pub(crate) async fn marked<F: Future>(consumer: Option<&'static str>, future: F) -> F::Output {
    let mut future = pin!(future);
    std::future::poll_fn(|cx| {
        let _mark = Mark::set(consumer);
        future.as_mut().poll(cx)
    })
    .await
}

/// The handler whose body is running on this thread or in this task: the answer of
/// [`inside_handler`], and the error a guarded checkout is refused with.
///
/// Its `Display` says what went wrong and how to fix it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsideHandler {
    consumer: &'static str,
}

impl InsideHandler {
    /// The handler's consumer name (`#[idempotent(consumer = "…")]`).
    pub fn consumer(&self) -> &'static str {
        self.consumer
    }
}

impl fmt::Display for InsideHandler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a connection checked out of a pool inside the #[idempotent] handler `{}` is not \
             the handler's transaction: what it writes commits on its own, whatever the inbox \
             decides, and a redelivery of the message applies it again. Pass the handler's \
             connection to the code that needs one (`helper(conn, …)`, a helper taking \
             `&mut` the connection instead of a pool); if the write must commit on its own, \
             say so with `inbox_diesel::tripwire::allow_outside_transaction(\"why\", || …)` \
             (`allow_outside_transaction_async(\"why\", future)` for a future). A guarded \
             checkout is refused whatever it would run, reads too: for a pool the handlers' \
             helpers only read through, leave the checkout unguarded and install the net \
             (`inbox_diesel::tripwire::net::install()`), which stops writes and lets reads \
             through",
            self.consumer
        )
    }
}

impl std::error::Error for InsideHandler {}

/// The `#[idempotent]` handler whose body is running on this thread (or, for an `async fn`
/// handler, in the future being polled), or `None` outside any handler and inside
/// [`allow_outside_transaction`].
#[inline]
pub fn inside_handler() -> Option<InsideHandler> {
    MARK.get().map(|consumer| InsideHandler { consumer })
}

/// `Err` inside an `#[idempotent]` handler's body, `Ok` outside: the first line of a
/// checkout function of your own, for pools without a wrapper here (mobc, a `DbPool` enum,
/// a `get_conn` helper).
///
/// ```
/// # use inbox_diesel::tripwire;
/// # struct Pool;
/// # struct Conn;
/// # impl Pool { fn checkout(&self) -> Result<Conn, std::io::Error> { Ok(Conn) } }
/// fn get_conn(pool: &Pool) -> Result<Conn, Box<dyn std::error::Error + Send + Sync>> {
///     tripwire::refuse_checkout()?;
///     Ok(pool.checkout()?)
/// }
/// assert!(get_conn(&Pool).is_ok());
/// ```
///
/// A refusal is also logged at error level, so that a helper that swallows the error is
/// still seen.
///
/// It refuses every checkout inside a handler, a read's too: where the handlers' helpers read
/// through the same checkout function (a site's settings, a user looked up), leave this out
/// and install the [net](net::install) instead, which stops a write on any connection but
/// the handler's and lets reads through — or read on the handler's own connection.
pub fn refuse_checkout() -> Result<(), InsideHandler> {
    match inside_handler() {
        None => Ok(()),
        Some(inside) => {
            // Kept for the body's end: however the body treats the refusal, the handler
            // answers with it (`Error::CheckoutInsideHandler`).
            REFUSED.with(|refused| {
                if refused.get().is_none() {
                    refused.set(Some(inside));
                }
            });
            tracing::error!(
                consumer = inside.consumer,
                "refused a pool checkout inside an #[idempotent] handler: {inside}"
            );
            Err(inside)
        }
    }
}

/// What a pool hook does with a checkout made inside a handler: the hooks cannot refuse it
/// with an error (see the [module documentation](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTrip {
    /// Log an error naming the handler and the fix, and hand the connection out: the write
    /// goes through, outside the transaction.
    Log,
    /// Log the error, then panic with it: the connection is never handed out, and the pool
    /// closes it (diesel's managers close a connection returned during a panic) and opens
    /// another. The panic unwinds through the handler — or aborts a process built with
    /// `panic = "abort"`.
    Panic,
}

/// The check a pool hook runs at a checkout: nothing outside a handler; inside one, what `on`
/// says. For hooks of pools without an integration here; it must run on the thread, or in
/// the task, that checks out.
pub fn on_checkout(on: OnTrip) {
    if let Some(inside) = inside_handler() {
        tracing::error!(
            consumer = inside.consumer,
            "pool checkout inside an #[idempotent] handler: {inside}"
        );
        if on == OnTrip::Panic {
            panic!("{inside}");
        }
    }
}

/// Runs `f` with the mark lifted: a checkout in it is not refused, even inside a handler.
///
/// For a write that must commit on its own — an audit trail that records every attempt,
/// rolled back or not. It runs once per *delivery*, not once per message, and stays
/// committed when the handler's transaction rolls back. `reason` says why, for the reader.
///
/// ```
/// # use inbox_diesel::tripwire;
/// let seen = tripwire::allow_outside_transaction("the audit trail records every attempt", || {
///     tripwire::inside_handler()
/// });
/// assert!(seen.is_none());
/// ```
pub fn allow_outside_transaction<R>(reason: &'static str, f: impl FnOnce() -> R) -> R {
    let _ = reason;
    let _lifted = Mark::set(None);
    f()
}

/// [`allow_outside_transaction`] for a future: the mark is lifted during each of its polls.
pub async fn allow_outside_transaction_async<F: IntoFuture>(
    reason: &'static str,
    future: F,
) -> F::Output {
    let _ = reason;
    marked(None, future.into_future()).await
}

/// A checkout refused by a guarded pool, or the pool's own error.
#[derive(Debug)]
pub enum CheckoutError<E> {
    /// The checkout was made inside an `#[idempotent]` handler's body; the pool was not
    /// touched.
    InsideHandler(InsideHandler),
    /// The pool's own error (a timeout, a failed connection). Not named `Pool`: a second item
    /// of that name would make rustc spell out `diesel::r2d2::Pool` and the like in full in
    /// every error message of a crate that uses this one.
    Failed(E),
}

impl<E: fmt::Display> fmt::Display for CheckoutError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckoutError::InsideHandler(inside) => inside.fmt(f),
            CheckoutError::Failed(e) => e.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for CheckoutError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CheckoutError::InsideHandler(inside) => Some(inside),
            CheckoutError::Failed(e) => Some(e),
        }
    }
}

impl<E> From<InsideHandler> for CheckoutError<E> {
    fn from(inside: InsideHandler) -> Self {
        CheckoutError::InsideHandler(inside)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_marks_restore_the_outer_one() {
        assert_eq!(inside_handler(), None);
        let outer = Mark::set(Some("outer"));
        {
            let _inner = Mark::set(Some("inner"));
            assert_eq!(inside_handler().map(|h| h.consumer()), Some("inner"));
            allow_outside_transaction("test", || assert_eq!(inside_handler(), None));
            assert_eq!(inside_handler().map(|h| h.consumer()), Some("inner"));
        }
        assert_eq!(inside_handler().map(|h| h.consumer()), Some("outer"));
        drop(outer);
        assert_eq!(inside_handler(), None);
    }

    #[test]
    fn a_panic_clears_the_mark() {
        let unwound = std::panic::catch_unwind(|| {
            let _mark = Mark::set(Some("panicking"));
            panic!("in the body");
        });
        assert!(unwound.is_err());
        assert_eq!(inside_handler(), None);
    }

    /// The mark of a future is set during its polls only: code that runs on the same thread
    /// between two polls — another task — is not marked.
    #[test]
    fn a_future_is_marked_only_while_it_is_polled() {
        use std::task::{Context, Poll, Waker};
        let mut polls = 0;
        let body = std::future::poll_fn(|cx| {
            assert_eq!(inside_handler().map(|h| h.consumer()), Some("async"));
            polls += 1;
            if polls < 3 {
                cx.waker().wake_by_ref();
                Poll::Pending
            } else {
                Poll::Ready(polls)
            }
        });
        let mut future = pin!(marked(Some("async"), body));
        let mut cx = Context::from_waker(Waker::noop());
        let mut rounds = 0;
        let polls = loop {
            rounds += 1;
            match future.as_mut().poll(&mut cx) {
                Poll::Ready(polls) => break polls,
                Poll::Pending => assert_eq!(inside_handler(), None, "between polls"),
            }
        };
        assert_eq!((polls, rounds), (3, 3));
    }
}
