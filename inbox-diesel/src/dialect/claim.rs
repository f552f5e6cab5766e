//! Claim mode's statements, written once for every backend.
//!
//! A claim is an inbox row with `processed_at` NULL. Its `claimed_until` is the lease; its
//! `attempts` counts the deliveries that claimed it and fences them: every statement that
//! changes a claim names the attempt it belongs to, so an instance whose claim was taken
//! over changes nothing. Each statement runs on its own (autocommit), so no lock is held
//! while the side effect runs, and each is atomic by itself.
//!
//! | state of the row | `processed_at` | `claimed_until` |
//! |---|---|---|
//! | completed | set | NULL |
//! | live claim | NULL | in the future |
//! | expired claim (outcome unknown) | NULL | in the past |
//! | released claim (the body failed) | NULL | NULL |
//!
//! Times come from the database's clock only, so instances whose clocks disagree agree on
//! whether a lease has ended.

use std::marker::PhantomData;
use std::time::Duration;

use diesel::QueryResult;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::BigInt;
use inbox_core::{InboxSchema, MessageKey};
use uuid::Uuid;

use super::Dialect;
use super::layout::{Layout, Mark};
use super::marker::push_table;
use super::sql::Binds;

/// The state of an existing inbox row, as one delivery read it.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimState {
    Completed,
    Released,
    Live,
    Expired,
    /// Not read: the session would read rows not yet committed (MySQL and MariaDB
    /// `READ UNCOMMITTED`), where a marker seen might still roll back.
    Unread,
}

impl ClaimState {
    fn from_code(code: i64) -> Self {
        match code {
            0 => ClaimState::Completed,
            1 => ClaimState::Released,
            2 => ClaimState::Live,
            3 => ClaimState::Expired,
            _ => ClaimState::Unread,
        }
    }
}

/// One statement of claim mode.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub enum ClaimStep {
    /// Inserts a live claim with attempt 1, unless a row exists: 1 row or 0, with what the
    /// the table has the column, and the key's text is written to it.
    Insert {
        lease_ms: u64,
        layout: Layout,
        /// The request's fingerprint, written with the claim.
        fingerprint: Option<crate::value::Fingerprint>,
    },
    /// Reads the row's state and attempt counter.
    Read,
    /// `precheck = true`: [`ClaimStep::Read`] outside any transaction, which on MySQL and
    /// MariaDB answers [`ClaimState::Unread`] on a session that reads uncommitted rows.
    /// `nowait`: `on_locked = "in_flight"`, a marker another delivery holds uncommitted
    /// fails the read at once instead of waiting for it (MySQL, MariaDB).
    Precheck { layout: Layout, nowait: bool },
    /// Takes over a released claim — or with `expired` an expired one too — whose counter
    /// still is `seen`: 1 row or 0.
    TakeOver {
        seen: u32,
        lease_ms: u64,
        expired: bool,
    },
    /// Stamps the claim of `attempt` complete: 1 row, or 0 when it was taken over.
    Stamp { attempt: u32 },
    /// Releases the claim of `attempt` for a redelivery to retry: 1 row, or 0 when it was
    /// taken over.
    Release { attempt: u32 },
}

/// What a [`ClaimStep`] answered.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimAnswer {
    /// Rows inserted or updated.
    Rows(usize),
    /// The row's state, counter, and the lease left of a live claim; `None` when there is
    /// no row.
    Read(Option<(ClaimState, u32, Duration)>),
}

impl ClaimAnswer {
    pub(crate) fn changed(self) -> bool {
        matches!(self, ClaimAnswer::Rows(n) if n > 0)
    }
}

enum Part {
    Sql(&'static str),
    Table,
    Id,
    Consumer,
    /// The consumer, required to come with what the check found of the session ([`Mark`]).
    MarkedConsumer(Mark),
    /// ` AND <the session is one the check ran for>` ([`Mark::condition`]).
    MarkCondition(Mark),
    /// The key's text (`key_text`).
    KeyText,
    /// The request's fingerprint.
    Fingerprint,
    /// The ids of [`ClaimSql::present`], separated by commas.
    Ids,
    /// The id, required to come with `autocommit` on (MySQL, MariaDB) and, on MariaDB
    /// (`true`), with no transaction open (`@@in_transaction = 0`: a `START TRANSACTION`
    /// sent as SQL and left open): claim mode's statements each commit on their own, and
    /// with `autocommit = 0`, or inside such a transaction, none would. The insert of a
    /// session without it fails (1048 on `message_id`) before anything is written
    /// ([`autocommit_off`]).
    AutocommittedId(bool),
    Int(i64),
}

/// The claim's state, attempt counter and lease left, read.
pub type ClaimRead<'a, DB> = ClaimSql<'a, DB, (BigInt, BigInt, BigInt)>;

/// A row of a [`ClaimRead`]: the state's code, the attempt counter, and the milliseconds
/// the lease lasts yet (0 where the claim is not live).
pub type ClaimRow = (i64, i64, i64);

/// A claim-mode statement for backend `DB`, with `ST` the SQL type of the row it returns.
/// A query fragment rather than `sql_query`, so that diesel caches its prepared statement.
pub struct ClaimSql<'a, DB, ST = ()> {
    table: &'a str,
    id: Uuid,
    consumer: &'a str,
    /// The key's text, when a part binds it.
    key_text: String,
    /// The request's fingerprint, when a part binds it.
    fingerprint: Option<crate::value::Fingerprint>,
    /// The ids of [`Part::Ids`].
    ids: &'a [Uuid],
    parts: Vec<Part>,
    /// `fn() ->`: the statement is `Send` whatever the backend's type is.
    types: PhantomData<fn() -> (DB, ST)>,
}

/// `WHERE` of every statement but the insert.
const WHERE_KEY: [Part; 4] = [
    Part::Sql(" WHERE message_id = "),
    Part::Id,
    Part::Sql(" AND consumer = "),
    Part::Consumer,
];

/// `WHERE` of a statement that changes the claim of `attempt`: [`WHERE_KEY`], the attempt, and
/// not completed.
fn where_open_claim(attempt: u32) -> impl Iterator<Item = Part> {
    WHERE_KEY.into_iter().chain([
        Part::Sql(" AND attempts = "),
        Part::Int(attempt.into()),
        Part::Sql(" AND processed_at IS NULL"),
    ])
}

impl<'a, DB: Dialect> ClaimSql<'a, DB> {
    /// The statement of `step` (not `Read`: see [`ClaimSql::read`]).
    pub(crate) fn new(
        schema: &'a InboxSchema,
        consumer: &'a str,
        key: &MessageKey,
        step: ClaimStep,
    ) -> Self {
        use Part::{AutocommittedId, Consumer, Id, Int, KeyText, MarkedConsumer, Sql, Table};
        let lease = |ms: u64| {
            [
                Sql(DB::LEASE_UNTIL.0),
                Int(i64::try_from(ms).unwrap_or(i64::MAX)),
                Sql(DB::LEASE_UNTIL.1),
            ]
        };
        let mut parts = Vec::with_capacity(20);
        match step {
            ClaimStep::Insert {
                lease_ms,
                layout,
                fingerprint,
            } => {
                let consumer = layout.mark().map_or(Consumer, MarkedConsumer);
                // MySQL and MariaDB: the session's mark, and autocommit on.
                let id = match layout.session_mark {
                    Some(_) => AutocommittedId(layout.mariadb),
                    None => Id,
                };
                parts.extend([Sql("INSERT INTO "), Table]);
                parts.push(Sql(match (layout.key_text, fingerprint.is_some()) {
                    (false, false) => {
                        " (message_id, consumer, received_at, claimed_until, attempts) \
                             VALUES ("
                    }
                    (true, false) => {
                        " (message_id, consumer, key_text, received_at, claimed_until, \
                             attempts) VALUES ("
                    }
                    (false, true) => {
                        " (message_id, consumer, fingerprint, received_at, claimed_until, \
                             attempts) VALUES ("
                    }
                    (true, true) => {
                        " (message_id, consumer, key_text, fingerprint, received_at, \
                             claimed_until, attempts) VALUES ("
                    }
                }));
                parts.extend([id, Sql(", "), consumer, Sql(", ")]);
                if layout.key_text {
                    parts.extend([KeyText, Sql(", ")]);
                }
                if fingerprint.is_some() {
                    parts.extend([Part::Fingerprint, Sql(", ")]);
                }
                parts.extend([Sql(DB::NOW), Sql(", ")]);
                parts.extend(lease(lease_ms));
                parts.extend([Sql(", 1)"), Sql(DB::CLAIM_ON_CONFLICT)]);
            }
            ClaimStep::Read | ClaimStep::Precheck { .. } => {
                unreachable!("a read is built by ClaimSql::read")
            }
            ClaimStep::TakeOver {
                seen,
                lease_ms,
                expired,
            } => {
                parts.extend([Sql("UPDATE "), Table, Sql(" SET claimed_until = ")]);
                parts.extend(lease(lease_ms));
                parts.push(Sql(", attempts = attempts + 1"));
                parts.extend(where_open_claim(seen));
                parts.push(Sql(" AND (claimed_until IS NULL"));
                if expired {
                    parts.extend([Sql(" OR claimed_until <= "), Sql(DB::LEASE_NOW)]);
                }
                parts.push(Sql(")"));
            }
            ClaimStep::Stamp { attempt } | ClaimStep::Release { attempt } => {
                parts.extend([Sql("UPDATE "), Table, Sql(" SET ")]);
                if matches!(step, ClaimStep::Stamp { .. }) {
                    parts.extend([Sql("processed_at = "), Sql(DB::NOW), Sql(", ")]);
                }
                parts.push(Sql("claimed_until = NULL"));
                parts.extend(where_open_claim(attempt));
            }
        }
        let statement = Self::of(schema, consumer, key.stored_id(), parts);
        match step {
            ClaimStep::Insert {
                layout,
                fingerprint,
                ..
            } => Self {
                key_text: match layout.key_text {
                    true => super::layout::key_text(key),
                    false => String::new(),
                },
                fingerprint,
                ..statement
            },
            _ => statement,
        }
    }

    /// `SELECT <state code>, attempts … WHERE message_id = ? AND consumer = ?`. With
    /// `committed_only` (a precheck, with the layout's server flavour) on MySQL and MariaDB,
    /// a session at `READ UNCOMMITTED` reads code 4 ([`ClaimState::Unread`]): there a marker
    /// another delivery has not committed yet would read as completed, and the message would
    /// be acknowledged before its first delivery rolled back. The read is a locking one
    /// (`LOCK IN SHARE MODE`) too: a session given `READ UNCOMMITTED` for its next
    /// transaction only (`SET TRANSACTION ISOLATION LEVEL …`, which no variable shows) reads
    /// the marker only once the delivery holding it ended, committed or not — never a marker
    /// that may yet roll back. (Outside any transaction its lock ends with the statement.)
    pub(crate) fn read(
        schema: &'a InboxSchema,
        consumer: &'a str,
        key: &MessageKey,
        committed_only: Option<Layout>,
        nowait: bool,
    ) -> ClaimRead<'a, DB> {
        let locking = committed_only.and_then(|layout| DB::precheck_read(layout.mariadb, nowait));
        let mut parts = select_bigints::<DB>(
            locking.map_or(
                "SELECT CAST(CASE WHEN processed_at IS NOT NULL THEN 0 ",
                |l| l.0,
            ),
            [
                &[
                    "WHEN claimed_until IS NULL THEN 1 WHEN claimed_until > ",
                    DB::LEASE_NOW,
                    " THEN 2 ELSE 3 END",
                ],
                &["attempts"],
                &[
                    "CASE WHEN claimed_until > ",
                    DB::LEASE_NOW,
                    " THEN ",
                    DB::LEASE_LEFT_MS,
                    " ELSE 0 END",
                ],
            ],
        );
        parts.extend(WHERE_KEY);
        // A precheck reads only where the check ran: a session pointed at another database
        // or schema since reads nothing here, and its transaction's insert has it checked.
        if let Some(mark) = committed_only.and_then(Layout::mark) {
            parts.push(Part::MarkCondition(mark));
        }
        if let Some((_, lock)) = locking {
            parts.push(Part::Sql(lock));
        }
        ClaimSql::of(schema, consumer, key.stored_id(), parts)
    }
}

impl<'a, DB: Dialect> ClaimRead<'a, DB> {
    /// How many of `ids` have a row for `consumer` (twice, and a 0: the row type of a read):
    ///
    /// ```sql
    /// SELECT count(*), count(*), 0 FROM <table> WHERE consumer = ? AND message_id IN (?, …)
    /// ```
    ///
    /// The evidence of a duplicate where the insert reports one by writing nothing
    /// (`ON CONFLICT DO NOTHING`): a row the insert did not write may also have been
    /// swallowed (a trigger, a rule), and then it is not there. (Not `ONLY`: a partitioned
    /// table's rows are in its partitions; inheritance children are refused by the check.)
    /// `latest`: what committed last, whatever the snapshot of the transaction it runs in
    /// (MySQL and MariaDB: a locking read; elsewhere a statement sees what committed before
    /// it, or its transaction fails on what it cannot see).
    pub(crate) fn present(
        schema: &'a InboxSchema,
        consumer: &'a str,
        ids: &'a [Uuid],
        latest: bool,
    ) -> Self {
        use Part::{Consumer, Ids, Sql};
        let mut parts = select_bigints::<DB>(
            "SELECT CAST(",
            [
                &["count(*)"],
                &["count(processed_at)"],
                &[
                    "count(CASE WHEN processed_at IS NULL AND claimed_until > ",
                    DB::LEASE_NOW,
                    " THEN 1 END)",
                ],
            ],
        );
        parts.extend([
            Sql(" WHERE consumer = "),
            Consumer,
            Sql(" AND message_id IN ("),
            Ids,
            Sql(")"),
            Sql(if latest { DB::LATEST_READ } else { "" }),
        ]);
        ClaimSql {
            ids,
            ..ClaimSql::of(schema, consumer, Uuid::nil(), parts)
        }
    }
}

impl<'a, DB, ST> ClaimSql<'a, DB, ST> {
    /// The statement of `parts` on the row of `id` and `consumer`, binding no key text,
    /// fingerprint or list of ids.
    fn of(schema: &'a InboxSchema, consumer: &'a str, id: Uuid, parts: Vec<Part>) -> Self {
        ClaimSql {
            table: schema.table(),
            id,
            consumer,
            key_text: String::new(),
            fingerprint: None,
            ids: &[],
            parts,
            types: PhantomData,
        }
    }
}

/// `SELECT CAST(<column> AS BIGINT), … FROM <table>` with [`Dialect::BIGINT`], each column's
/// expression in pieces of SQL. `head` is the SQL up to the first column's first piece:
/// `SELECT CAST(` and what of the column a backend writes itself
/// ([`Dialect::precheck_read`]).
fn select_bigints<DB: Dialect>(head: &'static str, columns: [&[&'static str]; 3]) -> Vec<Part> {
    let mut parts = vec![Part::Sql(head)];
    for (n, column) in columns.into_iter().enumerate() {
        if n > 0 {
            parts.push(Part::Sql(", CAST("));
        }
        parts.extend(column.iter().map(|&sql| Part::Sql(sql)));
        parts.extend([Part::Sql(" AS "), Part::Sql(DB::BIGINT), Part::Sql(")")]);
    }
    parts.extend([Part::Sql(" FROM "), Part::Table]);
    parts
}

/// The row a [`ClaimSql::read`] returns, as the driver reads it.
/// The lease left is rounded up by a millisecond: the read truncated it.
pub(crate) fn read_answer(rows: Vec<ClaimRow>) -> ClaimAnswer {
    ClaimAnswer::Read(rows.first().map(|&(state, attempts, lease_left_ms)| {
        (
            ClaimState::from_code(state),
            u32::try_from(attempts).unwrap_or(u32::MAX),
            Duration::from_millis(u64::try_from(lease_left_ms).map_or(0, |ms| ms + 1)),
        )
    }))
}

impl<DB, ST> QueryId for ClaimSql<'_, DB, ST> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<DB, ST> Query for ClaimSql<'_, DB, ST> {
    type SqlType = ST;
}

impl<DB, ST, C> diesel::RunQueryDsl<C> for ClaimSql<'_, DB, ST> {}

impl<DB: Binds, ST> QueryFragment<DB> for ClaimSql<'_, DB, ST> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        for part in &self.parts {
            match part {
                Part::Sql(sql) => out.push_sql(sql),
                Part::Table => push_table(&mut out, self.table)?,
                Part::Id => DB::bind_id(&mut out, &self.id)?,
                Part::Consumer => DB::push_text(&mut out, self.consumer)?,
                Part::MarkedConsumer(mark) => {
                    let (before, after) = mark.guard();
                    out.push_sql(&before);
                    DB::push_text(&mut out, self.consumer)?;
                    out.push_sql(after);
                }
                Part::MarkCondition(mark) => {
                    out.push_sql(" AND ");
                    out.push_sql(&mark.condition());
                }
                Part::KeyText => DB::push_text(&mut out, &self.key_text)?,
                Part::Fingerprint => match &self.fingerprint {
                    Some(fingerprint) => DB::push_bytes(&mut out, fingerprint.as_bytes())?,
                    None => out.push_sql("NULL"),
                },
                Part::Ids => {
                    for (n, id) in self.ids.iter().enumerate() {
                        if n > 0 {
                            out.push_sql(", ");
                        }
                        DB::bind_id(&mut out, id)?;
                    }
                }
                Part::AutocommittedId(mariadb) => {
                    out.push_sql(match mariadb {
                        true => "IF(@@SESSION.autocommit = 1 AND @@in_transaction = 0, ",
                        false => "IF(@@SESSION.autocommit = 1, ",
                    });
                    DB::bind_id(&mut out, &self.id)?;
                    out.push_sql(", NULL)");
                }
                Part::Int(value) => DB::push_int(&mut out, value)?,
            }
        }
        Ok(())
    }
}

/// How a backend reads a claim's row ([`ClaimRead`]): written once, for every backend that
/// binds the runtime's values and reads three `BIGINT`s into a [`ClaimRow`].
pub trait ReadsClaims: Binds {
    /// Reads a claim's state on a sync connection.
    fn read_claim<C>(conn: &mut C, sql: ClaimRead<'_, Self>) -> QueryResult<Vec<ClaimRow>>
    where
        C: diesel::connection::LoadConnection<Backend = Self>;

    /// Reads a claim's state on a diesel-async connection.
    #[cfg(feature = "async")]
    fn read_claim_async<'c, C>(
        conn: &'c mut C,
        sql: ClaimRead<'c, Self>,
    ) -> impl Future<Output = QueryResult<Vec<ClaimRow>>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>;
}

impl<DB> ReadsClaims for DB
where
    DB: Binds + diesel::expression::QueryMetadata<(BigInt, BigInt, BigInt)>,
    ClaimRow: diesel::deserialize::FromSqlRow<(BigInt, BigInt, BigInt), DB>,
{
    fn read_claim<C>(conn: &mut C, sql: ClaimRead<'_, Self>) -> QueryResult<Vec<ClaimRow>>
    where
        C: diesel::connection::LoadConnection<Backend = Self>,
    {
        diesel::RunQueryDsl::load(sql, conn)
    }

    #[cfg(feature = "async")]
    fn read_claim_async<'c, C>(
        conn: &'c mut C,
        sql: ClaimRead<'c, Self>,
    ) -> impl Future<Output = QueryResult<Vec<ClaimRow>>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>,
    {
        diesel_async::RunQueryDsl::load(sql, conn)
    }
}

/// Runs a claim-mode statement on a sync connection.
pub(crate) fn execute_claim<DB, C>(conn: &mut C, sql: ClaimSql<'_, DB>) -> QueryResult<usize>
where
    DB: Dialect,
    C: diesel::Connection<Backend = DB>,
{
    diesel::RunQueryDsl::execute(sql, conn)
}

/// Runs a claim-mode statement on a diesel-async connection.
#[cfg(feature = "async")]
pub(crate) fn execute_claim_async<'c, DB, C>(
    conn: &'c mut C,
    sql: ClaimSql<'c, DB>,
) -> impl Future<Output = QueryResult<usize>> + Send + 'c
where
    DB: Dialect,
    C: diesel_async::AsyncConnection<Backend = DB>,
{
    diesel_async::RunQueryDsl::execute(sql, conn)
}

/// Whether a failed claim insert says that `autocommit` is off on the session (MySQL and
/// MariaDB), or a transaction is open there (MariaDB): error 1048 on `message_id`, which
/// only [`Part::AutocommittedId`] makes NULL.
pub(crate) fn autocommit_off(error: &diesel::result::Error) -> bool {
    crate::classify::with_server_error(error, |server| {
        server
            .message
            .contains("Column 'message_id' cannot be null")
    })
    .unwrap_or(false)
}

#[cfg(all(test, any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
mod tests;
