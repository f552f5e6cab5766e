//! What differs between database backends: how a transaction begins and commits, and how the
//! marker's id is bound. The SQL of the claim is shared.

use diesel::connection::{AnsiTransactionManager, TransactionManager};
use diesel::{QueryResult, RunQueryDsl};
use inbox_core::{InboxSchema, MessageKey};
use uuid::Uuid;

use crate::__private::HandlerSpec;
use crate::dialect::layout::Layout;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::dialect::marker::ClaimMarkers;
use crate::dialect::marker::{ClaimMarker, claim_returning, inserted_unless_duplicate};

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

#[cfg(feature = "sqlite")]
pub(crate) mod sqlite {
    use super::*;
    use diesel::sqlite::{Sqlite, SqliteConnection};

    impl sealed::Sealed for SqliteConnection {}

    impl InboxConnection for SqliteConnection {
        const BACKEND: crate::schema::Backend = crate::schema::Backend::Sqlite;

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

    impl InboxConnection for PgConnection {
        const BACKEND: crate::schema::Backend = crate::schema::Backend::Postgres;

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

    impl InboxConnection for MysqlConnection {
        const BACKEND: crate::schema::Backend = crate::schema::Backend::Mysql;

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
            let text = layout
                .key_text
                .then(|| crate::dialect::layout::key_text(key));
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
