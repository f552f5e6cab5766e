//! What differs between database backends: how a transaction begins and commits, and how the
//! marker's id is bound. The SQL of the claim is shared.

use std::marker::PhantomData;

use diesel::connection::{AnsiTransactionManager, Connection, TransactionManager};
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Text};
use diesel::{QueryResult, RunQueryDsl};
use inbox_core::{InboxSchema, MessageKey};
use uuid::Uuid;

use crate::__private::HandlerSpec;
use crate::claim::{self, ClaimAnswer, ClaimStep};
use crate::verify::{Layout, SessionMark};

/// A diesel connection an `#[idempotent]` handler can run on.
///
/// Implemented for the connections of the enabled backends: `SqliteConnection` (feature
/// `sqlite`), `PgConnection` (feature `postgres`) and `MysqlConnection` (feature `mysql`).
/// Declare the handler's connection parameter as `&mut` one of them; a pooled connection
/// (`r2d2::PooledConnection`, …) derefs to it, so `handler(&mut pooled, &msg)` compiles as it
/// is.
///
/// The methods are the runtime's; they are not meant to be called directly.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a connection an #[idempotent] handler can run on",
    label = "declare this parameter as `&mut PgConnection`, `&mut MysqlConnection` or `&mut SqliteConnection`",
    note = "a pooled connection derefs to its connection: declare `&mut PgConnection` and call \
            the handler with `&mut pooled_connection`",
    note = "the handler's connection is its first `&mut …Connection` parameter; if that one is \
            another client, name the database connection with `conn = …`"
)]
pub trait InboxConnection:
    diesel::connection::LoadConnection<
        TransactionManager = AnsiTransactionManager,
        Backend: crate::dialect::Dialect,
    > + sealed::Sealed
{
    /// Opens the handler's transaction; `mariadb`: the startup check found a MariaDB server.
    #[doc(hidden)]
    fn begin_inbox_transaction(&mut self, spec: &HandlerSpec, mariadb: bool) -> QueryResult<()>;

    /// After the handler's transaction ended (committed or rolled back): puts back what
    /// [`begin_inbox_transaction`](Self::begin_inbox_transaction) set for the session.
    #[doc(hidden)]
    fn end_inbox_transaction(&mut self, _spec: &HandlerSpec, _mariadb: bool) -> QueryResult<()> {
        Ok(())
    }

    /// `on_locked = "in_flight"`: lock waits as the session had them, after the marker's claim.
    #[doc(hidden)]
    fn wait_for_locks(&mut self, _spec: &HandlerSpec, _claimed: bool) -> QueryResult<()> {
        Ok(())
    }

    /// Inserts the marker unless it exists; `Ok(false)` when it already did. `text`: the
    /// key's text, written to `key_text`.
    #[doc(hidden)]
    fn claim_marker(
        &mut self,
        schema: &InboxSchema,
        consumer: &str,
        key: &MessageKey,
        layout: Layout,
    ) -> QueryResult<bool>;

    /// Inserts the markers of `ids` (distinct) that do not exist yet; returns those it
    /// inserted. `texts`: the keys' texts, in the order of `ids`, written to `key_text`.
    #[doc(hidden)]
    fn claim_markers(
        &mut self,
        schema: &InboxSchema,
        consumer: &str,
        ids: &[Uuid],
        texts: Option<&[String]>,
        layout: Layout,
    ) -> QueryResult<Vec<Uuid>>;

    /// Claim mode: checks that no transaction is open — each claim statement must commit on
    /// its own — and prepares the connection for them.
    #[doc(hidden)]
    fn prepare_claim(&mut self, _spec: &HandlerSpec) -> QueryResult<()> {
        refuse_open_transaction(AnsiTransactionManager::transaction_manager_status_mut(self))
    }

    /// The backend, for the SQL that is not written once.
    #[doc(hidden)]
    const BACKEND: crate::schema::Backend;

    /// Claim mode: runs one step, committed on its own.
    #[doc(hidden)]
    fn claim_step(
        &mut self,
        spec: &HandlerSpec,
        key: &MessageKey,
        step: ClaimStep,
    ) -> QueryResult<ClaimAnswer>;

    /// Commits the handler's transaction, failing if the transaction had been aborted.
    #[doc(hidden)]
    fn commit_inbox_transaction(&mut self) -> QueryResult<()> {
        AnsiTransactionManager::commit_transaction(self)
    }

    /// Opens the transaction of [`unique::serialize_on`](crate::unique::serialize_on): one
    /// that holds the database's write lock from its start where the backend has one
    /// (SQLite's `BEGIN IMMEDIATE`), one whose statements each see what committed before them
    /// on PostgreSQL (READ COMMITTED), a plain one elsewhere.
    #[doc(hidden)]
    fn begin_write_transaction(&mut self) -> QueryResult<()> {
        AnsiTransactionManager::begin_transaction(self)
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

/// The items of [`InboxConnection`] that read the same on every backend's connection: its
/// [`Backend`](crate::schema::Backend), the startup check's catalog, claim mode's statements.
macro_rules! shared_steps {
    ($backend:ident) => {
        const BACKEND: crate::schema::Backend = crate::schema::Backend::$backend;

        fn claim_step(
            &mut self,
            spec: &HandlerSpec,
            key: &MessageKey,
            step: ClaimStep,
        ) -> QueryResult<ClaimAnswer> {
            claim::run_step(self, &spec.schema, spec.consumer.as_str(), key, step)
        }
    };
}

/// `AlreadyInTransaction` when the transaction manager whose `status` this is — diesel's or
/// diesel-async's, which share the type — has a transaction open: claim mode's statements
/// and purge's batches must commit as they run, not when the caller's transaction does.
pub(crate) fn refuse_open_transaction(
    status: &mut diesel::connection::TransactionManagerStatus,
) -> QueryResult<()> {
    match status.transaction_depth()? {
        Some(_) => Err(diesel::result::Error::AlreadyInTransaction),
        None => Ok(()),
    }
}

/// The marker insert, written once for every backend:
///
/// ```sql
/// INSERT INTO <table> (message_id, consumer, processed_at) VALUES (?, ?, <now>)
///     ON CONFLICT (message_id, consumer) DO NOTHING RETURNING 1    -- PostgreSQL, SQLite
/// ```
///
/// On a table with `key_text`, the key's text is a third column and bind.
///
/// `DO NOTHING` suppresses only a conflict on the `(message_id, consumer)` index, so any other
/// violation still raises; no error is raised for a duplicate, so a PostgreSQL transaction is
/// never aborted by one. MySQL and MariaDB have no such clause (`INSERT IGNORE` would hide
/// every other error, `ON DUPLICATE KEY UPDATE` reports a duplicate like an insert): there
/// the plain insert fails with error 1062 naming the inbox index, which rolls back that
/// statement only. Either way, while another transaction holds an uncommitted marker for the
/// same key, the insert waits for it: a commit makes this a duplicate, a rollback lets this
/// insert through.
///
/// A query fragment rather than `sql_query`, so that diesel caches its prepared statement
/// (keyed by the SQL text).
pub(crate) struct ClaimMarker<'a, DB> {
    table: &'a str,
    id: &'a Uuid,
    consumer: &'a str,
    text: Option<&'a str>,
    /// MySQL and MariaDB: the insert requires the check's mark on the session.
    mark: Option<SessionMark>,
    backend: PhantomData<DB>,
}

impl<'a, DB> ClaimMarker<'a, DB> {
    pub(crate) fn new(
        schema: &'a InboxSchema,
        consumer: &'a str,
        id: &'a Uuid,
        text: Option<&'a str>,
        mark: Option<SessionMark>,
    ) -> Self {
        Self {
            table: schema.table(),
            id,
            consumer,
            text,
            mark,
            backend: PhantomData,
        }
    }
}

impl<DB> QueryId for ClaimMarker<'_, DB> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<DB> Query for ClaimMarker<'_, DB> {
    type SqlType = BigInt;
}

impl<DB, C> RunQueryDsl<C> for ClaimMarker<'_, DB> {}

/// What the marker insert needs to know about a backend.
pub(crate) trait MarkerDialect:
    diesel::backend::Backend + diesel::sql_types::HasSqlType<Text>
where
    str: diesel::serialize::ToSql<Text, Self>,
{
    /// The current time, as the backend writes it.
    const NOW: &'static str;
    /// What follows `VALUES (…)`: how a duplicate is reported.
    const ON_CONFLICT: &'static str;
    /// What follows a claim's `VALUES (…)`: how a duplicate is reported, without `RETURNING`.
    const CLAIM_ON_CONFLICT: &'static str;
    /// The current time as `claimed_until` is written and compared (sub-second).
    const LEASE_NOW: &'static str;
    /// The current time plus a bound number of milliseconds: the SQL before and after the
    /// bind.
    const LEASE_UNTIL: (&'static str, &'static str);
    /// The type a 64-bit integer is cast to.
    const BIGINT: &'static str;
    /// Which backend this is, for the SQL written per backend.
    const KIND: crate::schema::Backend;
    /// Binds the 16-byte message id.
    fn bind_id<'b>(out: &mut AstPass<'_, 'b, Self>, id: &'b Uuid) -> QueryResult<()>;
    /// Binds a 64-bit integer.
    fn bind_int<'b>(out: &mut AstPass<'_, 'b, Self>, value: &'b i64) -> QueryResult<()>;
}

impl<DB: MarkerDialect> QueryFragment<DB> for ClaimMarker<'_, DB>
where
    str: diesel::serialize::ToSql<Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("INSERT INTO ");
        push_table(&mut out, self.table)?;
        out.push_sql(match self.text {
            Some(_) => " (message_id, consumer, key_text, processed_at) VALUES (",
            None => " (message_id, consumer, processed_at) VALUES (",
        });
        DB::bind_id(&mut out, self.id)?;
        out.push_sql(", ");
        match self.mark {
            Some(mark) => {
                let (before, after) = mark.guard();
                out.push_sql(&before);
                out.push_bind_param::<Text, str>(self.consumer)?;
                out.push_sql(after);
            }
            None => out.push_bind_param::<Text, str>(self.consumer)?,
        }
        out.push_sql(", ");
        if let Some(text) = self.text {
            out.push_bind_param::<Text, str>(text)?;
            out.push_sql(", ");
        }
        out.push_sql(DB::NOW);
        out.push_sql(")");
        out.push_sql(DB::ON_CONFLICT);
        Ok(())
    }
}

/// The markers of a batch in one statement, returning the ids of those inserted:
///
/// ```sql
/// INSERT INTO <table> (message_id, consumer, processed_at) VALUES (?, ?, <now>), …
///     ON CONFLICT (message_id, consumer) DO NOTHING RETURNING message_id
/// ```
///
/// PostgreSQL and SQLite; `ST` is the SQL type of the returned id.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) struct ClaimMarkers<'a, DB, ST> {
    table: &'a str,
    ids: &'a [Uuid],
    consumer: &'a str,
    /// The keys' texts, in the order of `ids`, for a table with `key_text`.
    texts: Option<&'a [String]>,
    types: PhantomData<(DB, ST)>,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl<'a, DB, ST> ClaimMarkers<'a, DB, ST> {
    pub(crate) fn new(
        schema: &'a InboxSchema,
        consumer: &'a str,
        ids: &'a [Uuid],
        texts: Option<&'a [String]>,
    ) -> Self {
        Self {
            table: schema.table(),
            ids,
            consumer,
            texts,
            types: PhantomData,
        }
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl<DB, ST> QueryId for ClaimMarkers<'_, DB, ST> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl<DB, ST> Query for ClaimMarkers<'_, DB, ST> {
    type SqlType = ST;
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl<DB, ST, C> RunQueryDsl<C> for ClaimMarkers<'_, DB, ST> {}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl<DB: MarkerDialect, ST> QueryFragment<DB> for ClaimMarkers<'_, DB, ST>
where
    str: diesel::serialize::ToSql<Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("INSERT INTO ");
        push_table(&mut out, self.table)?;
        out.push_sql(match self.texts {
            Some(_) => " (message_id, consumer, key_text, processed_at) VALUES ",
            None => " (message_id, consumer, processed_at) VALUES ",
        });
        for (n, id) in self.ids.iter().enumerate() {
            if n > 0 {
                out.push_sql(", ");
            }
            out.push_sql("(");
            DB::bind_id(&mut out, id)?;
            out.push_sql(", ");
            out.push_bind_param::<Text, str>(self.consumer)?;
            out.push_sql(", ");
            if let Some(texts) = self.texts {
                out.push_bind_param::<Text, str>(&texts[n])?;
                out.push_sql(", ");
            }
            out.push_sql(DB::NOW);
            out.push_sql(")");
        }
        out.push_sql(" ON CONFLICT (message_id, consumer) DO NOTHING RETURNING message_id");
        Ok(())
    }
}

/// `ON CONFLICT … DO NOTHING RETURNING 1`: no row back means the marker existed. A constant,
/// not `id`: the claim depends on no column but the key's.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
const ON_CONFLICT_RETURNING: &str =
    " ON CONFLICT (message_id, consumer) DO NOTHING RETURNING CAST(1 AS BIGINT)";

/// `ON CONFLICT … DO NOTHING`: 0 rows inserted means the row existed.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
const ON_CONFLICT_DO_NOTHING: &str = " ON CONFLICT (message_id, consumer) DO NOTHING";

/// Runs the claim of PostgreSQL and SQLite; `Ok(false)` when the marker already existed.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn claim_returning<C>(
    conn: &mut C,
    schema: &InboxSchema,
    consumer: &str,
    key: &MessageKey,
    layout: Layout,
) -> QueryResult<bool>
where
    C: Connection,
    for<'q> ClaimMarker<'q, C::Backend>: diesel::query_dsl::LoadQuery<'q, C, i64>,
{
    let id = key.stored_id();
    let text = layout.key_text.then(|| crate::driver::key_text(key));
    Ok(
        !ClaimMarker::new(schema, consumer, &id, text.as_deref(), None)
            .load::<i64>(conn)?
            .is_empty(),
    )
}

/// The rows an insert of a marker or a claim wrote: 0 when the row existed. MySQL and
/// MariaDB have no `ON CONFLICT`: their plain insert fails with error 1062 naming the inbox's
/// own index (the statement rolled back, a transaction still open) — a duplicate. Any other
/// error, another index's 1062 included, stays an error.
pub(crate) fn inserted_unless_duplicate(
    inserted: QueryResult<usize>,
    schema: &InboxSchema,
) -> QueryResult<usize> {
    match inserted {
        Err(e) if crate::classify(&e, schema) == inbox_core::ErrorClass::InboxDuplicate => Ok(0),
        other => other,
    }
}

pub(crate) fn push_table<DB: diesel::backend::Backend>(
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

    impl MarkerDialect for Sqlite {
        const KIND: crate::schema::Backend = crate::schema::Backend::Sqlite;
        const NOW: &'static str = "CURRENT_TIMESTAMP";
        const ON_CONFLICT: &'static str = ON_CONFLICT_RETURNING;
        const CLAIM_ON_CONFLICT: &'static str = ON_CONFLICT_DO_NOTHING;
        /// Milliseconds, in a format that compares as text in time order.
        const LEASE_NOW: &'static str = "strftime('%Y-%m-%d %H:%M:%f', 'now')";
        const LEASE_UNTIL: (&'static str, &'static str) = (
            "strftime('%Y-%m-%d %H:%M:%f', 'now', (",
            " / 1000.0) || ' seconds')",
        );
        const BIGINT: &'static str = "BIGINT";

        fn bind_id<'b>(out: &mut AstPass<'_, 'b, Self>, id: &'b Uuid) -> QueryResult<()> {
            out.push_bind_param::<diesel::sql_types::Binary, [u8]>(&id.as_bytes()[..])
        }

        fn bind_int<'b>(out: &mut AstPass<'_, 'b, Self>, value: &'b i64) -> QueryResult<()> {
            out.push_bind_param::<BigInt, i64>(value)
        }
    }

    impl InboxConnection for SqliteConnection {
        shared_steps!(Sqlite);

        /// `BEGIN IMMEDIATE` takes the write lock at once, so two deliveries queue on the busy
        /// timeout instead of both reading and then failing to upgrade to a writer.
        fn begin_inbox_transaction(&mut self, spec: &HandlerSpec, _: bool) -> QueryResult<()> {
            let sql = format!(
                "PRAGMA busy_timeout = {}; BEGIN IMMEDIATE",
                spec.sqlite_busy_timeout_ms
            );
            AnsiTransactionManager::begin_transaction_sql(self, &sql)
        }

        /// `BEGIN IMMEDIATE`: the write lock from the start, so that a transaction that
        /// reads before it writes cannot lose its snapshot to another writer.
        fn begin_write_transaction(&mut self) -> QueryResult<()> {
            AnsiTransactionManager::begin_transaction_sql(self, "BEGIN IMMEDIATE")
        }

        /// Claim statements run in autocommit; a concurrent writer makes them wait up to
        /// the busy timeout too.
        fn prepare_claim(&mut self, spec: &HandlerSpec) -> QueryResult<()> {
            refuse_open_transaction(AnsiTransactionManager::transaction_manager_status_mut(self))?;
            diesel::connection::SimpleConnection::batch_execute(
                self,
                &format!("PRAGMA busy_timeout = {}", spec.sqlite_busy_timeout_ms),
            )
        }

        fn claim_marker(
            &mut self,
            schema: &InboxSchema,
            consumer: &str,
            key: &MessageKey,
            layout: Layout,
        ) -> QueryResult<bool> {
            claim_returning(self, schema, consumer, key, layout)
        }

        fn claim_markers(
            &mut self,
            schema: &InboxSchema,
            consumer: &str,
            ids: &[Uuid],
            texts: Option<&[String]>,
            _layout: Layout,
        ) -> QueryResult<Vec<Uuid>> {
            let inserted: Vec<Vec<u8>> = ClaimMarkers::<Sqlite, diesel::sql_types::Binary>::new(
                schema, consumer, ids, texts,
            )
            .load(self)?;
            Ok(inserted
                .iter()
                .filter_map(|id| Uuid::from_slice(id).ok())
                .collect())
        }
    }
}

#[cfg(feature = "postgres")]
pub(crate) mod postgres {
    use super::*;
    use diesel::connection::SimpleConnection;
    use diesel::pg::{Pg, PgConnection};

    impl sealed::Sealed for PgConnection {}

    impl MarkerDialect for Pg {
        const KIND: crate::schema::Backend = crate::schema::Backend::Postgres;
        const NOW: &'static str = "CURRENT_TIMESTAMP";
        const ON_CONFLICT: &'static str = ON_CONFLICT_RETURNING;
        const CLAIM_ON_CONFLICT: &'static str = ON_CONFLICT_DO_NOTHING;
        const LEASE_NOW: &'static str = "CURRENT_TIMESTAMP";
        const LEASE_UNTIL: (&'static str, &'static str) =
            ("CURRENT_TIMESTAMP + ", " * INTERVAL '1 millisecond'");
        const BIGINT: &'static str = "BIGINT";

        fn bind_id<'b>(out: &mut AstPass<'_, 'b, Self>, id: &'b Uuid) -> QueryResult<()> {
            out.push_bind_param::<diesel::sql_types::Uuid, Uuid>(id)
        }

        fn bind_int<'b>(out: &mut AstPass<'_, 'b, Self>, value: &'b i64) -> QueryResult<()> {
            out.push_bind_param::<BigInt, i64>(value)
        }
    }

    impl InboxConnection for PgConnection {
        shared_steps!(Postgres);

        fn begin_inbox_transaction(&mut self, spec: &HandlerSpec, _: bool) -> QueryResult<()> {
            AnsiTransactionManager::begin_transaction_sql(self, &spec.postgres_begin_sql())
        }

        /// After a failed claim the transaction is aborted, and it is rolled back with its
        /// `SET LOCAL`.
        fn wait_for_locks(&mut self, _spec: &HandlerSpec, claimed: bool) -> QueryResult<()> {
            match claimed {
                true => self.batch_execute(HandlerSpec::POSTGRES_LOCK_WAIT),
                false => Ok(()),
            }
        }

        fn begin_write_transaction(&mut self) -> QueryResult<()> {
            AnsiTransactionManager::begin_transaction_sql(
                self,
                "BEGIN ISOLATION LEVEL READ COMMITTED",
            )
        }

        fn claim_marker(
            &mut self,
            schema: &InboxSchema,
            consumer: &str,
            key: &MessageKey,
            layout: Layout,
        ) -> QueryResult<bool> {
            claim_returning(self, schema, consumer, key, layout)
        }

        fn claim_markers(
            &mut self,
            schema: &InboxSchema,
            consumer: &str,
            ids: &[Uuid],
            texts: Option<&[String]>,
            _layout: Layout,
        ) -> QueryResult<Vec<Uuid>> {
            ClaimMarkers::<Pg, diesel::sql_types::Uuid>::new(schema, consumer, ids, texts)
                .load(self)
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

#[cfg(feature = "mysql")]
pub(crate) mod mysql {
    use diesel::connection::SimpleConnection;
    use diesel::mysql::{Mysql, MysqlConnection};

    use super::*;

    impl sealed::Sealed for MysqlConnection {}

    impl MarkerDialect for Mysql {
        const KIND: crate::schema::Backend = crate::schema::Backend::Mysql;
        const NOW: &'static str = "CURRENT_TIMESTAMP(6)";
        /// None: the plain insert fails with 1062 on a duplicate
        /// ([`inserted_unless_duplicate`]).
        const ON_CONFLICT: &'static str = "";
        const CLAIM_ON_CONFLICT: &'static str = "";
        const LEASE_NOW: &'static str = "CURRENT_TIMESTAMP(6)";
        const LEASE_UNTIL: (&'static str, &'static str) =
            ("CURRENT_TIMESTAMP(6) + INTERVAL (", " * 1000) MICROSECOND");
        const BIGINT: &'static str = "SIGNED";

        fn bind_id<'b>(out: &mut AstPass<'_, 'b, Self>, id: &'b Uuid) -> QueryResult<()> {
            out.push_bind_param::<diesel::sql_types::Binary, [u8]>(&id.as_bytes()[..])
        }

        fn bind_int<'b>(out: &mut AstPass<'_, 'b, Self>, value: &'b i64) -> QueryResult<()> {
            out.push_bind_param::<BigInt, i64>(value)
        }
    }

    impl InboxConnection for MysqlConnection {
        shared_steps!(Mysql);

        fn begin_inbox_transaction(
            &mut self,
            spec: &HandlerSpec,
            mariadb: bool,
        ) -> QueryResult<()> {
            AnsiTransactionManager::begin_transaction_sql(self, &spec.mysql_begin_sql(mariadb))
        }

        /// A prepared statement, cached: one round trip.
        fn end_inbox_transaction(&mut self, spec: &HandlerSpec, mariadb: bool) -> QueryResult<()> {
            if mariadb && spec.idle_in_transaction_ms > 0 {
                diesel::sql_query(HandlerSpec::MARIADB_IDLE_RESTORE).execute(self)?;
            }
            Ok(())
        }

        /// The session's lock wait is put back whether the claim succeeded or not.
        fn wait_for_locks(&mut self, _spec: &HandlerSpec, _claimed: bool) -> QueryResult<()> {
            self.batch_execute(HandlerSpec::MYSQL_LOCK_WAIT)
        }

        fn claim_marker(
            &mut self,
            schema: &InboxSchema,
            consumer: &str,
            key: &MessageKey,
            layout: Layout,
        ) -> QueryResult<bool> {
            let id = key.stored_id();
            let text = layout.key_text.then(|| crate::driver::key_text(key));
            let inserted = ClaimMarker::<Mysql>::new(
                schema,
                consumer,
                &id,
                text.as_deref(),
                layout.session_mark,
            )
            .execute(self);
            Ok(inserted_unless_duplicate(inserted, schema)? > 0)
        }

        /// Row by row: MySQL and MariaDB return no rows from an `INSERT`, and a multi-row
        /// insert stops at the first duplicate. Still one transaction and one commit.
        fn claim_markers(
            &mut self,
            schema: &InboxSchema,
            consumer: &str,
            ids: &[Uuid],
            texts: Option<&[String]>,
            layout: Layout,
        ) -> QueryResult<Vec<Uuid>> {
            let mut inserted = Vec::with_capacity(ids.len());
            for (n, id) in ids.iter().enumerate() {
                let text = texts.map(|texts| texts[n].as_str());
                let result =
                    ClaimMarker::<Mysql>::new(schema, consumer, id, text, layout.session_mark)
                        .execute(self);
                if inserted_unless_duplicate(result, schema)? > 0 {
                    inserted.push(*id);
                }
            }
            Ok(inserted)
        }
    }
}
