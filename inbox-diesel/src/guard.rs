//! The types behind the compile-time guard of `#[idempotent]`.
//!
//! The macro wraps every value a handler's body hands on — a call's argument, a method's
//! receiver, a struct, tuple or array element, the right side of an assignment, a macro's
//! argument — that is not the handler's transaction in [`vet!`](crate::__private::vet). The
//! wrapper returns its value unchanged (`#[inline(always)]`, nothing runs); what it adds is a
//! question the type checker answers at the value's concrete type: is this a diesel
//! connection (anything that runs SQL: `SimpleConnection`, `SimpleAsyncConnection`), sync or async, owned, borrowed, pooled or behind a guard — something that
//! derefs to one within three steps — or a connection pool? If it is, an obligation that only
//! [`NotAConnection`] satisfies fails, and the compiler reports it at the value with the
//! message of the handler's mode.
//!
//! The question is asked by autoref specialisation: `(&&&…&Probe(value)).inbox_kind()`
//! resolves to the first trait, from the most references down, whose impl applies; the last
//! one applies to everything and answers "not a connection".

use std::ops::Deref;

use diesel::connection::SimpleConnection;

/// What a claim-mode body is given in place of a connection.
///
/// A claim-mode body runs outside any transaction — after the claim has committed and before
/// the work is stamped — so it has no connection to run statements on. The handler's
/// connection parameter is bound, inside the body, to this type: it has no methods and
/// implements none of diesel's traits, so every use of it is a compile error, which the guard
/// explains. Database work belongs in a transaction-mode handler, or before or after the
/// claim-mode one.
#[derive(Debug)]
pub struct NoConnection {
    _private: (),
}

impl NoConnection {
    pub(crate) fn new() -> Self {
        NoConnection { _private: () }
    }
}

/// A value whose type is inspected.
pub struct Probe<'v, V: ?Sized>(pub &'v V);

/// The answer for a value that is, or derefs to, a diesel connection.
pub struct DatabaseConnection(());

/// The answer for a connection pool, or a reference or smart pointer to one.
pub struct ConnectionPool(());

/// The answer for a reference to `dyn Any`, which may hold a connection to be downcast.
pub struct ErasedAny(());

/// The answer for the [`NoConnection`] of a claim-mode body.
pub struct ClaimModeHasNoConnection(());

impl ClaimModeHasNoConnection {
    /// The answer, for `no_connection!`.
    pub const ANSWER: Self = ClaimModeHasNoConnection(());
}

/// The answer for every other value.
pub struct NotAConnection(());

/// Transaction mode: a value handed on in the body must not be a connection other than the
/// transaction.
#[diagnostic::on_unimplemented(
    message = "`{V}` is not the handler's transaction: what runs through it commits on its own",
    label = "a connection or pool other than the handler's transaction",
    note = "an #[idempotent] body runs inside the inbox transaction; a write through another connection commits whatever the inbox decides, so a redelivered message is recognised as a duplicate and the write happens again",
    note = "run the statement on the handler's connection parameter (or `&mut *conn`), give helpers that connection rather than a pool, or, if it must commit on its own, mark the statement `#[inbox::outside_transaction(\"why\")]`",
    note = "if this is the handler's connection reached through a call, a closure's parameter (a closure kept in a struct or a `Box` is not followed) or a branch (an `Option` that is `None` in another arm is not), pass the parameter itself; if the value's type is only settled later in the body, annotate it where it is bound",
    note = "a `&dyn Any` or `&mut dyn Any` is refused too: a connection erased into it can be downcast and written through inside a helper; hand on the concrete value"
)]
pub trait OnTheTransaction<V: ?Sized> {}

#[diagnostic::do_not_recommend]
impl<V: ?Sized> OnTheTransaction<V> for NotAConnection {}

/// Transaction mode, a name that shadows the handler's connection parameter: it is a new
/// value, judged by its own type.
#[diagnostic::on_unimplemented(
    message = "this name shadows the handler's connection: here it is a `{V}`, not the transaction",
    label = "rebound by a `let`, a pattern, a closure or a loop: not the handler's connection",
    note = "a statement run through it would commit on its own, outside the inbox transaction, so a redelivered message would be recognised as a duplicate and the write would happen again",
    note = "give the other value a name of its own and run the statement on the handler's connection, or, if it must commit on its own, mark the statement `#[inbox::outside_transaction(\"why\")]`"
)]
pub trait NotTheShadowedConnection<V: ?Sized> {}

#[diagnostic::do_not_recommend]
impl<V: ?Sized> NotTheShadowedConnection<V> for NotAConnection {}

/// Claim mode: the body touches no database at all.
#[diagnostic::on_unimplemented(
    message = "a claim-mode body runs outside any transaction, and this `{V}` reaches the database",
    label = "a connection or pool in a claim-mode body",
    note = "the body runs after the claim has committed and before the work is stamped: a write here commits on its own and is not undone when the side effect fails and the message is redelivered",
    note = "do the database work in a transaction-mode handler, or before or after this one, and pass the message key downstream as the provider's idempotency key; a statement that must write here uses a connection of its own (the connection parameter is `NoConnection` in claim mode) and is marked `#[inbox::outside_transaction(\"why\")]`, and with the run-time net installed also runs inside `tripwire::allow_outside_transaction`"
)]
pub trait OutsideAnyTransaction<V: ?Sized> {}

#[diagnostic::do_not_recommend]
impl<V: ?Sized> OutsideAnyTransaction<V> for NotAConnection {}

/// Transaction mode, the receiver of a pool's checkout (`pool.get()`): a pool is allowed
/// here, since the checkout runs no statement; the connection it gives is asked wherever it
/// is handed on.
#[diagnostic::on_unimplemented(
    message = "`{V}` is not the handler's transaction: what runs through it commits on its own",
    label = "a connection other than the handler's transaction",
    note = "an #[idempotent] body runs inside the inbox transaction; a write through another connection commits whatever the inbox decides, so a redelivered message is recognised as a duplicate and the write happens again",
    note = "run the statement on the handler's connection parameter (or `&mut *conn`), or, if it must commit on its own, mark the statement `#[inbox::outside_transaction(\"why\")]`"
)]
pub trait CheckoutOnTheTransaction<V: ?Sized> {}

#[diagnostic::do_not_recommend]
impl<V: ?Sized> CheckoutOnTheTransaction<V> for NotAConnection {}

#[diagnostic::do_not_recommend]
impl<V: ?Sized> CheckoutOnTheTransaction<V> for ConnectionPool {}

/// Transaction mode, the connection a query is run on (`query.load(conn)`, `get_result`,
/// `get_results`, `first`): another connection is allowed when the query is a `SELECT` built
/// by diesel's query builder ([`ReadQuery`]), a read on a replica, say.
#[diagnostic::on_unimplemented(
    message = "`{V}` is not the handler's transaction, and what runs through it here is not a `SELECT` built by diesel's query builder",
    label = "a connection other than the handler's transaction",
    note = "an #[idempotent] body runs inside the inbox transaction; a write through another connection commits whatever the inbox decides, so a redelivered message is recognised as a duplicate and the write happens again",
    note = "a read may run on another connection (a replica) when diesel's query builder made it a `SELECT` (`users::table.filter(…).load(&mut replica)`); `sql_query`, an `INSERT`/`UPDATE`/`DELETE` with `RETURNING` and a `UNION` are not told apart from a write",
    note = "run the statement on the handler's connection parameter (or `&mut *conn`), or, if it must commit on its own, mark the statement `#[inbox::outside_transaction(\"why\")]`"
)]
pub trait ReadOnTheTransaction<V: ?Sized, Q> {}

#[diagnostic::do_not_recommend]
impl<V: ?Sized, Q> ReadOnTheTransaction<V, Q> for NotAConnection {}

#[diagnostic::do_not_recommend]
impl<V: ?Sized, Q: ReadQuery> ReadOnTheTransaction<V, Q> for DatabaseConnection {}

/// A query that diesel's query builder made a `SELECT`: a table, or anything whose query is
/// diesel's [`SelectQuery`](diesel::query_builder::SelectQuery) (`filter`, `select`, `order`,
/// joins, `count`, `into_boxed`, `for_update` …). What it runs reads; `sql_query` text, an
/// `INSERT … RETURNING` and a `UNION` are not among them.
pub trait ReadQuery {}

impl<T: diesel::query_builder::AsQuery> ReadQuery for T where
    T::Query: diesel::query_builder::SelectQuery
{
}

/// The type of a query, asked about without moving it.
#[inline(always)]
pub fn query_type<Q>(_: &Q) -> std::marker::PhantomData<Q> {
    std::marker::PhantomData
}

/// A spawned thread or task: nothing it captures may be a connection or a pool.
#[diagnostic::on_unimplemented(
    message = "`{V}` is captured by a spawned thread or task: what runs through it there commits on its own, where neither the handler's transaction nor the run-time net follows",
    label = "a connection or pool captured by a spawned thread or task",
    note = "the handler's transaction and the run-time net (`tripwire::net`) see only the handler's own thread or task: a write in a spawned one commits whatever the inbox decides, so a redelivered message is recognised as a duplicate and the write happens again",
    note = "do the database work in the body, on the handler's connection parameter; hand the spawned work only what it needs (ids, data), or, if it must write on its own, mark the statement `#[inbox::outside_transaction(\"why\")]`"
)]
pub trait NotCapturedBySpawn<V: ?Sized> {}

#[diagnostic::do_not_recommend]
impl<V: ?Sized> NotCapturedBySpawn<V> for NotAConnection {}

/// Claim mode, the connection parameter: inside the body it stands for no connection.
#[diagnostic::on_unimplemented(
    message = "in a claim-mode body the connection (or pool) parameter is `NoConnection`: the body runs outside any transaction and has no connection",
    label = "`NoConnection`, not a connection",
    note = "the body runs after the claim has committed and before the work is stamped: a statement run here would commit on its own and would not be undone when the side effect fails and the message is redelivered",
    note = "do the database work in a transaction-mode handler, or before or after this one, and pass the message key downstream as the provider's idempotency key"
)]
pub trait UnusedInClaimMode<V: ?Sized> {}

/// A value being asked about, so that the answer's check names its type.
pub struct Asked<'v, V: ?Sized>(pub &'v V);

impl<V: ?Sized> Asked<'_, V> {
    /// Transaction mode.
    #[inline(always)]
    pub fn on_the_transaction<K: OnTheTransaction<V>>(self, _: K) {}

    /// Transaction mode, a name that shadows the connection parameter.
    #[inline(always)]
    pub fn not_the_shadowed_connection<K: NotTheShadowedConnection<V>>(self, _: K) {}

    /// Transaction mode, the receiver of a pool's checkout.
    #[inline(always)]
    pub fn checkout_on_the_transaction<K: CheckoutOnTheTransaction<V>>(self, _: K) {}

    /// Transaction mode, the connection a query of type `Q` is run on.
    #[inline(always)]
    pub fn read_on_the_transaction<Q, K: ReadOnTheTransaction<V, Q>>(
        self,
        _: std::marker::PhantomData<Q>,
        _: K,
    ) {
    }

    /// A capture of a spawned thread or task.
    #[inline(always)]
    pub fn not_captured_by_spawn<K: NotCapturedBySpawn<V>>(self, _: K) {}

    /// Claim mode.
    #[inline(always)]
    pub fn outside_any_transaction<K: OutsideAnyTransaction<V>>(self, _: K) {}

    /// Claim mode, a mention of the connection parameter: never satisfied.
    #[inline(always)]
    pub fn unused_in_claim_mode<K: UnusedInClaimMode<V>>(self, _: K) {}
}

/// Returns `value`; `kind` is never called. Its return type, `K`, is what the expansion
/// checks: the closure is type-checked after `value`, when the value's type is known.
#[inline(always)]
pub fn vet<T, K>(value: T, _kind: impl FnOnce(&T) -> K) -> T {
    value
}

/// The connection pools the guard recognises (and, through `Deref`, references, smart
/// pointers and `LazyLock`s of them): pools of diesel connections. A pool of anything else —
/// cache clients, broker channels — is not one.
pub trait Pool {}

/// A pool crate's pool and the tripwire's guarded pool over it, both recognised where the
/// pool's connections are diesel connections. The guarded pools refuse a checkout inside a
/// handler at run time; handing one to a helper is still refused at compile time, where the
/// mistake is cheaper.
macro_rules! pools {
    ($feature:literal: impl<$($param:ident: $bound:path),+> for $pool:ty, $guarded:ty where $($where:tt)+) => {
        #[cfg(feature = $feature)]
        impl<$($param: $bound),+> Pool for $pool where $($where)+ {}

        #[cfg(feature = $feature)]
        impl<$($param: $bound),+> Pool for $guarded where $($where)+ {}
    };
}

pools!("r2d2": impl<M: diesel::r2d2::ManageConnection>
    for diesel::r2d2::Pool<M>, crate::tripwire::r2d2::GuardedPool<M>
    where M::Connection: SimpleConnection);

pools!("deadpool": impl<M: deadpool::managed::Manager, W: From<deadpool::managed::Object<M>>>
    for deadpool::managed::Pool<M, W>, crate::tripwire::deadpool::GuardedPool<M, W>
    where M::Type: diesel_async::SimpleAsyncConnection);

pools!("bb8": impl<M: bb8::ManageConnection>
    for bb8::Pool<M>, crate::tripwire::bb8::GuardedPool<M>
    where M::Connection: diesel_async::SimpleAsyncConnection);

/// `dyn Any`: a connection may have been erased into it, to be downcast inside a helper.
pub trait Erased {}

impl Erased for dyn std::any::Any {}
impl Erased for dyn std::any::Any + Send {}
impl Erased for dyn std::any::Any + Send + Sync {}

/// The claim-mode body's stand-in, and references to it.
pub trait ClaimModeToken {}

impl ClaimModeToken for NoConnection {}
impl ClaimModeToken for &NoConnection {}
impl ClaimModeToken for &mut NoConnection {}

/// The questions, one trait per number of references, asked from the most references down.
/// `use levels::*` brings them into scope where the expansion asks.
pub mod levels {
    use super::*;

    macro_rules! level {
        ($level:ident, $answer:ident, [$($refs:tt)+] $($bounds:tt)*) => {
            #[doc(hidden)]
            pub trait $level<V: ?Sized> {
                fn inbox_kind(&self) -> $answer {
                    $answer(())
                }
            }

            impl<V: ?Sized> $level<V> for $($refs)+ Probe<'_, V> where $($bounds)* {}
        };
    }

    level!(SyncConnection0, DatabaseConnection, [&&&&&&&&&&&&&&&&&&&&] V: SimpleConnection);
    level!(SyncConnection1, DatabaseConnection, [&&&&&&&&&&&&&&&&&&&] V: Deref, <V as Deref>::Target: SimpleConnection);
    level!(SyncConnection2, DatabaseConnection, [&&&&&&&&&&&&&&&&&&] V: Deref, <V as Deref>::Target: Deref, <<V as Deref>::Target as Deref>::Target: SimpleConnection);
    level!(SyncConnection3, DatabaseConnection, [&&&&&&&&&&&&&&&&&] V: Deref, <V as Deref>::Target: Deref, <<V as Deref>::Target as Deref>::Target: Deref, <<<V as Deref>::Target as Deref>::Target as Deref>::Target: SimpleConnection);
    level!(SyncConnection4, DatabaseConnection, [&&&&&&&&&&&&&&&&] V: Deref, <V as Deref>::Target: Deref, <<V as Deref>::Target as Deref>::Target: Deref, <<<V as Deref>::Target as Deref>::Target as Deref>::Target: Deref, <<<<V as Deref>::Target as Deref>::Target as Deref>::Target as Deref>::Target: SimpleConnection);
    level!(SyncConnection5, DatabaseConnection, [&&&&&&&&&&&&&&&] V: Deref, <V as Deref>::Target: Deref, <<V as Deref>::Target as Deref>::Target: Deref, <<<V as Deref>::Target as Deref>::Target as Deref>::Target: Deref, <<<<V as Deref>::Target as Deref>::Target as Deref>::Target as Deref>::Target: Deref, <<<<<V as Deref>::Target as Deref>::Target as Deref>::Target as Deref>::Target as Deref>::Target: SimpleConnection);
    level!(ConnectionPool0, ConnectionPool, [&&&&&&&&] V: Pool);
    level!(ConnectionPool1, ConnectionPool, [&&&&&&&] V: Deref, <V as Deref>::Target: Pool);
    level!(ConnectionPool2, ConnectionPool, [&&&&&&] V: Deref, <V as Deref>::Target: Deref, <<V as Deref>::Target as Deref>::Target: Pool);
    level!(ConnectionPool3, ConnectionPool, [&&&&&] V: Deref, <V as Deref>::Target: Deref, <<V as Deref>::Target as Deref>::Target: Deref, <<<V as Deref>::Target as Deref>::Target as Deref>::Target: Pool);

    level!(ErasedAny0, ErasedAny, [&&&&] V: Erased);
    level!(ErasedAny1, ErasedAny, [&&&] V: Deref, <V as Deref>::Target: Erased);
    level!(ErasedAny2, ErasedAny, [&&] V: Deref, <V as Deref>::Target: Deref, <<V as Deref>::Target as Deref>::Target: Erased);

    #[cfg(feature = "async")]
    mod asynchronous {
        use super::*;
        use diesel_async::SimpleAsyncConnection;

        level!(AsyncConnection0, DatabaseConnection, [&&&&&&&&&&&&&&] V: SimpleAsyncConnection);
        level!(AsyncConnection1, DatabaseConnection, [&&&&&&&&&&&&&] V: Deref, <V as Deref>::Target: SimpleAsyncConnection);
        level!(AsyncConnection2, DatabaseConnection, [&&&&&&&&&&&&] V: Deref, <V as Deref>::Target: Deref, <<V as Deref>::Target as Deref>::Target: SimpleAsyncConnection);
        level!(AsyncConnection3, DatabaseConnection, [&&&&&&&&&&&] V: Deref, <V as Deref>::Target: Deref, <<V as Deref>::Target as Deref>::Target: Deref, <<<V as Deref>::Target as Deref>::Target as Deref>::Target: SimpleAsyncConnection);
        level!(AsyncConnection4, DatabaseConnection, [&&&&&&&&&&] V: Deref, <V as Deref>::Target: Deref, <<V as Deref>::Target as Deref>::Target: Deref, <<<V as Deref>::Target as Deref>::Target as Deref>::Target: Deref, <<<<V as Deref>::Target as Deref>::Target as Deref>::Target as Deref>::Target: SimpleAsyncConnection);
        level!(AsyncConnection5, DatabaseConnection, [&&&&&&&&&] V: Deref, <V as Deref>::Target: Deref, <<V as Deref>::Target as Deref>::Target: Deref, <<<V as Deref>::Target as Deref>::Target as Deref>::Target: Deref, <<<<V as Deref>::Target as Deref>::Target as Deref>::Target as Deref>::Target: Deref, <<<<<V as Deref>::Target as Deref>::Target as Deref>::Target as Deref>::Target as Deref>::Target: SimpleAsyncConnection);
    }
    #[cfg(feature = "async")]
    pub use asynchronous::*;

    #[doc(hidden)]
    pub trait ClaimToken<V: ?Sized> {
        fn inbox_kind(&self) -> ClaimModeHasNoConnection {
            ClaimModeHasNoConnection(())
        }
    }

    impl<V: ?Sized + ClaimModeToken> ClaimToken<V> for &Probe<'_, V> {}

    #[doc(hidden)]
    pub trait Anything<V: ?Sized> {
        fn inbox_kind(&self) -> NotAConnection {
            NotAConnection(())
        }
    }

    impl<V: ?Sized> Anything<V> for Probe<'_, V> {}
}

// The questions, one macro per message, each written out whole: a question expanded from
// another macro would add a line per macro to every compiler message. `vet!(value)` is the
// value, asked about where it stands; `vet!(@place place)` asks about a place by reference,
// as a statement before the one that uses it, so that nothing is moved or evaluated twice.

/// Transaction mode.
#[doc(hidden)]
#[macro_export]
macro_rules! __inbox_vet_transaction {
    (@place $place:expr) => {{
        let __inbox_value = &$place;
        #[allow(unused_imports)]
        use $crate::__private::guard::levels::*;
        $crate::__private::guard::Asked(__inbox_value).on_the_transaction(
            (&&&&&&&&&&&&&&&&&&&&$crate::__private::guard::Probe(__inbox_value)).inbox_kind(),
        );
    }};
    ($value:expr) => {
        $crate::__private::guard::vet($value, |__inbox_value| {
            #[allow(unused_imports)]
            use $crate::__private::guard::levels::*;
            $crate::__private::guard::Asked(__inbox_value).on_the_transaction(
                (&&&&&&&&&&&&&&&&&&&&$crate::__private::guard::Probe(__inbox_value)).inbox_kind(),
            )
        })
    };
}

/// Transaction mode, the receiver of a pool's checkout.
#[doc(hidden)]
#[macro_export]
macro_rules! __inbox_vet_checkout {
    (@place $place:expr) => {{
        let __inbox_value = &$place;
        #[allow(unused_imports)]
        use $crate::__private::guard::levels::*;
        $crate::__private::guard::Asked(__inbox_value).checkout_on_the_transaction(
            (&&&&&&&&&&&&&&&&&&&&$crate::__private::guard::Probe(__inbox_value)).inbox_kind(),
        );
    }};
    ($value:expr) => {
        $crate::__private::guard::vet($value, |__inbox_value| {
            #[allow(unused_imports)]
            use $crate::__private::guard::levels::*;
            $crate::__private::guard::Asked(__inbox_value).checkout_on_the_transaction(
                (&&&&&&&&&&&&&&&&&&&&$crate::__private::guard::Probe(__inbox_value)).inbox_kind(),
            )
        })
    };
}

/// Transaction mode, the connection a query is run on; `$query` is the query's
/// [`query_type`].
#[doc(hidden)]
#[macro_export]
macro_rules! __inbox_vet_read {
    ($query:ident, $value:expr) => {
        $crate::__private::guard::vet($value, |__inbox_value| {
            #[allow(unused_imports)]
            use $crate::__private::guard::levels::*;
            $crate::__private::guard::Asked(__inbox_value).read_on_the_transaction(
                $query,
                (&&&&&&&&&&&&&&&&&&&&$crate::__private::guard::Probe(__inbox_value)).inbox_kind(),
            )
        })
    };
}

/// A capture of a spawned thread or task, asked before the statement that spawns it.
#[doc(hidden)]
#[macro_export]
macro_rules! __inbox_vet_spawn {
    (@place $place:expr) => {{
        let __inbox_value = &$place;
        #[allow(unused_imports)]
        use $crate::__private::guard::levels::*;
        $crate::__private::guard::Asked(__inbox_value).not_captured_by_spawn(
            (&&&&&&&&&&&&&&&&&&&&$crate::__private::guard::Probe(__inbox_value)).inbox_kind(),
        );
    }};
}

/// Transaction mode, a name that shadows the connection parameter.
#[doc(hidden)]
#[macro_export]
macro_rules! __inbox_vet_shadowed {
    (@place $place:expr) => {{
        let __inbox_value = &$place;
        #[allow(unused_imports)]
        use $crate::__private::guard::levels::*;
        $crate::__private::guard::Asked(__inbox_value).not_the_shadowed_connection(
            (&&&&&&&&&&&&&&&&&&&&$crate::__private::guard::Probe(__inbox_value)).inbox_kind(),
        );
    }};
    ($value:expr) => {
        $crate::__private::guard::vet($value, |__inbox_value| {
            #[allow(unused_imports)]
            use $crate::__private::guard::levels::*;
            $crate::__private::guard::Asked(__inbox_value).not_the_shadowed_connection(
                (&&&&&&&&&&&&&&&&&&&&$crate::__private::guard::Probe(__inbox_value)).inbox_kind(),
            )
        })
    };
}

/// Claim mode: no value may reach the database.
#[doc(hidden)]
#[macro_export]
macro_rules! __inbox_vet_claim {
    (@place $place:expr) => {{
        let __inbox_value = &$place;
        #[allow(unused_imports)]
        use $crate::__private::guard::levels::*;
        $crate::__private::guard::Asked(__inbox_value).outside_any_transaction(
            (&&&&&&&&&&&&&&&&&&&&$crate::__private::guard::Probe(__inbox_value)).inbox_kind(),
        );
    }};
    ($value:expr) => {
        $crate::__private::guard::vet($value, |__inbox_value| {
            #[allow(unused_imports)]
            use $crate::__private::guard::levels::*;
            $crate::__private::guard::Asked(__inbox_value).outside_any_transaction(
                (&&&&&&&&&&&&&&&&&&&&$crate::__private::guard::Probe(__inbox_value)).inbox_kind(),
            )
        })
    };
}

/// Claim mode, a mention of the body's `NoConnection`: its type is known, so the question is
/// asked without inference, and the value is passed on for the compiler's own error.
#[doc(hidden)]
#[macro_export]
macro_rules! __inbox_no_connection {
    ($conn:ident) => {{
        $crate::__private::guard::Asked(&$conn)
            .unused_in_claim_mode($crate::__private::guard::ClaimModeHasNoConnection::ANSWER);
        $conn
    }};
}
