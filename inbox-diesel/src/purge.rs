//! Removing completed markers once their messages can no longer arrive.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use std::time::Duration;
//! use diesel::connection::SimpleConnection;
//! use diesel::prelude::*;
//! use inbox_diesel::purge::{Purge, purge};
//! use inbox_diesel::{InboxSchema, Retention, schema};
//!
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! conn.batch_execute(&schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))?;
//!
//! // SQS: 30 s visibility timeout, 5 receives, 4 days retention, a week for replays.
//! let retention = Retention::redeliveries(Duration::from_secs(30), 5)
//!     .message_ttl(Duration::from_secs(4 * 86_400))
//!     .replay_margin(Duration::from_secs(7 * 86_400));
//! let report = purge(&mut conn, &InboxSchema::DEFAULT, &Purge::after(retention))?;
//! assert_eq!(report.removed, 0);
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Run it on a schedule (a cron job, a periodic task in one of the instances) on a connection
//! of its own, outside any transaction; with the feature `async`, `purge_async` does the same
//! on a diesel-async connection. Each batch is one short `DELETE` in a transaction of
//! its own, oldest rows first through the index on `processed_at`, so a purge never holds a
//! lock on more than one batch of rows and never takes a table lock; consumers keep inserting
//! markers while it runs. On PostgreSQL and MySQL/MariaDB only one purge runs at a time:
//! another one returns at once with [`PurgeReport::ran`] false (or, if it had begun, stops
//! after its batch). On PostgreSQL each batch takes the lock in its own statement
//! (`pg_try_advisory_xact_lock`), so a purge dropped by a timeout leaves no lock on its
//! pooled connection. MySQL and MariaDB have no such lock: `GET_LOCK` belongs to the session,
//! and a purge dropped before its release leaves it there until that connection runs a purge
//! again (which takes the lock over and releases it) or closes — drop the connection of a
//! purge that was cancelled. Rows without `processed_at` — claims still open, or abandoned —
//! are never removed; the old ones are counted in [`PurgeReport::stale_claims`] and listed
//! by [`stale_claims`], for reconciliation.

use std::time::Duration;

use diesel::QueryResult;
use diesel::connection::{AnsiTransactionManager, TransactionManager};
use diesel::sql_types::BigInt;
use inbox_core::{InboxSchema, Retention};

use crate::InboxConnection;

/// What to purge, and in what steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Purge {
    older_than: Duration,
    batch_size: u32,
    pause: Duration,
}

impl Purge {
    /// The longest age a purge counts in: 100 years.
    pub const MAX_AGE: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60 + 25 * 86_400);

    /// The default batch: small enough for a short transaction, large enough to keep up.
    pub const DEFAULT_BATCH_SIZE: u32 = 1_000;

    /// Removes rows completed longer than `retention.keep_for()` ago.
    pub fn after(retention: Retention) -> Self {
        Self::older_than(retention.keep_for())
    }

    /// Removes rows completed longer than `age` ago. The age is counted in whole seconds,
    /// rounded up (900 ms keeps rows for a second), up to [`Purge::MAX_AGE`].
    pub fn older_than(age: Duration) -> Self {
        Self {
            older_than: age,
            batch_size: Self::DEFAULT_BATCH_SIZE,
            pause: Duration::ZERO,
        }
    }

    /// Rows per `DELETE` (at least 1).
    pub fn batch_size(self, rows: u32) -> Self {
        Self {
            batch_size: rows.max(1),
            ..self
        }
    }

    /// A pause between batches, to leave the server's I/O to the consumers.
    pub fn pause_between_batches(self, pause: Duration) -> Self {
        Self { pause, ..self }
    }

    /// The age in whole seconds, rounded up — a retention is never shortened — and at most
    /// [`Purge::MAX_AGE`], past which no row can be (an age beyond it purges nothing older
    /// than that instead of overflowing the servers' timestamp arithmetic).
    fn age_seconds(&self) -> i64 {
        let seconds = self
            .older_than
            .as_secs()
            .saturating_add(u64::from(self.older_than.subsec_nanos() > 0));
        i64::try_from(seconds.min(Self::MAX_AGE.as_secs())).expect("MAX_AGE fits in i64")
    }
}

/// What a purge did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// `false` when another purge of the same table was running: this one did nothing.
    pub ran: bool,
    /// Completed rows removed.
    pub removed: u64,
    /// `DELETE` statements run, each in its own transaction.
    pub batches: u32,
    /// Rows without `processed_at` (open claims) received before the cutoff: left in place,
    /// counted so that they can be reconciled.
    pub stale_claims: u64,
    /// MySQL and MariaDB, when `ran` is false: the session holding the purge lock is idle, and
    /// has been for this long — a purge pausing between batches, or a connection that kept the
    /// lock of a purge dropped before its release. `None` while the holder runs a statement.
    /// Longer than the pause between batches, and growing across runs, it means the lock is
    /// stuck: close that connection.
    pub lock_holder_idle_for: Option<Duration>,
}

impl PurgeReport {
    /// The one event a purge leaves, in its span.
    fn log(&self) {
        tracing::info!(
            ran = self.ran,
            removed = self.removed,
            batches = self.batches,
            stale_claims = self.stale_claims,
            "purged"
        );
    }
}

/// A claim-mode row older than the cutoff that was never stamped complete: its attempt
/// crashed, hung past its lease, or failed and was never retried. Whether its side effect
/// happened is for the downstream system to say; look it up there by the message key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleClaim {
    /// The stored id of the message key: compare with
    /// [`MessageKey::stored_id`](crate::MessageKey::stored_id).
    pub message_id: uuid::Uuid,
    /// The consumer that claimed it.
    pub consumer: String,
    /// How many deliveries claimed it.
    pub attempts: u32,
}

#[derive(diesel::QueryableByName)]
struct StaleRow {
    #[diesel(sql_type = diesel::sql_types::Binary)]
    message_id: Vec<u8>,
    #[diesel(sql_type = diesel::sql_types::Text)]
    consumer: String,
    #[diesel(sql_type = BigInt)]
    attempts: i64,
}

impl From<StaleRow> for StaleClaim {
    fn from(row: StaleRow) -> Self {
        StaleClaim {
            message_id: uuid::Uuid::from_slice(&row.message_id).unwrap_or_default(),
            consumer: row.consumer,
            attempts: u32::try_from(row.attempts).unwrap_or(u32::MAX),
        }
    }
}

/// The SQL a backend purges with. Binds: the age in seconds, then (for the delete and the
/// list) the number of rows.
trait PurgeDialect {
    /// The backend, whose quoting the table's name is written with.
    const BACKEND: crate::schema::Backend;
    fn delete_batch(table: &str) -> String;
    fn count_stale(table: &str) -> String;
    /// Rows as [`StaleRow`], oldest first.
    fn list_stale(table: &str) -> String;
    /// A query returning `n` = 1 when this session got the purge lock of `table`, held until
    /// [`PurgeDialect::unlock`]; `None` where there is no session lock.
    fn try_lock(table: &str) -> Option<String>;
    fn unlock(table: &str) -> Option<String>;
    /// A query of `n`, the seconds the session holding the purge lock has been idle, binding
    /// the lock's name; no row when it is running a statement. `None` where there is no
    /// session lock.
    fn lock_holder_idle(_table: &str) -> Option<String> {
        None
    }
    /// Where each batch takes the lock itself, for the length of its own statement: a
    /// `SELECT` of `locked` (1 or 0) and `n` (rows removed) binding the age, the batch size
    /// and the lock's name, which replaces `delete_batch` and the session lock.
    fn locked_delete_batch(_table: &str) -> Option<String> {
        None
    }
}

#[derive(diesel::QueryableByName)]
struct LockedDelete {
    #[diesel(sql_type = BigInt)]
    locked: i64,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(diesel::QueryableByName)]
struct N {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Purges `schema`'s table on `conn`; see the [module documentation](self).
///
/// # Errors
/// A database error, or diesel's `AlreadyInTransaction` when `conn` is inside a transaction
/// (the batches would then form one long transaction).
pub fn purge<C: PurgeConnection>(
    conn: &mut C,
    schema: &InboxSchema,
    purge: &Purge,
) -> QueryResult<PurgeReport> {
    let span = tracing::info_span!("inbox.purge", table = schema.table());
    let _entered = span.enter();
    let report = conn.purge_inbox(schema, purge)?;
    report.log();
    Ok(report)
}

/// Lists up to `limit` claims of `schema`'s table received longer than `older_than` ago and
/// never stamped complete, oldest first: the rows [`PurgeReport::stale_claims`] counts.
///
/// A claim is stale when its attempt died around its side effect and no redelivery came to
/// take it over (or `on_expired = "report"` told redeliveries not to). Reconcile each with
/// the downstream system: if the side effect happened, stamp the row
/// (`UPDATE inbox SET processed_at = now(), claimed_until = NULL WHERE message_id = … AND
/// consumer = …`); if not, redeliver the message after releasing the row
/// (`… SET claimed_until = NULL …`), which a delivery then takes over.
pub fn stale_claims<C: PurgeConnection>(
    conn: &mut C,
    schema: &InboxSchema,
    older_than: Duration,
    limit: u32,
) -> QueryResult<Vec<StaleClaim>> {
    conn.list_stale_claims(schema, older_than, limit)
}

/// A connection [`purge`] runs on: `SqliteConnection`, `PgConnection`, `MysqlConnection`.
pub trait PurgeConnection: InboxConnection {
    /// The purge itself.
    #[doc(hidden)]
    fn purge_inbox(&mut self, schema: &InboxSchema, purge: &Purge) -> QueryResult<PurgeReport>;

    /// The list of [`stale_claims`].
    #[doc(hidden)]
    fn list_stale_claims(
        &mut self,
        schema: &InboxSchema,
        older_than: Duration,
        limit: u32,
    ) -> QueryResult<Vec<StaleClaim>>;
}

/// The statement of [`stale_claims`], for both IO models.
macro_rules! list_stale {
    ($conn:ident, $schema:ident, $older_than:ident, $limit:ident, $backend:ty,
     [$($await:tt)*]) => {{
        let age = Purge::older_than($older_than).age_seconds();
        let table = <$backend>::BACKEND.quote_table($schema.table());
        let rows: Vec<StaleRow> = diesel::sql_query(<$backend>::list_stale(&table))
            .bind::<BigInt, _>(age)
            .bind::<BigInt, _>(i64::from($limit))
            .load($conn)$($await)*?;
        Ok(rows.into_iter().map(StaleClaim::from).collect())
    }};
}

/// The purge's statements, written once for both IO models and stamped out per connection
/// (diesel's bounds for a query generic over the backend would be longer than the code).
/// `[$($await)*]` is `[.await]` or `[]`; `$sleep` pauses between batches.
macro_rules! purge_steps {
    ($io:ident, $conn:ident, $schema:ident, $purge:ident, $backend:ty, $tm:ty,
     [$($await:tt)*], $sleep:path) => {{
        use diesel::sql_types::Text;

        crate::backend::refuse_open_transaction(<$tm>::transaction_manager_status_mut($conn))?;
        let lock_name = format!("inbox purge {}", $schema.table());
        let table = &<$backend>::BACKEND.quote_table($schema.table());
        if let Some(sql) = <$backend>::try_lock(table) {
            let locked = diesel::sql_query(sql)
                .bind::<Text, _>(&lock_name)
                .bind::<Text, _>(&lock_name)
                .get_result::<N>($conn)$($await)*?;
            if locked.n != 1 {
                let mut report = PurgeReport::default();
                if let Some(sql) = <$backend>::lock_holder_idle(table) {
                    let idle: Vec<N> = diesel::sql_query(sql)
                        .bind::<Text, _>(&lock_name)
                        .load($conn)$($await)*?;
                    report.lock_holder_idle_for = idle
                        .into_iter()
                        .next()
                        .map(|idle| Duration::from_secs(idle.n.max(0) as u64));
                }
                return Ok(report);
            }
        }
        let result = purge_steps!(@$io {
            let mut report = PurgeReport {
                ran: true,
                ..PurgeReport::default()
            };
            let delete = <$backend>::delete_batch(table);
            let locked_delete = <$backend>::locked_delete_batch(table);
            loop {
                let removed = match &locked_delete {
                    None => diesel::sql_query(&delete)
                        .bind::<BigInt, _>($purge.age_seconds())
                        .bind::<BigInt, _>(i64::from($purge.batch_size))
                        .execute($conn)$($await)*?,
                    Some(sql) => {
                        let batch = diesel::sql_query(sql)
                            .bind::<BigInt, _>($purge.age_seconds())
                            .bind::<BigInt, _>(i64::from($purge.batch_size))
                            .bind::<Text, _>(&lock_name)
                            .get_result::<LockedDelete>($conn)$($await)*?;
                        if batch.locked != 1 {
                            // Another purge holds the lock: the first batch leaves the table
                            // to it; a later one stops with what was done.
                            if report.batches == 0 {
                                return Ok(PurgeReport::default());
                            }
                            break;
                        }
                        batch.n as usize
                    }
                };
                report.batches += 1;
                report.removed += removed as u64;
                if removed < $purge.batch_size as usize {
                    break;
                }
                if !$purge.pause.is_zero() {
                    $sleep($purge.pause)$($await)*;
                }
            }
            report.stale_claims = diesel::sql_query(<$backend>::count_stale(table))
                .bind::<BigInt, _>($purge.age_seconds())
                .get_result::<N>($conn)$($await)*?
                .n as u64;
            Ok::<_, diesel::result::Error>(report)
        });
        if let Some(sql) = <$backend>::unlock(table) {
            // The lock is the session's: if releasing fails, it goes with the connection.
            if let Err(e) = diesel::sql_query(sql)
                .bind::<Text, _>(&lock_name)
                .get_result::<N>($conn)$($await)*
            {
                tracing::warn!(error = %e, "releasing the purge lock failed");
            }
        }
        result
    }};
    // The batches run in a block of their own, so that the lock is released after an error.
    (@sync { $($body:tt)* }) => {
        (|| { $($body)* })()
    };
    (@async { $($body:tt)* }) => {
        async { $($body)* }.await
    };
}

macro_rules! purge_connection {
    ($conn:ty, $backend:ty) => {
        impl PurgeConnection for $conn {
            fn purge_inbox(
                &mut self,
                schema: &InboxSchema,
                purge: &Purge,
            ) -> QueryResult<PurgeReport> {
                use diesel::RunQueryDsl;
                let conn = self;
                purge_steps!(
                    sync,
                    conn,
                    schema,
                    purge,
                    $backend,
                    AnsiTransactionManager,
                    [],
                    std::thread::sleep
                )
            }

            fn list_stale_claims(
                &mut self,
                schema: &InboxSchema,
                older_than: Duration,
                limit: u32,
            ) -> QueryResult<Vec<StaleClaim>> {
                use diesel::RunQueryDsl;
                let conn = self;
                list_stale!(conn, schema, older_than, limit, $backend, [])
            }
        }
    };
}

#[cfg(feature = "sqlite")]
purge_connection!(diesel::SqliteConnection, diesel::sqlite::Sqlite);
#[cfg(feature = "postgres")]
purge_connection!(diesel::PgConnection, diesel::pg::Pg);
#[cfg(feature = "mysql")]
purge_connection!(diesel::MysqlConnection, diesel::mysql::Mysql);

#[cfg(feature = "postgres")]
impl PurgeDialect for diesel::pg::Pg {
    const BACKEND: crate::schema::Backend = crate::schema::Backend::Postgres;
    /// `= ANY(ARRAY(…))` rather than `IN (…)`: the planner then takes the batch's ids from the
    /// `processed_at` index first instead of joining against the whole table.
    fn delete_batch(table: &str) -> String {
        format!(
            "DELETE FROM {table} WHERE id = ANY(ARRAY(SELECT id FROM {table} \
             WHERE processed_at < now() - ($1::bigint * interval '1 second') \
             ORDER BY processed_at LIMIT $2))"
        )
    }

    fn count_stale(table: &str) -> String {
        format!(
            "SELECT count(*) AS n FROM {table} WHERE processed_at IS NULL \
             AND received_at < now() - ($1::bigint * interval '1 second')"
        )
    }

    /// `uuid_send`: the id as its 16 bytes, as the other backends store it.
    fn list_stale(table: &str) -> String {
        format!(
            "SELECT uuid_send(message_id) AS message_id, consumer, attempts::int8 AS attempts \
             FROM {table} WHERE processed_at IS NULL \
             AND received_at < now() - ($1::bigint * interval '1 second') ORDER BY id LIMIT $2"
        )
    }

    /// The lock is a transaction-scoped advisory lock, taken by each batch's own statement
    /// (a transaction of its own): a purge dropped by a timeout between batches leaves no lock
    /// behind on its pooled connection, and one dropped during a batch leaves it only until
    /// that statement ends on the server.
    fn try_lock(_: &str) -> Option<String> {
        None
    }

    fn unlock(_: &str) -> Option<String> {
        None
    }

    fn locked_delete_batch(table: &str) -> Option<String> {
        Some(format!(
            "WITH lock AS (SELECT pg_try_advisory_xact_lock(hashtext($3)) AS ok), \
             deleted AS (DELETE FROM {table} WHERE (SELECT ok FROM lock) \
             AND id = ANY(ARRAY(SELECT id FROM {table} \
             WHERE processed_at < now() - ($1::bigint * interval '1 second') \
             ORDER BY processed_at LIMIT $2)) RETURNING 1) \
             SELECT CASE WHEN (SELECT ok FROM lock) THEN 1 ELSE 0 END::int8 AS locked, \
             (SELECT count(*) FROM deleted)::int8 AS n"
        ))
    }
}

#[cfg(feature = "mysql")]
impl PurgeDialect for diesel::mysql::Mysql {
    const BACKEND: crate::schema::Backend = crate::schema::Backend::Mysql;
    fn delete_batch(table: &str) -> String {
        format!(
            "DELETE FROM {table} WHERE processed_at < NOW(6) - INTERVAL ? SECOND \
             ORDER BY processed_at LIMIT ?"
        )
    }

    fn count_stale(table: &str) -> String {
        format!(
            "SELECT count(*) AS n FROM {table} WHERE processed_at IS NULL \
             AND received_at < NOW(6) - INTERVAL ? SECOND"
        )
    }

    fn list_stale(table: &str) -> String {
        format!(
            "SELECT message_id, consumer, CAST(attempts AS SIGNED) AS attempts FROM {table} \
             WHERE processed_at IS NULL AND received_at < NOW(6) - INTERVAL ? SECOND \
             ORDER BY id LIMIT ?"
        )
    }

    /// `GET_LOCK` names are server-wide: the database goes into the name, so that purges of
    /// different databases do not exclude each other (PostgreSQL's advisory locks are per
    /// database already). The lock is the session's; one this session still holds — left by a
    /// purge dropped before its release — is released first, so that it is held once, not
    /// once more per purge.
    fn try_lock(_: &str) -> Option<String> {
        Some(
            "SELECT CAST(COALESCE(CASE WHEN IS_USED_LOCK(CONCAT(DATABASE(), ' ', ?)) = \
             CONNECTION_ID() THEN 1 ELSE GET_LOCK(CONCAT(DATABASE(), ' ', ?), 0) END, 0) \
             AS SIGNED) AS n"
                .into(),
        )
    }

    fn unlock(_: &str) -> Option<String> {
        Some(
            "SELECT CAST(COALESCE(RELEASE_LOCK(CONCAT(DATABASE(), ' ', ?)), 0) AS SIGNED) AS n"
                .into(),
        )
    }

    fn lock_holder_idle(_: &str) -> Option<String> {
        Some(
            "SELECT CAST(TIME AS SIGNED) AS n FROM information_schema.PROCESSLIST \
             WHERE ID = IS_USED_LOCK(CONCAT(DATABASE(), ' ', ?)) AND COMMAND = 'Sleep'"
                .into(),
        )
    }
}

#[cfg(feature = "sqlite")]
impl PurgeDialect for diesel::sqlite::Sqlite {
    const BACKEND: crate::schema::Backend = crate::schema::Backend::Sqlite;
    fn delete_batch(table: &str) -> String {
        format!(
            "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} \
             WHERE processed_at < datetime('now', '-' || ? || ' seconds') \
             ORDER BY processed_at LIMIT ?)"
        )
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
             AND received_at < datetime('now', '-' || ? || ' seconds') ORDER BY id LIMIT ?"
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

#[cfg(feature = "async")]
pub use asynchronous::{AsyncPurgeConnection, purge_async, stale_claims_async};

#[cfg(feature = "async")]
mod asynchronous {
    use std::future::Future;

    use tracing::Instrument;

    use super::*;
    use crate::AsyncInboxConnection;

    /// [`purge`] on a diesel-async connection: the same batches, awaited.
    ///
    /// # Errors
    /// As [`purge`].
    pub async fn purge_async<C: AsyncPurgeConnection>(
        conn: &mut C,
        schema: &InboxSchema,
        purge: &Purge,
    ) -> QueryResult<PurgeReport> {
        let span = tracing::info_span!("inbox.purge", table = schema.table());
        let report = conn
            .purge_inbox(schema, purge)
            .instrument(span.clone())
            .await?;
        span.in_scope(|| report.log());
        Ok(report)
    }

    /// [`stale_claims`] on a diesel-async connection.
    ///
    /// # Errors
    /// A database error.
    pub async fn stale_claims_async<C: AsyncPurgeConnection>(
        conn: &mut C,
        schema: &InboxSchema,
        older_than: Duration,
        limit: u32,
    ) -> QueryResult<Vec<StaleClaim>> {
        conn.list_stale_claims(schema, older_than, limit).await
    }

    /// A connection [`purge_async`] runs on: `AsyncPgConnection`, `AsyncMysqlConnection`,
    /// `SyncConnectionWrapper<SqliteConnection>`.
    pub trait AsyncPurgeConnection: AsyncInboxConnection {
        /// The purge itself.
        #[doc(hidden)]
        fn purge_inbox(
            &mut self,
            schema: &InboxSchema,
            purge: &Purge,
        ) -> impl Future<Output = QueryResult<PurgeReport>> + Send;

        /// The list of [`stale_claims_async`].
        #[doc(hidden)]
        fn list_stale_claims(
            &mut self,
            schema: &InboxSchema,
            older_than: Duration,
            limit: u32,
        ) -> impl Future<Output = QueryResult<Vec<StaleClaim>>> + Send;
    }

    #[allow(unused_macros)]
    macro_rules! async_purge_connection {
        ($conn:ty, $backend:ty) => {
            impl AsyncPurgeConnection for $conn {
                async fn purge_inbox(
                    &mut self,
                    schema: &InboxSchema,
                    purge: &Purge,
                ) -> QueryResult<PurgeReport> {
                    use diesel_async::{RunQueryDsl, TransactionManager};
                    let conn = self;
                    purge_steps!(
                        async,
                        conn,
                        schema,
                        purge,
                        $backend,
                        diesel_async::AnsiTransactionManager,
                        [.await],
                        tokio::time::sleep
                    )
                }

                async fn list_stale_claims(
                    &mut self,
                    schema: &InboxSchema,
                    older_than: Duration,
                    limit: u32,
                ) -> QueryResult<Vec<StaleClaim>> {
                    use diesel_async::RunQueryDsl;
                    let conn = self;
                    list_stale!(conn, schema, older_than, limit, $backend, [.await])
                }
            }
        };
    }

    #[cfg(feature = "postgres")]
    async_purge_connection!(diesel_async::AsyncPgConnection, diesel::pg::Pg);
    #[cfg(feature = "mysql")]
    async_purge_connection!(diesel_async::AsyncMysqlConnection, diesel::mysql::Mysql);

    /// SQLite purges on diesel-async's blocking thread, with the sync purge.
    #[cfg(feature = "sqlite")]
    impl AsyncPurgeConnection
        for diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>
    {
        async fn purge_inbox(
            &mut self,
            schema: &InboxSchema,
            purge: &Purge,
        ) -> QueryResult<PurgeReport> {
            let (schema, purge) = (*schema, *purge);
            self.spawn_blocking(move |conn| PurgeConnection::purge_inbox(conn, &schema, &purge))
                .await
        }

        async fn list_stale_claims(
            &mut self,
            schema: &InboxSchema,
            older_than: Duration,
            limit: u32,
        ) -> QueryResult<Vec<StaleClaim>> {
            let schema = *schema;
            self.spawn_blocking(move |conn| {
                PurgeConnection::list_stale_claims(conn, &schema, older_than, limit)
            })
            .await
        }
    }
}
