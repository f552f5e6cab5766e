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
//!
//! SQLite's lean table (`inbox-diesel migration generate --lean`), which has no `id` and no
//! index on `processed_at`, is purged in key order instead: each batch deletes the next
//! completed rows after the last key the batch before it deleted, so a run reads the table
//! once, whatever its size, and keeps nothing in memory but that key.

use std::time::Duration;

use diesel::QueryResult;
use diesel::result::Error as DieselError;
use diesel::sql_types::BigInt;
use inbox_core::{InboxSchema, Retention};

use crate::backends::HandlerConnection;
use crate::backends::InboxConnection;
use crate::backends::{OnBackend, on_backend};
use crate::dialect::Dialect;
use crate::dialect::Sql;
use crate::io::{Blocking, Io, complete_now};

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
    ///
    /// On SQLite, which has one writer at a time, give a purge beside live consumers a
    /// millisecond or more here: a consumer waiting for the write lock sleeps in its busy handler
    /// (up to 100 ms at a time) and takes the lock only if it wakes while no batch holds it,
    /// so a purge without pauses can leave it waiting for most of the run.
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

#[derive(diesel::QueryableByName)]
struct LockedDelete {
    #[diesel(sql_type = BigInt)]
    locked: i64,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// A deleted row's key: the cursor of a purge by key.
#[derive(diesel::QueryableByName)]
struct KeyRow {
    #[diesel(sql_type = diesel::sql_types::Binary)]
    message_id: Vec<u8>,
    #[diesel(sql_type = diesel::sql_types::Text)]
    consumer: String,
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
/// (the batches would then form one long transaction). On MySQL and MariaDB a session with
/// `autocommit = 0` is refused before anything is deleted: a `QueryBuilderError` carrying
/// [`Error::Session`](crate::Error::Session) (`inbox_diesel::Error::from` takes it out).
pub fn purge<C: HandlerConnection>(
    conn: &mut C,
    schema: &InboxSchema,
    purge: &Purge,
) -> QueryResult<PurgeReport> {
    struct Run<'a>(&'a InboxSchema, &'a Purge);
    impl OnBackend for Run<'_> {
        type Output = QueryResult<PurgeReport>;
        fn run<C: InboxConnection>(self, conn: &mut C) -> Self::Output {
            complete_now(run(&mut Blocking(conn), self.0, self.1))
        }
    }
    let span = tracing::info_span!("inbox.purge", table = schema.table());
    let _entered = span.enter();
    let report = on_backend(conn, Run(schema, purge))?;
    report.log();
    crate::telemetry::purged(schema.table(), report.removed);
    Ok(report)
}

/// Lists up to `limit` claims of `schema`'s table received longer than `older_than` ago and
/// never stamped complete, oldest first: the rows [`PurgeReport::stale_claims`] counts.
///
/// A claim is stale when its attempt died around its side effect and no redelivery came to
/// take it over (or `on_expired = "report"` told redeliveries not to). Reconcile each with
/// the downstream system: if the side effect happened, stamp the row
/// (`UPDATE inbox SET processed_at = now(), claimed_until = NULL WHERE message_id = … AND
/// consumer = …`; on MySQL and MariaDB `UTC_TIMESTAMP(6)`, the runtime's times being UTC); if not, redeliver the message after releasing the row
/// (`… SET claimed_until = NULL …`), which a delivery then takes over.
///
/// # Errors
/// A database error.
pub fn stale_claims<C: HandlerConnection>(
    conn: &mut C,
    schema: &InboxSchema,
    older_than: Duration,
    limit: u32,
) -> QueryResult<Vec<StaleClaim>> {
    struct List<'s>(&'s InboxSchema, Duration, u32);
    impl OnBackend for List<'_> {
        type Output = QueryResult<Vec<StaleClaim>>;
        fn run<C: InboxConnection>(self, conn: &mut C) -> Self::Output {
            complete_now(list_stale(&mut Blocking(conn), self.0, self.1, self.2))
        }
    }
    on_backend(conn, List(schema, older_than, limit))
}

/// The statement of [`stale_claims`].
async fn list_stale<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
    older_than: Duration,
    limit: u32,
) -> QueryResult<Vec<StaleClaim>> {
    let age = Purge::older_than(older_than).age_seconds();
    let table = S::Backend::BACKEND.quote_table(schema.table());
    let sql = Sql::new(S::Backend::list_stale(&table))
        .bind_i64(age)
        .bind_i64(i64::from(limit));
    let rows: Vec<StaleRow> = io.load(&sql).await?;
    Ok(rows.into_iter().map(StaleClaim::from).collect())
}

/// The purge: the lock where the backend has a session lock, then the batches, then the
/// count of stale claims; the lock released whatever happened.
async fn run<S: Io>(io: &mut S, schema: &InboxSchema, purge: &Purge) -> QueryResult<PurgeReport> {
    crate::io::refuse_open_transaction(io.transaction_status())?;
    let lock_name = format!("inbox purge {}", schema.table());
    let table = &S::Backend::BACKEND.quote_table(schema.table());
    if let Some(sql) = S::Backend::try_lock(table) {
        let sql = Sql::new(sql).bind_text(&lock_name).bind_text(&lock_name);
        let locked = one_n(io.load(&sql).await?);
        if locked == -1 {
            return Err(crate::error::Error::Session(
                crate::error::SessionProblem::AutocommitOff {
                    needed_by: "the purge",
                },
            )
            .into());
        }
        if locked == -2 {
            return Err(
                crate::error::Error::Session(crate::error::SessionProblem::ClockSet).into(),
            );
        }
        if locked != 1 {
            let mut report = PurgeReport::default();
            if let Some(sql) = S::Backend::lock_holder_idle(table) {
                let idle: Vec<N> = io.load(&Sql::new(sql).bind_text(&lock_name)).await?;
                report.lock_holder_idle_for = idle
                    .into_iter()
                    .next()
                    .map(|idle| Duration::from_secs(idle.n.max(0) as u64));
            }
            return Ok(report);
        }
    }
    let delete = match by_key(io, schema).await? {
        Some(delete) => Batch::Keyed {
            delete,
            after: (Vec::new(), String::new()),
        },
        None => Batch::by_age::<S::Backend>(table, &lock_name, purge),
    };
    let result = batches(io, table, delete, purge).await;
    if let Some(sql) = S::Backend::unlock(table) {
        // The lock is the session's: if releasing it fails, it goes with the connection.
        if let Err(e) = io.load::<N>(&Sql::new(sql).bind_text(&lock_name)).await {
            tracing::warn!(error = %e, "releasing the purge lock failed");
        }
    }
    result
}

/// The batches, each a `DELETE` committed on its own, until one removes fewer rows than the
/// batch size; then the count of stale claims.
async fn batches<S: Io>(
    io: &mut S,
    table: &str,
    mut delete: Batch,
    purge: &Purge,
) -> QueryResult<PurgeReport> {
    let mut report = PurgeReport {
        ran: true,
        ..PurgeReport::default()
    };
    loop {
        let Some(removed) = delete.run(io, purge).await? else {
            // Another purge holds the lock: the first batch leaves the table to it; a
            // later one stops with what was done.
            if report.batches == 0 {
                return Ok(PurgeReport::default());
            }
            break;
        };
        report.batches += 1;
        report.removed += removed as u64;
        if removed < purge.batch_size as usize {
            break;
        }
        if !purge.pause.is_zero() {
            io.sleep(purge.pause).await;
        }
    }
    stale_claims_counted(io, table, purge.age_seconds(), report).await
}

/// A purge's batch statement.
enum Batch {
    /// Oldest rows first, through the table's index on `processed_at`.
    ByAge(Sql),
    /// As [`Batch::ByAge`], taking the purge lock in the same statement (PostgreSQL).
    Locked(Sql),
    /// The purge of a table keyed by `(message_id, consumer)` alone: batches in key order,
    /// each after the last key the previous one deleted, so that the run reads the table
    /// once.
    Keyed {
        /// The statement, bound at each batch.
        delete: String,
        /// The last key deleted.
        after: (Vec<u8>, String),
    },
}

impl Batch {
    /// The statement of a table with `id`, purged oldest first.
    fn by_age<B: Dialect>(table: &str, lock_name: &str, purge: &Purge) -> Self {
        let (age, size) = (purge.age_seconds(), i64::from(purge.batch_size));
        match B::locked_delete_batch(table) {
            Some(sql) => Batch::Locked(
                Sql::new(sql)
                    .bind_i64(age)
                    .bind_i64(size)
                    .bind_text(lock_name),
            ),
            None => Batch::ByAge(
                Sql::new(B::delete_batch(table))
                    .bind_i64(age)
                    .bind_i64(size),
            ),
        }
    }

    /// Runs one batch: the rows it removed, or `None` where another purge holds the lock.
    async fn run<S: Io>(&mut self, io: &mut S, purge: &Purge) -> QueryResult<Option<usize>> {
        match self {
            Batch::ByAge(delete) => io.execute(delete).await.map(Some),
            Batch::Locked(delete) => {
                let batch: Vec<LockedDelete> = io.load(delete).await?;
                let batch = batch.into_iter().next().ok_or(DieselError::NotFound)?;
                Ok((batch.locked == 1).then_some(batch.n as usize))
            }
            Batch::Keyed { delete, after } => {
                let sql = Sql::new(delete.clone())
                    .bind_bytes(after.0.clone())
                    .bind_text(&after.1)
                    .bind_i64(purge.age_seconds())
                    .bind_i64(i64::from(purge.batch_size));
                let deleted: Vec<KeyRow> = io.load(&sql).await?;
                let removed = deleted.len();
                if let Some(last) = deleted
                    .into_iter()
                    .map(|row| (row.message_id, row.consumer))
                    .max()
                {
                    *after = last;
                }
                Ok(Some(removed))
            }
        }
    }
}

/// The batch statement of a table without `id` (SQLite's lean design); `None` for a table
/// with it, purged oldest first through its index on `processed_at`.
async fn by_key<S: Io>(io: &mut S, schema: &InboxSchema) -> QueryResult<Option<String>> {
    let (Some(has_id), Some(delete)) = (
        S::Backend::has_id(schema.table()),
        S::Backend::delete_batch_by_key(&S::Backend::BACKEND.quote_table(schema.table())),
    ) else {
        return Ok(None);
    };
    let (qualifier, name) = schema
        .table()
        .rsplit_once('.')
        .unwrap_or(("", schema.table()));
    let sql = Sql::new(has_id).bind_text(qualifier).bind_text(name);
    Ok((one_n(io.load(&sql).await?) == 0).then_some(delete))
}

/// `report` with the open claims older than `age` seconds counted.
async fn stale_claims_counted<S: Io>(
    io: &mut S,
    table: &str,
    age: i64,
    mut report: PurgeReport,
) -> QueryResult<PurgeReport> {
    let stale = Sql::new(S::Backend::count_stale(table)).bind_i64(age);
    report.stale_claims = one_n(io.load(&stale).await?).max(0) as u64;
    Ok(report)
}

/// The `n` of a query that returns one row.
fn one_n(rows: Vec<N>) -> i64 {
    rows.first().map_or(0, |row| row.n)
}

#[cfg(feature = "async")]
pub use asynchronous::{purge_async, stale_claims_async};

#[cfg(feature = "async")]
mod asynchronous {
    use tracing::Instrument;

    use super::*;
    use crate::backends::AsyncInboxConnection;
    use crate::io::Awaiting;

    /// [`purge`] on a diesel-async connection: the same batches, awaited.
    ///
    /// # Errors
    /// As [`purge`].
    pub async fn purge_async<C: AsyncInboxConnection>(
        conn: &mut C,
        schema: &InboxSchema,
        purge: &Purge,
    ) -> QueryResult<PurgeReport> {
        let span = tracing::info_span!("inbox.purge", table = schema.table());
        let report = run(&mut Awaiting(conn), schema, purge)
            .instrument(span.clone())
            .await?;
        span.in_scope(|| report.log());
        crate::telemetry::purged(schema.table(), report.removed);
        Ok(report)
    }

    /// [`stale_claims`] on a diesel-async connection.
    ///
    /// # Errors
    /// A database error.
    pub async fn stale_claims_async<C: AsyncInboxConnection>(
        conn: &mut C,
        schema: &InboxSchema,
        older_than: Duration,
        limit: u32,
    ) -> QueryResult<Vec<StaleClaim>> {
        list_stale(&mut Awaiting(conn), schema, older_than, limit).await
    }
}
