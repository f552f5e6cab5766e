//! Sqlite: what the runtime writes differently for it.

use diesel::QueryResult;
use std::borrow::Cow;

use diesel::sqlite::{Sqlite, SqliteConnection};

use super::{InboxConnection, Session, sealed};
use crate::dialect::catalog::Catalogs;
use crate::dialect::layout::DatabaseMark;
use crate::dialect::layout::Layout;
use crate::dialect::{self, Backend, Dialect, marker};
use crate::io::Io;
use crate::spec::HandlerSpec;
use inbox_core::InboxSchema;
#[cfg(feature = "async")]
use {super::AsyncInboxConnection, diesel_async::sync_connection_wrapper::SyncConnectionWrapper};

bind_id_as_bytes!(Sqlite);

impl Dialect for diesel::sqlite::Sqlite {
    fn outbox_insert_sql(table: &str, _notify: bool) -> String {
        format!(
            "INSERT INTO {table} (id, destination, ordering_key, headers, payload) \
             VALUES (?, ?, ?, ?, ?)"
        )
    }

    /// One writer: nothing to skip.
    const SKIP_LOCKED: &'static str = "";
    const UPDATES_FROM_OWN_SUBQUERY: bool = true;
    const SINGLE_WRITER: bool = true;

    const CONFLICTS: dialect::keys::Conflicts = dialect::keys::Conflicts::OnConflict;

    /// The write lock of `BEGIN IMMEDIATE`, already held.
    fn lock_key(_key: &str) -> Option<dialect::Sql> {
        None
    }

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

/// SQLite: the name of the index the inbox's key is checked on, in the database `schema` (an
/// SQL expression): the index named as the inbox's (bound as `?3`), or else the table's
/// primary-key index — the lean table's key (`WITHOUT ROWID`), which SQLite names itself.
/// Every check of the index (its columns, uniqueness, predicate, collations) reads this one.
fn sqlite_key_index(schema: &str) -> String {
    format!(
        "SELECT name FROM pragma_index_list(?2, {schema}) \
         WHERE name = ?3 OR origin = 'pk' ORDER BY name = ?3 DESC LIMIT 1"
    )
}

impl Catalogs for Sqlite {
    fn catalog_sql() -> (String, String) {
        (
            "SELECT name, type AS type_name, CAST(\"notnull\" = 0 AS BIGINT) AS nullable \
             FROM pragma_table_info(?2, COALESCE(NULLIF(?1, ''), 'main')) ORDER BY cid"
                .into(),
            format!(
                "SELECT CAST(l.\"unique\" AS BIGINT) AS is_unique, \
                 COALESCE(i.name, '(expression)') AS name \
                 FROM pragma_index_list(?2, COALESCE(NULLIF(?1, ''), 'main')) AS l, \
                 pragma_index_info(l.name, COALESCE(NULLIF(?1, ''), 'main')) AS i \
                 WHERE l.name = ({}) ORDER BY i.seqno",
                sqlite_key_index("COALESCE(NULLIF(?1, ''), 'main')")
            ),
        )
    }

    fn facts_sql(qualifier: &str, _needs: &[(&str, &str)]) -> String {
        let schema = match qualifier {
            "" => "main",
            qualifier => qualifier,
        };
        // A temporary table of the same name shadows an unqualified one: statements
        // would write the marker there, and it is gone with the connection.
        format!(
            "SELECT 'table' AS kind, '{schema}.' || name AS detail \
             FROM \"{schema}\".sqlite_master WHERE type = 'table' AND name = ?2 COLLATE NOCASE \
             UNION ALL SELECT 'oids', CAST(m.rootpage AS TEXT) || ' ' || d.file \
             FROM \"{schema}\".sqlite_master m, pragma_database_list d \
             WHERE m.type = 'table' AND m.name = ?2 COLLATE NOCASE AND d.name = '{schema}' \
             UNION ALL SELECT 'trigger', name FROM \"{schema}\".sqlite_master \
             WHERE type = 'trigger' AND tbl_name = ?2 COLLATE NOCASE \
             UNION ALL SELECT 'trigger', name FROM temp.sqlite_master \
             WHERE type = 'trigger' AND tbl_name = ?2 COLLATE NOCASE \
             UNION ALL SELECT 'relkind', type FROM \"{schema}\".sqlite_master \
             WHERE name = ?2 COLLATE NOCASE AND type NOT IN ('table', 'index', 'trigger') \
             UNION ALL SELECT 'shadowed', name FROM temp.sqlite_master \
             WHERE ?1 = '' AND '{schema}' <> 'temp' AND type = 'table' \
             AND name = ?2 COLLATE NOCASE \
             UNION ALL SELECT 'index partial', name \
             FROM pragma_index_list(?2, '{schema}') WHERE name = ({index}) AND partial = 1 \
             UNION ALL SELECT 'index collation', coll \
             FROM pragma_index_xinfo(({index}), '{schema}') WHERE key = 1 AND coll <> 'BINARY'",
            index = sqlite_key_index(&format!("'{schema}'"))
        )
    }

    fn accepts(column: &str) -> &'static [&'static str] {
        match column {
            "id" => &["integer"],
            "message_id" | "fingerprint" => &["blob"],
            "consumer" | "key_text" | "result" => &["text"],
            "received_at" | "processed_at" | "claimed_until" => &["timestamp", "datetime", "text"],
            "attempts" => &["integer", "bigint"],
            _ => &[],
        }
    }

    /// The lean design keys the table by the pair: nothing reads `id` there (the purge goes
    /// by the key).
    const ID_OPTIONAL: bool = true;

    /// The table as pinned, in its database.
    fn mark(layout: &mut Layout, schema: &InboxSchema, _claim: bool, oids: Option<&str>) {
        let name = layout.pinned.unwrap_or(schema.table());
        layout.database_mark = oids.and_then(|fact| DatabaseMark::sqlite(fact, name));
    }
}

/// The savepoint that names the handler's transaction.
const OURS: &str = "inbox_transaction";

/// SQLite's answer to `RELEASE` or `ROLLBACK TO` a savepoint that is not there.
fn no_such_savepoint(error: &diesel::result::Error) -> bool {
    crate::classify::with_server_error(error, |server| server.message.contains("no such savepoint"))
        .unwrap_or(false)
}

/// What follows a transaction the body ended: one it opened since rolled back (its
/// failure, where none is open, is the answer), and the manager told none is open.
async fn forget_ended<I: Io>(io: &mut I) {
    let _ = io.batch("ROLLBACK").await;
    if let Err(e) = crate::io::status::ended(io.transaction_status()) {
        tracing::warn!(error = %e, "the transaction manager could not be told");
    }
}

/// The handler's transaction on SQLite, for both IO models.
impl Session for Sqlite {
    /// `BEGIN IMMEDIATE` takes the write lock at once, so two deliveries queue on the busy
    /// timeout instead of both reading and then failing to upgrade to a writer.
    ///
    /// Then a savepoint that names the transaction the handler's ([`OURS`]): a body's own
    /// `ROLLBACK` or `COMMIT` ends that transaction, and what the body writes after it
    /// commits on its own — or, after its own `BEGIN`, with the handler's `COMMIT` and
    /// without the marker. The savepoint is released before `COMMIT`, which fails in any
    /// other transaction, or none.
    fn begin_statement(spec: &'static HandlerSpec, _: Layout) -> Cow<'static, str> {
        format!(
            "PRAGMA busy_timeout = {}; BEGIN IMMEDIATE; SAVEPOINT {OURS}",
            spec.sqlite_busy_timeout_ms
        )
        .into()
    }

    /// The savepoint released ([`OURS`]), then `COMMIT`. A savepoint gone is a transaction
    /// the body ended ([`Error::TransactionEnded`](crate::Error)): what it opened since is
    /// rolled back, and the manager counts none open.
    async fn commit<I: Io<Backend = Self>>(
        io: &mut I,
        _: &'static HandlerSpec,
        _: bool,
    ) -> QueryResult<()> {
        if let Err(e) = io.batch(&format!("RELEASE {OURS}")).await {
            if !no_such_savepoint(&e) {
                return Err(e);
            }
            forget_ended(io).await;
            return Err(diesel::result::Error::QueryBuilderError(Box::new(
                crate::error::Error::TransactionEnded,
            )));
        }
        io.commit_transaction().await
    }

    /// `BEGIN IMMEDIATE`: the write lock from the start, so that a transaction that reads
    /// before it writes cannot lose its snapshot to another writer.
    const BEGIN_WRITE: Option<&'static str> = Some("BEGIN IMMEDIATE");

    /// The busy timeout the handler's statements wait with, set before the check's reads: a
    /// connection's first read of a WAL database waits while another connection holds the
    /// lock it needs, instead of failing at once.
    async fn prepare_check<I: Io<Backend = Self>>(
        io: &mut I,
        spec: &'static HandlerSpec,
    ) -> QueryResult<()> {
        io.batch(&format!(
            "PRAGMA busy_timeout = {}",
            spec.sqlite_busy_timeout_ms
        ))
        .await
    }

    /// Claim statements run in autocommit; a concurrent writer makes them wait up to the
    /// busy timeout too.
    async fn prepare_claim<I: Io<Backend = Self>>(
        io: &mut I,
        spec: &'static HandlerSpec,
    ) -> QueryResult<()> {
        crate::io::refuse_open_transaction(io.transaction_status())?;
        Self::prepare_check(io, spec).await
    }
}

impl InboxConnection for SqliteConnection {}

impl sealed::Connection for SqliteConnection {}

#[cfg(feature = "async")]
impl AsyncInboxConnection for SyncConnectionWrapper<SqliteConnection> {}

#[cfg(feature = "async")]
impl sealed::AsyncConnection for SyncConnectionWrapper<SqliteConnection> {}

/// SQLite runs on a blocking thread: the transaction opened there with diesel's manager.
#[cfg(feature = "async")]
impl crate::io::BeginWithSql for SyncConnectionWrapper<SqliteConnection> {
    async fn begin_sql(&mut self, sql: &str) -> QueryResult<()> {
        let sql = sql.to_owned();
        self.spawn_blocking(move |conn| {
            diesel::connection::AnsiTransactionManager::begin_transaction_sql(conn, &sql)
        })
        .await
    }
}
