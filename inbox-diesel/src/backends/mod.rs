//! What each backend knows, a file each: its SQL where it differs ([`Dialect`]), how it
//! binds and reads a message id ([`BindId`](crate::dialect::BindId)), its catalog's queries
//! and rules for the startup check ([`Catalogs`](crate::dialect::catalog::Catalogs)), and
//! its handler's transaction ([`Session`]), written once over [`Io`] for its sync and its
//! diesel-async connection, which each file names as the backend's connections. The
//! connection traits are sealed: only this crate's connections implement them.
//!
//! [`Dialect`]: crate::dialect::Dialect
//! [`Io`]: crate::io::Io

use diesel::QueryResult;

pub(crate) use crate::io::Session;

/// [`BindId`](crate::dialect::BindId) for a backend that stores a message id as its 16 bytes
/// (MySQL's `BINARY(16)`, SQLite's `BLOB`).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
macro_rules! bind_id_as_bytes {
    ($backend:ty) => {
        impl crate::dialect::BindId for $backend {
            type IdSql = diesel::sql_types::Binary;
            type IdRow = Vec<u8>;

            fn bind_id<'b>(
                out: &mut diesel::query_builder::AstPass<'_, 'b, Self>,
                id: &'b uuid::Uuid,
            ) -> diesel::QueryResult<()> {
                out.push_bind_param::<diesel::sql_types::Binary, [u8]>(&id.as_bytes()[..])
            }

            fn id_of(row: Vec<u8>) -> Option<uuid::Uuid> {
                uuid::Uuid::from_slice(&row).ok()
            }
        }
    };
}

/// The async side of a server backend: `$conn`, a diesel-async connection, runs handlers
/// ([`AsyncInboxConnection`]); its transaction is opened with SQL by diesel-async's manager,
/// and its statement in flight cancelled by the [`StatementCancel`] `$cancel` made of the
/// connection's cancel token.
#[cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
macro_rules! async_server_connection {
    ($conn:ty, $cancel:path) => {
        impl super::AsyncInboxConnection for $conn {}

        impl crate::io::BeginWithSql for $conn {
            async fn begin_sql(&mut self, sql: &str) -> diesel::QueryResult<()> {
                diesel_async::AnsiTransactionManager::begin_transaction_sql(self, sql).await
            }
        }

        impl super::sealed::AsyncConnection for $conn {
            fn statement_cancel(&self) -> Option<super::StatementCancel> {
                Some($cancel(self.cancel_token()))
            }
        }
    };
}

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

/// The connection traits, in a module no other crate can name: only this crate's
/// connections implement them (sealed), and what they carry is not reachable from outside —
/// a `PgConnection` gains nothing for a user who imports `InboxConnection`.
pub(crate) mod sealed {
    #[cfg(feature = "async")]
    pub use super::asynchronous::sealed::AsyncConnection;
    use diesel::connection::AnsiTransactionManager;

    /// A sync connection the runtime runs on: its statements and transactions are the
    /// backend's [`Session`](crate::io::Session), over [`Blocking`](crate::io::Blocking).
    pub trait Connection:
        diesel::connection::LoadConnection<
            TransactionManager = AnsiTransactionManager,
            Backend: crate::io::Session,
        > + Send
    {
    }
}

/// The compile error of a handler parameter that is not a connection the runtime runs on, the
/// same on [`InboxConnection`] and [`HandlerConnection`]; `more_notes` are added after the
/// shared ones.
macro_rules! not_a_connection {
    (more_notes: [$($note:literal),*] $item:item) => {
        #[diagnostic::on_unimplemented(
            message = "`{Self}` is not a connection an #[idempotent] handler can run on",
            label = "declare this parameter as `&mut PgConnection`, `&mut MysqlConnection` or `&mut SqliteConnection`",
            note = "each backend is a feature of inbox-diesel, none of them on by default: \
                    `features = [\"postgres\"]`, `[\"mysql\"]` or `[\"sqlite\"]`",
            note = "a pooled connection derefs to its connection: declare `&mut PgConnection` and call \
                    the handler with `&mut pooled_connection`",
            note = "the handler's connection is its first `&mut …Connection` parameter; if that one is \
                    another client, name the database connection with `conn = …`"
            $(, note = $note)*
        )]
        $item
    };
    ($item:item) => {
        not_a_connection! { more_notes: [] $item }
    };
}

not_a_connection! {
    /// A diesel connection an `#[idempotent]` handler can run on.
    ///
    /// Implemented for the connections of the enabled backends: `SqliteConnection` (feature
    /// `sqlite`), `PgConnection` (feature `postgres`) and `MysqlConnection` (feature `mysql`).
    /// Declare the handler's connection parameter as `&mut` one of them; a pooled connection
    /// (`r2d2::PooledConnection`, …) derefs to it, so `handler(&mut pooled, &msg)` compiles as it
    /// is.
    ///
    /// Sealed: only this crate's connections implement it, and what the runtime calls on them is
    /// not reachable from outside the crate.
    pub trait InboxConnection: sealed::Connection {
        /// The connection's backend: which SQL dialect and DDL apply.
        const BACKEND: crate::dialect::Backend = <Self::Backend as crate::dialect::Dialect>::BACKEND;
    }
}

not_a_connection! {
    more_notes: ["an application's enum of connections (`#[derive(diesel::MultiConnection)]`) \
                  also derives `inbox_diesel::MultiConnection`"]
    /// What a sync handler's connection parameter may be: a connection the runtime runs on
    /// ([`InboxConnection`]), or an application's enum of them — diesel's `MultiConnection`, one
    /// type for several backends, as Vaultwarden's — that also derives
    /// [`inbox_diesel::MultiConnection`](crate::MultiConnection).
    ///
    /// On an enum, the runtime runs its own statements on the variant the enum holds, and the
    /// body is given the enum: its queries, written for diesel's `MultiBackend`, run in the same
    /// transaction as the marker (diesel's `MultiConnection` hands its transactions to the
    /// variant).
    ///
    /// Not to be implemented by hand: the derive writes the one method.
    pub trait HandlerConnection: diesel::Connection + Sized + Send {
        /// Calls `visit` with the connection and the way from it to the connection the runtime
        /// runs on: itself, or the enum's variant.
        #[doc(hidden)]
        fn __inbox_visit<V: Visit<Self>>(&mut self, visit: V) -> V::Output;
    }
}

impl<C: InboxConnection> HandlerConnection for C {
    fn __inbox_visit<V: Visit<Self>>(&mut self, visit: V) -> V::Output {
        visit.visit(self, itself::<C>)
    }
}

fn itself<C>(conn: &mut C) -> &mut C {
    conn
}

/// A runtime's work on a handler's connection `O` ([`HandlerConnection`]), done on the
/// connection `project` finds in it — its variant, on an application's enum.
#[doc(hidden)]
pub trait Visit<O> {
    /// What the work answers.
    type Output;

    /// Does the work: the body is given `outer`; the runtime's statements run on
    /// `project(outer)`.
    fn visit<C: InboxConnection>(
        self,
        outer: &mut O,
        project: fn(&mut O) -> &mut C,
    ) -> Self::Output;
}

/// An operation of the library's on a connection of one backend (the startup check, the
/// purge, the outbox, the test kit's clock), run by [`on_backend`] on the connection an
/// application's connection leads to.
pub(crate) trait OnBackend {
    /// What the operation answers.
    type Output;

    /// Runs the operation on `conn`.
    fn run<C: InboxConnection>(self, conn: &mut C) -> Self::Output;
}

/// [`OnBackend`] as a [`Visit`]: the operation on the projected connection.
struct OnProjected<F>(F);

impl<O, F: OnBackend> Visit<O> for OnProjected<F> {
    type Output = F::Output;

    fn visit<C: InboxConnection>(self, outer: &mut O, project: fn(&mut O) -> &mut C) -> F::Output {
        self.0.run(project(outer))
    }
}

/// Runs `operation` on `conn`'s connection of one backend: `conn` itself, or the variant an
/// application's enum of connections holds.
pub(crate) fn on_backend<H: HandlerConnection, F: OnBackend>(
    conn: &mut H,
    operation: F,
) -> F::Output {
    conn.__inbox_visit(OnProjected(operation))
}

/// MySQL and MariaDB: whether `autocommit` is on for the session.
pub(crate) async fn autocommit_on<I: crate::io::Io>(io: &mut I) -> QueryResult<bool> {
    #[derive(diesel::QueryableByName)]
    struct Autocommit {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let sql = crate::dialect::Sql::new("SELECT CAST(@@SESSION.autocommit AS SIGNED) AS n");
    let rows = io.load::<Autocommit>(&sql).await?;
    Ok(rows.first().is_some_and(|row| row.n == 1))
}

/// What the derive of `MultiConnection` calls where the body replaced the enum's variant with
/// another while the handler's transaction was open on the first: that transaction is gone
/// with the connection that held it, and nothing of it can commit.
#[doc(hidden)]
#[track_caller]
pub fn variant_replaced() -> ! {
    panic!(
        "inbox: the handler's body replaced its connection (another variant of the \
         MultiConnection enum) inside the handler's transaction"
    )
}

#[cfg(feature = "async")]
pub use asynchronous::AsyncInboxConnection;
#[cfg(feature = "async")]
pub(crate) use asynchronous::CancelIfDropped;
#[cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
pub(crate) use asynchronous::StatementCancel;

#[cfg(feature = "async")]
mod asynchronous {
    /// A diesel-async connection an `async fn` `#[idempotent]` handler can run on.
    ///
    /// Implemented for `AsyncPgConnection` (features `async` and `postgres`),
    /// `AsyncMysqlConnection` (features `async` and `mysql`) and
    /// `SyncConnectionWrapper<SqliteConnection>` (features `async` and `sqlite`). Declare the
    /// handler's connection parameter as `&mut` one of them; a pooled connection (diesel-async's
    /// deadpool, bb8 or mobc support) derefs to it, so `handler(&mut pooled, &msg).await`
    /// compiles as it is.
    ///
    /// Sealed: only this crate's connections implement it, and what the runtime calls on them is
    /// not reachable from outside the crate.
    ///
    /// # Cancellation
    ///
    /// A handler's future may be dropped at any `.await` — by a timeout, a `select!`, a shutdown.
    /// Nothing half-done can commit: the marker and the body's writes commit in one `COMMIT`, sent
    /// only after the body has finished. What is left is a connection inside an open transaction,
    /// which diesel-async's transaction manager still counts as open:
    ///
    /// - bb8 checks a connection when it comes back and closes a broken one at once; the server
    ///   rolls the transaction back and its locks are released;
    /// - deadpool and mobc check a connection when it is next checked out and discard it then;
    ///   until then the abandoned transaction holds its locks — on PostgreSQL the marker of that
    ///   message (a redelivery waits for it) and the rows the body wrote, on SQLite the whole
    ///   database. The handler bounds that on PostgreSQL and MariaDB: the server ends a handler
    ///   transaction idle for `idle_in_transaction_ms` (10 s by default). MySQL has no such
    ///   bound: use bb8 there where handlers can be cancelled;
    /// - a connection used without a pool has its transaction manager put in error: the
    ///   application's own `transaction` or `rollback_transaction` on it is refused
    ///   (`BrokenTransactionManager`) — plain statements join the dropped transaction — until
    ///   the next handler call on it rolls the dropped transaction back, puts back what the
    ///   handler set for the session and runs as usual.
    ///
    /// A body that *panics* is different: the runtime catches the panic at the body's poll, rolls
    /// the transaction back, and lets the panic go on, so the connection comes back clean.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` is not a connection an async #[idempotent] handler can run on",
        label = "declare this parameter as `&mut AsyncPgConnection`, `&mut AsyncMysqlConnection` or `&mut SyncConnectionWrapper<SqliteConnection>`",
        note = "each backend is a feature of inbox-diesel, none of them on by default: \
                `features = [\"postgres\", \"async\"]`, `[\"mysql\", \"async\"]` or \
                `[\"sqlite\", \"async\"]`",
        note = "a pooled connection derefs to its connection: declare `&mut AsyncPgConnection` and \
                call the handler with `&mut pooled_connection`; a generic function \
                (`handler::run_once_async`, `inbox_axum::Idempotent::run`) takes \
                `&mut *pooled_connection`",
        note = "the handler's connection is its first `&mut …Connection` parameter; if that one is \
                another client, name the database connection with `conn = …`",
        note = "inbox-diesel builds on diesel-async 0.9: with another version in the build \
                (`cargo tree -d`), its `AsyncPgConnection` is another type"
    )]
    pub trait AsyncInboxConnection: sealed::AsyncConnection {
        /// The connection's backend: which SQL dialect and DDL apply.
        const BACKEND: crate::dialect::Backend =
            <Self::Backend as crate::dialect::Dialect>::BACKEND;
    }

    /// What a diesel-async connection adds to its backend's [`Session`](crate::io::Session):
    /// how its manager opens a transaction with SQL ([`BeginWithSql`](crate::io::BeginWithSql)),
    /// and how a statement in flight is cancelled. Sealed like the sync one.
    pub(crate) mod sealed {
        /// What the runtime asks of a diesel-async connection.
        pub trait AsyncConnection:
            diesel_async::AsyncConnection<Backend: crate::io::Session>
            + crate::io::BeginWithSql
            + Send
        {
            /// What cancels the statement in flight on this connection from elsewhere (the
            /// server's cancel request, `KILL QUERY`); `None` where the backend has none
            /// (SQLite, whose statements run on the caller's thread).
            fn statement_cancel(&self) -> Option<super::StatementCancel> {
                None
            }
        }
    }

    /// The server's way to cancel a statement of the runtime's own in flight on a
    /// connection, from outside it: sent when the future awaiting the statement is dropped
    /// ([`CancelIfDropped`]).
    pub enum StatementCancel {
        /// PostgreSQL's cancel request, on a connection of its own.
        #[cfg(feature = "postgres")]
        Postgres(tokio_postgres::CancelToken),
        /// `KILL QUERY`, on a connection of its own.
        #[cfg(feature = "mysql")]
        Mysql(diesel_async::MysqlCancelToken),
    }

    /// Armed while one of the runtime's own statements that can wait on a lock — the
    /// marker's insert — is in flight on a diesel-async connection. A future dropped there (a
    /// caller's `tokio::time::timeout`) leaves the statement waiting on the server: it takes
    /// the lock when the holder lets go and keeps it, idle in the abandoned transaction, until
    /// the connection is used again or the idle bound ends the session, and the next
    /// delivery of the message waits behind it — a chain of timeouts under a caller whose
    /// timeout is shorter than the bound. Dropped armed after waiting [`Self::AFTER`], it
    /// sends the server's cancel request on a task of the current tokio runtime; the
    /// statement ends (`57014` or `1317`, classed `Canceled`, retried, should it reach the
    /// connection's next statement instead) and its transaction holds no marker.
    /// Best effort: without a runtime, or where the cancel's own connection is refused (a
    /// PostgreSQL that requires TLS), the idle bound still ends it.
    pub(crate) struct CancelIfDropped {
        cancel: Option<StatementCancel>,
        since: std::time::Instant,
    }

    impl CancelIfDropped {
        /// How long a statement must have been in flight before a drop cancels it: a
        /// statement cut off sooner has most likely not reached a lock, and a cancel that
        /// arrives after it finished would land on the connection's next statement.
        pub(crate) const AFTER: std::time::Duration = std::time::Duration::from_millis(100);

        /// Armed for the statement about to be sent on `conn`.
        pub(crate) fn arm<C: AsyncInboxConnection>(conn: &C) -> Self {
            CancelIfDropped {
                cancel: sealed::AsyncConnection::statement_cancel(conn),
                since: std::time::Instant::now(),
            }
        }

        /// The statement answered: nothing to cancel.
        pub(crate) fn disarm(mut self) {
            self.cancel = None;
        }
    }

    impl Drop for CancelIfDropped {
        fn drop(&mut self) {
            let Some(cancel) = self.cancel.take() else {
                return;
            };
            if self.since.elapsed() >= Self::AFTER {
                cancel.send();
            }
        }
    }

    impl StatementCancel {
        /// Sends the cancel on a task of the current tokio runtime.
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        fn send(self) {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return;
            };
            tracing::debug!(
                "a handler was dropped while its marker's insert waited: cancelling it"
            );
            let unsent = |error: String| {
                tracing::debug!(%error, "the cancel of a dropped handler's statement was not sent");
            };
            match self {
                #[cfg(feature = "postgres")]
                StatementCancel::Postgres(token) => {
                    runtime.spawn(async move {
                        if let Err(e) = token.cancel_query(tokio_postgres::NoTls).await {
                            unsent(e.to_string());
                        }
                    });
                }
                #[cfg(feature = "mysql")]
                StatementCancel::Mysql(token) => {
                    runtime.spawn(async move {
                        if let Err(e) = token.cancel_query().await {
                            unsent(e.to_string());
                        }
                    });
                }
            }
        }

        /// No backend with a cancel: no value to send.
        #[cfg(not(any(feature = "postgres", feature = "mysql")))]
        fn send(self) {
            match self {}
        }
    }
}

/// MariaDB: what the check before `COMMIT` failing says
/// ([`HandlerSpec::MARIADB_STILL_OURS`](crate::spec::HandlerSpec)): the connection lost, as
/// it is; anything else, that the server had ended the handler's transaction — the body
/// swallowed the error that ended it ([`Error::TransactionAborted`](crate::Error)).
#[cfg(feature = "mysql")]
pub(crate) fn transaction_gone(
    error: diesel::result::Error,
    schema: &inbox_core::InboxSchema,
) -> diesel::result::Error {
    match crate::classify::class_of(&error, schema) {
        inbox_core::ErrorClass::ConnectionLost => error,
        _ => diesel::result::Error::QueryBuilderError(Box::new(
            crate::error::Error::TransactionAborted { attempts: 1 },
        )),
    }
}

/// MariaDB, after the handler's `COMMIT`: `autocommit` put back
/// ([`HandlerSpec::MARIADB_AUTOCOMMIT_BACK`](crate::spec::HandlerSpec)). The transaction
/// has committed, and what it decided stands; a failure is logged (a lost connection takes
/// the session's setting with it).
#[cfg(feature = "mysql")]
pub(crate) fn autocommit_back(put_back: QueryResult<()>) {
    if let Err(e) = put_back {
        tracing::error!(error = %e, "putting autocommit back on the session failed after the commit");
    }
}
