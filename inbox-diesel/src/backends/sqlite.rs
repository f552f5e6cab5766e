//! Sqlite: what the runtime writes differently for it.

use diesel::query_builder::AstPass;

use diesel::QueryResult;

use uuid::Uuid;

use crate::dialect::{self, Backend, Dialect, marker};

impl dialect::BindId for diesel::sqlite::Sqlite {
    fn bind_id<'b>(out: &mut AstPass<'_, 'b, Self>, id: &'b Uuid) -> QueryResult<()> {
        out.push_bind_param::<diesel::sql_types::Binary, [u8]>(&id.as_bytes()[..])
    }
}

impl Dialect for diesel::sqlite::Sqlite {
    const NOW: &'static str = "CURRENT_TIMESTAMP";
    const ON_CONFLICT: &'static str = marker::ON_CONFLICT_RETURNING;
    const CLAIM_ON_CONFLICT: &'static str = marker::ON_CONFLICT_DO_NOTHING;
    /// Milliseconds, in a format that compares as text in time order.
    const LEASE_NOW: &'static str = "strftime('%Y-%m-%d %H:%M:%f', 'now')";
    const LEASE_UNTIL: (&'static str, &'static str) = (
        "strftime('%Y-%m-%d %H:%M:%f', 'now', (",
        " / 1000.0) || ' seconds')",
    );
    const LEASE_LEFT_MS: &'static str =
        "(julianday(claimed_until) - julianday('now')) * 86400000.0";
    const BIGINT: &'static str = "BIGINT";
    /// SQLite refuses a `BEGIN` inside a transaction; outside one, this one ends at once,
    /// having touched nothing.
    const OPEN_TRANSACTION_PROBE: Option<&'static str> = Some("BEGIN DEFERRED; COMMIT");

    const BACKEND: Backend = Backend::Sqlite;

    fn delete_batch(table: &str) -> String {
        format!(
            "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} \
             WHERE processed_at < datetime('now', '-' || ? || ' seconds') \
             ORDER BY processed_at LIMIT ?)"
        )
    }

    fn has_id(_table: &str) -> Option<String> {
        Some(
            "SELECT count(*) AS n FROM pragma_table_info(?2, COALESCE(NULLIF(?1, ''), 'main')) \
             WHERE name = 'id'"
                .into(),
        )
    }

    /// One pass over the table's b-tree per purge run: each batch reads on from the last key
    /// the previous one deleted, skipping the rows that are not due, until it has `LIMIT`
    /// due ones (or the table ends) — no index on `processed_at` needed, and no key kept in
    /// memory but the cursor.
    fn delete_batch_by_key(table: &str) -> Option<String> {
        Some(format!(
            "DELETE FROM {table} WHERE (message_id, consumer) IN \
             (SELECT message_id, consumer FROM {table} WHERE (message_id, consumer) > (?, ?) \
             AND processed_at < datetime('now', '-' || ? || ' seconds') \
             ORDER BY message_id, consumer LIMIT ?) RETURNING message_id, consumer"
        ))
    }

    fn count_stale(table: &str) -> String {
        format!(
            "SELECT count(*) AS n FROM {table} WHERE processed_at IS NULL \
             AND received_at < datetime('now', '-' || ? || ' seconds')"
        )
    }

    fn list_stale(table: &str) -> String {
        format!(
            "SELECT message_id, consumer, attempts FROM {table} WHERE processed_at IS NULL \
             AND received_at < datetime('now', '-' || ? || ' seconds') \
             ORDER BY received_at, message_id LIMIT ?"
        )
    }

    /// SQLite has one writer at a time already.
    fn try_lock(_: &str) -> Option<String> {
        None
    }

    fn unlock(_: &str) -> Option<String> {
        None
    }
}

/// The sync connection.
mod sync {
    use diesel::connection::{AnsiTransactionManager, TransactionManager};
    use diesel::{QueryResult, RunQueryDsl};
    use inbox_core::{InboxSchema, MessageKey};
    use uuid::Uuid;

    use crate::backends::{InboxConnection, refuse_open_transaction, sealed};
    use crate::dialect::layout::Layout;
    use crate::dialect::marker::ClaimMarkers;
    use crate::dialect::marker::claim_returning;
    use crate::spec::HandlerSpec;

    use diesel::sqlite::{Sqlite, SqliteConnection};

    /// The savepoint that names the handler's transaction.
    const OURS: &str = "inbox_transaction";

    /// SQLite's answer to `RELEASE` or `ROLLBACK TO` a savepoint that is not there.
    fn no_such_savepoint(error: &diesel::result::Error) -> bool {
        crate::classify::with_server_error(error, |server| {
            server.message.contains("no such savepoint")
        })
        .unwrap_or(false)
    }

    /// What follows a transaction the body ended: one it opened since rolled back (its
    /// failure, where none is open, is the answer), and the manager told none is open.
    fn forget_ended(conn: &mut SqliteConnection) {
        let _ = diesel::connection::SimpleConnection::batch_execute(conn, "ROLLBACK");
        let status = AnsiTransactionManager::transaction_manager_status_mut(conn);
        if let Err(e) = crate::backends::ended(status) {
            tracing::warn!(error = %e, "the transaction manager could not be told");
        }
    }

    impl InboxConnection for SqliteConnection {}

    impl sealed::Connection for SqliteConnection {
        /// `BEGIN IMMEDIATE` takes the write lock at once, so two deliveries queue on the busy
        /// timeout instead of both reading and then failing to upgrade to a writer.
        ///
        /// Then a savepoint that names the transaction the handler's
        /// ([`OURS`]): a body's own `ROLLBACK` or `COMMIT` ends that transaction, and what the
        /// body writes after it commits on its own — or, after its own `BEGIN`, with the
        /// handler's `COMMIT` and without the marker. The savepoint is released before
        /// `COMMIT`, which fails in any other transaction, or none.
        fn begin_inbox_transaction(&mut self, spec: &HandlerSpec, _: Layout) -> QueryResult<()> {
            let sql = format!(
                "PRAGMA busy_timeout = {}; BEGIN IMMEDIATE; SAVEPOINT {OURS}",
                spec.sqlite_busy_timeout_ms
            );
            AnsiTransactionManager::begin_transaction_sql(self, &sql)
        }

        /// The savepoint released ([`OURS`]), then `COMMIT`. A savepoint gone is a
        /// transaction the body ended ([`Error::TransactionEnded`](crate::Error)): what it
        /// opened since is rolled back, and the manager counts none open.
        fn commit_inbox_transaction(&mut self, _: &HandlerSpec, _: bool) -> QueryResult<()> {
            if let Err(e) = diesel::connection::SimpleConnection::batch_execute(
                self,
                &format!("RELEASE {OURS}"),
            ) {
                if !no_such_savepoint(&e) {
                    return Err(e);
                }
                forget_ended(self);
                return Err(diesel::result::Error::QueryBuilderError(Box::new(
                    crate::error::Error::TransactionEnded,
                )));
            }
            AnsiTransactionManager::commit_transaction(self)
        }

        /// `BEGIN IMMEDIATE`: the write lock from the start, so that a transaction that
        /// reads before it writes cannot lose its snapshot to another writer.
        fn begin_write_transaction(&mut self) -> QueryResult<()> {
            AnsiTransactionManager::begin_transaction_sql(self, "BEGIN IMMEDIATE")
        }

        /// The busy timeout the handler's statements wait with, set before the check's
        /// reads: a connection's first read of a WAL database waits while another
        /// connection holds the lock it needs, instead of failing at once.
        fn prepare_check(&mut self, spec: &HandlerSpec) -> QueryResult<()> {
            diesel::connection::SimpleConnection::batch_execute(
                self,
                &format!("PRAGMA busy_timeout = {}", spec.sqlite_busy_timeout_ms),
            )
        }

        /// Claim statements run in autocommit; a concurrent writer makes them wait up to
        /// the busy timeout too.
        fn prepare_claim(&mut self, spec: &HandlerSpec) -> QueryResult<()> {
            refuse_open_transaction(AnsiTransactionManager::transaction_manager_status_mut(self))?;
            self.prepare_check(spec)
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
            layout: Layout,
        ) -> QueryResult<Vec<Uuid>> {
            let inserted: Vec<Vec<u8>> = ClaimMarkers::<Sqlite, diesel::sql_types::Binary>::new(
                schema,
                consumer,
                ids,
                texts,
                layout.mark(),
            )
            .load(self)?;
            Ok(inserted
                .iter()
                .filter_map(|id| Uuid::from_slice(id).ok())
                .collect())
        }
    }
}

/// The diesel-async connection.
#[cfg(feature = "async")]
mod asynchronous {
    use diesel::QueryResult;
    use inbox_core::MessageKey;

    use crate::backends::{AsyncInboxConnection, sealed};
    use crate::dialect::layout::Layout;
    use crate::spec::HandlerSpec;

    use diesel::SqliteConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

    use crate::backends::sealed::Connection as _;

    impl AsyncInboxConnection for SyncConnectionWrapper<SqliteConnection> {}

    /// SQLite runs on a blocking thread: each step is the sync runtime's own, sent there.
    impl sealed::AsyncConnection for SyncConnectionWrapper<SqliteConnection> {
        async fn begin_inbox_transaction(
            &mut self,
            spec: &'static HandlerSpec,
            layout: Layout,
        ) -> QueryResult<()> {
            self.spawn_blocking(move |conn| conn.begin_inbox_transaction(spec, layout))
                .await
        }

        async fn begin_write_transaction(&mut self) -> QueryResult<()> {
            self.spawn_blocking(move |conn| conn.begin_write_transaction())
                .await
        }

        async fn claim_marker(
            &mut self,
            spec: &'static HandlerSpec,
            key: &MessageKey,
            layout: Layout,
        ) -> QueryResult<bool> {
            let key = key.clone();
            self.spawn_blocking(move |conn| {
                conn.claim_marker(&spec.schema, spec.consumer.as_str(), &key, layout)
            })
            .await
        }

        async fn claim_markers(
            &mut self,
            spec: &'static HandlerSpec,
            ids: &[uuid::Uuid],
            texts: Option<&[String]>,
            layout: Layout,
        ) -> QueryResult<Vec<uuid::Uuid>> {
            let ids = ids.to_vec();
            let texts = texts.map(<[String]>::to_vec);
            self.spawn_blocking(move |conn| {
                conn.claim_markers(
                    &spec.schema,
                    spec.consumer.as_str(),
                    &ids,
                    texts.as_deref(),
                    layout,
                )
            })
            .await
        }

        async fn commit_inbox_transaction(
            &mut self,
            spec: &'static HandlerSpec,
            mariadb: bool,
        ) -> QueryResult<()> {
            self.spawn_blocking(move |conn| conn.commit_inbox_transaction(spec, mariadb))
                .await
        }

        async fn roll_back_inbox_transaction(&mut self) -> QueryResult<()> {
            self.spawn_blocking(|conn| conn.roll_back_inbox_transaction())
                .await
        }

        async fn prepare_check(&mut self, spec: &'static HandlerSpec) -> QueryResult<()> {
            self.spawn_blocking(move |conn| conn.prepare_check(spec))
                .await
        }

        async fn prepare_claim(&mut self, spec: &'static HandlerSpec) -> QueryResult<()> {
            self.spawn_blocking(move |conn| conn.prepare_claim(spec))
                .await
        }
    }
}
