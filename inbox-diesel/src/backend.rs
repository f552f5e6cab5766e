//! What differs between database backends: how a transaction begins and commits, and how the
//! marker's id is bound. The SQL of the claim is shared.

use diesel::connection::{AnsiTransactionManager, Connection, TransactionManager};
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::query_dsl::LoadQuery;
use diesel::sql_types::{BigInt, Text};
use diesel::{QueryResult, RunQueryDsl};
use inbox_core::{InboxSchema, MessageKey};
use uuid::Uuid;

use crate::__private::HandlerSpec;

/// A diesel connection an `#[idempotent]` handler can run on.
///
/// Implemented for the connections of the enabled backends: `SqliteConnection` (feature
/// `sqlite`) and `PgConnection` (feature `postgres`). Declare the handler's connection
/// parameter as `&mut` one of them; a pooled connection (`r2d2::PooledConnection`,
/// `deadpool`, …) derefs to it, so `handler(&mut pooled, &msg)` compiles as it is.
///
/// The methods are the runtime's; they are not meant to be called directly.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a connection an #[idempotent] handler can run on",
    label = "declare this parameter as `&mut PgConnection` or `&mut SqliteConnection`",
    note = "a pooled connection derefs to its connection: declare `&mut PgConnection` and call \
            the handler with `&mut pooled_connection`"
)]
pub trait InboxConnection:
    Connection<TransactionManager = AnsiTransactionManager> + sealed::Sealed
{
    /// Opens the handler's transaction.
    #[doc(hidden)]
    fn begin_inbox_transaction(&mut self, spec: &HandlerSpec) -> QueryResult<()>;

    /// Inserts the marker unless it exists; `Ok(false)` when it already did.
    #[doc(hidden)]
    fn claim_marker(
        &mut self,
        schema: &InboxSchema,
        consumer: &str,
        key: &MessageKey,
    ) -> QueryResult<bool>;

    /// Commits the handler's transaction, failing if the transaction had been aborted.
    #[doc(hidden)]
    fn commit_inbox_transaction(&mut self) -> QueryResult<()> {
        AnsiTransactionManager::commit_transaction(self)
    }

    /// Rolls the handler's transaction back if it is open; `Ok` when none is.
    #[doc(hidden)]
    fn roll_back_inbox_transaction(&mut self) -> QueryResult<()> {
        match AnsiTransactionManager::rollback_transaction(self) {
            Err(diesel::result::Error::NotInTransaction) => Ok(()),
            other => other,
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// `INSERT INTO <table> (message_id, consumer, processed_at) VALUES (?, ?, CURRENT_TIMESTAMP)
/// ON CONFLICT (message_id, consumer) DO NOTHING RETURNING id`
///
/// `DO NOTHING` suppresses only a conflict on the `(message_id, consumer)` index, so any other
/// violation still raises; no error is raised for a duplicate, so a PostgreSQL transaction is
/// never aborted by one. While another transaction holds an uncommitted marker for the same
/// key, the insert waits for it: a commit makes this a duplicate, a rollback lets this insert
/// through.
///
/// Written as a query fragment rather than `sql_query` so that diesel caches its prepared
/// statement (keyed by the SQL text).
pub(crate) struct ClaimMarker<'a, B> {
    table: &'a str,
    id: &'a Uuid,
    consumer: &'a str,
    bind_id: B,
}

impl<'a, B> ClaimMarker<'a, B> {
    pub(crate) fn new(
        schema: &'a InboxSchema,
        consumer: &'a str,
        id: &'a Uuid,
        bind_id: B,
    ) -> Self {
        Self {
            table: schema.table(),
            id,
            consumer,
            bind_id,
        }
    }
}

impl<B> QueryId for ClaimMarker<'_, B> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<B> Query for ClaimMarker<'_, B> {
    type SqlType = BigInt;
}

impl<B, C> RunQueryDsl<C> for ClaimMarker<'_, B> {}

/// How a backend binds the 16-byte message id.
pub(crate) type BindId<DB> = for<'b> fn(&mut AstPass<'_, 'b, DB>, &'b Uuid) -> QueryResult<()>;

impl<DB: diesel::backend::Backend> QueryFragment<DB> for ClaimMarker<'_, BindId<DB>>
where
    DB: diesel::sql_types::HasSqlType<Text>,
    str: diesel::serialize::ToSql<Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("INSERT INTO ");
        push_table(&mut out, self.table)?;
        out.push_sql(" (message_id, consumer, processed_at) VALUES (");
        (self.bind_id)(&mut out, self.id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, str>(self.consumer)?;
        out.push_sql(
            ", CURRENT_TIMESTAMP) ON CONFLICT (message_id, consumer) DO NOTHING RETURNING id",
        );
        Ok(())
    }
}

/// Runs the claim; `Ok(false)` when the marker already existed (no row came back).
fn claim<C>(
    conn: &mut C,
    schema: &InboxSchema,
    consumer: &str,
    key: &MessageKey,
    bind_id: BindId<C::Backend>,
) -> QueryResult<bool>
where
    C: Connection,
    for<'q> ClaimMarker<'q, BindId<C::Backend>>: LoadQuery<'q, C, i64>,
{
    let id = key.stored_id();
    let claim = ClaimMarker::new(schema, consumer, &id, bind_id);
    Ok(!claim.load::<i64>(conn)?.is_empty())
}

fn push_table<DB: diesel::backend::Backend>(
    out: &mut AstPass<'_, '_, DB>,
    table: &str,
) -> QueryResult<()> {
    let mut parts = table.split('.');
    out.push_identifier(parts.next().unwrap_or_default())?;
    for part in parts {
        out.push_sql(".");
        out.push_identifier(part)?;
    }
    Ok(())
}

#[cfg(feature = "sqlite")]
pub(crate) mod sqlite {
    use super::*;
    use diesel::sqlite::{Sqlite, SqliteConnection};

    impl sealed::Sealed for SqliteConnection {}

    pub(crate) fn bind_id<'b>(out: &mut AstPass<'_, 'b, Sqlite>, id: &'b Uuid) -> QueryResult<()> {
        out.push_bind_param::<diesel::sql_types::Binary, [u8]>(&id.as_bytes()[..])
    }

    impl InboxConnection for SqliteConnection {
        /// `BEGIN IMMEDIATE` takes the write lock at once, so two deliveries queue on the busy
        /// timeout instead of both reading and then failing to upgrade to a writer.
        fn begin_inbox_transaction(&mut self, spec: &HandlerSpec) -> QueryResult<()> {
            let sql = format!(
                "PRAGMA busy_timeout = {}; BEGIN IMMEDIATE",
                spec.sqlite_busy_timeout_ms
            );
            AnsiTransactionManager::begin_transaction_sql(self, &sql)
        }

        fn claim_marker(
            &mut self,
            schema: &InboxSchema,
            consumer: &str,
            key: &MessageKey,
        ) -> QueryResult<bool> {
            claim(self, schema, consumer, key, bind_id)
        }
    }
}

#[cfg(feature = "postgres")]
pub(crate) mod postgres {
    use super::*;
    use diesel::connection::SimpleConnection;
    use diesel::pg::{Pg, PgConnection};

    impl sealed::Sealed for PgConnection {}

    pub(crate) fn bind_id<'b>(out: &mut AstPass<'_, 'b, Pg>, id: &'b Uuid) -> QueryResult<()> {
        out.push_bind_param::<diesel::sql_types::Uuid, Uuid>(id)
    }

    impl InboxConnection for PgConnection {
        fn begin_inbox_transaction(&mut self, spec: &HandlerSpec) -> QueryResult<()> {
            AnsiTransactionManager::begin_transaction_sql(self, spec.isolation.begin_sql())
        }

        fn claim_marker(
            &mut self,
            schema: &InboxSchema,
            consumer: &str,
            key: &MessageKey,
        ) -> QueryResult<bool> {
            claim(self, schema, consumer, key, bind_id)
        }

        /// PostgreSQL answers `COMMIT` in an aborted transaction with a silent `ROLLBACK`, so
        /// diesel would report success for work that was thrown away. The `SELECT 1` sent in
        /// the same round trip fails with 25P02 ("current transaction is aborted") in exactly
        /// that case, and the `COMMIT` after it is then never run.
        fn commit_inbox_transaction(&mut self) -> QueryResult<()> {
            self.batch_execute("SELECT 1; COMMIT")
        }
    }
}
