//! The inbox marker's insert: one message's, a batch's.

use std::marker::PhantomData;
#[cfg(feature = "postgres")]
use std::{cell::RefCell, rc::Rc};

use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Text};
use diesel::{QueryResult, RunQueryDsl};
use inbox_core::InboxSchema;
use uuid::Uuid;

use super::Dialect;
use super::layout::Mark;

/// The marker insert, written once for every backend:
///
/// ```sql
/// INSERT INTO <table> (message_id, consumer, received_at, processed_at) VALUES (?, ?, <now>, <now>)
///     ON CONFLICT (message_id, consumer) DO NOTHING RETURNING 1    -- PostgreSQL, SQLite
/// ```
///
/// On a table with `key_text`, the key's text is a third column and bind. `received_at` is
/// written, not left to the column's default: an older MySQL table's default is the session's
/// local time, and the runtime's times are UTC ([`Dialect::NOW`]).
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
pub struct ClaimMarker<'a, DB> {
    table: &'a str,
    id: &'a Uuid,
    consumer: &'a str,
    text: Option<&'a str>,
    /// The insert requires what the check found of the session ([`Mark`]).
    mark: Option<Mark>,
    /// `fn() ->`: the insert is `Send` whatever the backend's type is.
    backend: PhantomData<fn() -> DB>,
}

impl<'a, DB> ClaimMarker<'a, DB> {
    pub(crate) fn new(
        schema: &'a InboxSchema,
        consumer: &'a str,
        id: &'a Uuid,
        text: Option<&'a str>,
        mark: Option<Mark>,
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

impl<DB: Dialect> QueryFragment<DB> for ClaimMarker<'_, DB>
where
    str: diesel::serialize::ToSql<Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        push_insert_into(&mut out, self.table, self.text.is_some())?;
        push_values(&mut out, self.id, self.consumer, self.mark, self.text)?;
        out.push_sql(DB::ON_CONFLICT);
        Ok(())
    }
}

/// The markers of a batch in one statement. PostgreSQL and SQLite ([`ClaimMarkers::new`]):
///
/// ```sql
/// INSERT INTO <table> (message_id, consumer, received_at, processed_at) VALUES (?, ?, <now>, <now>), …
///     ON CONFLICT (message_id, consumer) DO NOTHING RETURNING message_id
/// ```
///
/// returning the ids of those inserted; `ST` is the SQL type of the returned id. MySQL and
/// MariaDB ([`ClaimMarkers::all_or_none`]), which return no rows from an `INSERT` and have no
/// `ON CONFLICT … DO NOTHING`: the plain insert, with the session's mark on each row. It
/// inserts every marker or none: a duplicate among them fails the statement with 1062 on the
/// inbox's index, InnoDB rolls back that statement only, and the caller then claims the batch
/// row by row ([`claim_rows_then_each`]). Every other error is the statement's own.
pub struct ClaimMarkers<'a, DB, ST> {
    table: &'a str,
    ids: &'a [Uuid],
    consumer: &'a str,
    /// The keys' texts, in the order of `ids`, for a table with `key_text`.
    texts: Option<&'a [String]>,
    /// The insert requires what the check found of the session ([`Mark`]).
    mark: Option<Mark>,
    /// MariaDB: the insert runs in strict mode (`SET STATEMENT sql_mode = 'STRICT_ALL_TABLES'
    /// FOR …`), whatever the session's `sql_mode`. Without it a multi-row insert on a
    /// non-strict session turns the mark's `NULL` consumer into `''` with a warning: a session
    /// the check has not seen writes markers of nobody, and their messages are applied
    /// again. (A single-row insert fails on the `NULL` in any mode.)
    strict: bool,
    /// `ON CONFLICT … DO NOTHING RETURNING message_id` (PostgreSQL, SQLite).
    returning: bool,
    types: PhantomData<fn() -> (DB, ST)>,
}

impl<'a, DB, ST> ClaimMarkers<'a, DB, ST> {
    pub(crate) fn new(
        schema: &'a InboxSchema,
        consumer: &'a str,
        ids: &'a [Uuid],
        texts: Option<&'a [String]>,
        mark: Option<Mark>,
    ) -> Self {
        Self {
            table: schema.table(),
            ids,
            consumer,
            texts,
            mark,
            strict: false,
            returning: true,
            types: PhantomData,
        }
    }

    /// The insert of MySQL and MariaDB (`mariadb`: in strict mode): all of the markers or
    /// none, returning nothing.
    #[cfg(feature = "mysql")]
    pub(crate) fn all_or_none(self, mariadb: bool) -> Self {
        Self {
            strict: mariadb,
            returning: false,
            ..self
        }
    }
}

impl<DB, ST> QueryId for ClaimMarkers<'_, DB, ST> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<DB, ST> Query for ClaimMarkers<'_, DB, ST> {
    type SqlType = ST;
}

impl<DB, ST, C> RunQueryDsl<C> for ClaimMarkers<'_, DB, ST> {}

impl<DB: Dialect, ST> QueryFragment<DB> for ClaimMarkers<'_, DB, ST>
where
    str: diesel::serialize::ToSql<Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        if self.strict {
            out.push_sql("SET STATEMENT sql_mode = 'STRICT_ALL_TABLES' FOR ");
        }
        push_insert_into(&mut out, self.table, self.texts.is_some())?;
        for (n, id) in self.ids.iter().enumerate() {
            if n > 0 {
                out.push_sql(", ");
            }
            let text = self.texts.map(|texts| texts[n].as_str());
            push_values(&mut out, id, self.consumer, self.mark, text)?;
        }
        if self.returning {
            out.push_sql(" ON CONFLICT (message_id, consumer) DO NOTHING RETURNING message_id");
        }
        Ok(())
    }
}

/// Rows per multi-row marker insert: 3 or 4 binds each, far inside MySQL's 65,535
/// placeholders per statement.
#[cfg(feature = "mysql")]
pub(crate) const ROWS_PER_INSERT: usize = 500;

/// The SQL text of one row of a multi-row marker insert, at most (the session mark's guard is
/// its longest part).
#[cfg(feature = "mysql")]
const SQL_PER_ROW: usize = 200;

/// The SQL text of a marker insert around its rows, at most.
#[cfg(feature = "mysql")]
const SQL_AROUND: usize = 400;

/// A row's parameters beside the consumer's and the key's text: the id and what frames them.
#[cfg(feature = "mysql")]
const BINDS_PER_ROW: usize = 48;

/// Whether one marker's insert fits in the server's packet (MySQL, MariaDB: `max_allowed_packet`,
/// [`Layout::max_packet`](super::layout::Layout)); otherwise the key's refusal
/// ([`KeyError::TooLongForServer`](inbox_core::KeyError::TooLongForServer)), before anything
/// is sent: sent, the statement would make the server drop the connection on every
/// redelivery.
#[cfg(feature = "mysql")]
pub(crate) fn marker_fits(
    consumer: &str,
    text: Option<&str>,
    layout: super::layout::Layout,
) -> QueryResult<()> {
    let binds = BINDS_PER_ROW + consumer.len() + text.map_or(0, str::len);
    if layout.fits(SQL_AROUND + SQL_PER_ROW) && layout.fits(binds) {
        return Ok(());
    }
    Err(diesel::result::Error::QueryBuilderError(Box::new(
        crate::error::Error::InvalidKey(inbox_core::KeyError::TooLongForServer {
            len: text.map_or(0, str::len),
            max_packet: layout.max_packet,
        }),
    )))
}

/// The ranges of a batch's markers that each multi-row insert takes: at most
/// [`ROWS_PER_INSERT`] rows, its SQL text and its parameters each within the server's packet
/// (a batch of long keys on a small `max_allowed_packet` takes more statements, never one
/// the server drops the connection for). A key that does not fit alone refuses the batch
/// ([`marker_fits`]).
#[cfg(feature = "mysql")]
pub(crate) fn marker_chunks(
    count: usize,
    consumer: &str,
    texts: Option<&[String]>,
    layout: super::layout::Layout,
) -> QueryResult<Vec<std::ops::Range<usize>>> {
    let mut chunks = Vec::new();
    let (mut start, mut sql, mut binds) = (0, SQL_AROUND, 0);
    for n in 0..count {
        let text = texts.map(|texts| texts[n].as_str());
        marker_fits(consumer, text, layout)?;
        let row = BINDS_PER_ROW + consumer.len() + text.map_or(0, str::len);
        let full = n - start == ROWS_PER_INSERT
            || !layout.fits(sql + SQL_PER_ROW)
            || !layout.fits(binds + row);
        if n > start && full {
            chunks.push(start..n);
            (start, sql, binds) = (n, SQL_AROUND, 0);
        }
        sql += SQL_PER_ROW;
        binds += row;
    }
    if start < count {
        chunks.push(start..count);
    }
    Ok(chunks)
}

/// How a backend reads what a marker's insert returned ([`ClaimMarker`], [`ClaimMarkers`]):
/// written once, for every backend that reads a `BIGINT` and its ids
/// ([`BindId::IdSql`](super::BindId)). MySQL's inserts return nothing: they are run
/// (`Io::run`), not read.
pub trait InsertsMarkers: Dialect {
    /// Inserts one marker on a sync connection; the rows it returned (0: it existed).
    fn insert_marker<C>(conn: &mut C, insert: ClaimMarker<'_, Self>) -> QueryResult<usize>
    where
        C: diesel::connection::LoadConnection<Backend = Self>;

    /// Inserts markers on a sync connection; the ids of those it inserted.
    fn insert_markers<C>(
        conn: &mut C,
        insert: ClaimMarkers<'_, Self, Self::IdSql>,
    ) -> QueryResult<Vec<Uuid>>
    where
        C: diesel::connection::LoadConnection<Backend = Self>;

    /// [`insert_marker`](Self::insert_marker) on a diesel-async connection.
    #[cfg(feature = "async")]
    fn insert_marker_async<'c, C>(
        conn: &'c mut C,
        insert: ClaimMarker<'c, Self>,
    ) -> impl Future<Output = QueryResult<usize>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>;

    /// [`insert_markers`](Self::insert_markers) on a diesel-async connection.
    #[cfg(feature = "async")]
    fn insert_markers_async<'c, C>(
        conn: &'c mut C,
        insert: ClaimMarkers<'c, Self, Self::IdSql>,
    ) -> impl Future<Output = QueryResult<Vec<Uuid>>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>;
}

impl<DB> InsertsMarkers for DB
where
    DB: Dialect
        + diesel::expression::QueryMetadata<BigInt>
        + diesel::expression::QueryMetadata<DB::IdSql>,
    i64: diesel::deserialize::FromSqlRow<BigInt, DB>,
    DB::IdRow: diesel::deserialize::FromSqlRow<DB::IdSql, DB>,
    str: diesel::serialize::ToSql<Text, DB>,
{
    fn insert_marker<C>(conn: &mut C, insert: ClaimMarker<'_, Self>) -> QueryResult<usize>
    where
        C: diesel::connection::LoadConnection<Backend = Self>,
    {
        Ok(RunQueryDsl::load::<i64>(insert, conn)?.len())
    }

    fn insert_markers<C>(
        conn: &mut C,
        insert: ClaimMarkers<'_, Self, Self::IdSql>,
    ) -> QueryResult<Vec<Uuid>>
    where
        C: diesel::connection::LoadConnection<Backend = Self>,
    {
        let rows: Vec<DB::IdRow> = RunQueryDsl::load(insert, conn)?;
        Ok(rows.into_iter().filter_map(DB::id_of).collect())
    }

    #[cfg(feature = "async")]
    fn insert_marker_async<'c, C>(
        conn: &'c mut C,
        insert: ClaimMarker<'c, Self>,
    ) -> impl Future<Output = QueryResult<usize>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>,
    {
        let rows = diesel_async::RunQueryDsl::load::<i64>(insert, conn);
        async move { Ok(rows.await?.len()) }
    }

    #[cfg(feature = "async")]
    fn insert_markers_async<'c, C>(
        conn: &'c mut C,
        insert: ClaimMarkers<'c, Self, Self::IdSql>,
    ) -> impl Future<Output = QueryResult<Vec<Uuid>>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>,
    {
        let rows = diesel_async::RunQueryDsl::load::<DB::IdRow>(insert, conn);
        async move { Ok(rows.await?.into_iter().filter_map(DB::id_of).collect()) }
    }
}

/// What a chunk's multi-row insert decided: all its markers inserted, or a duplicate among
/// them (the statement rolled back: claim them one by one).
#[cfg(feature = "mysql")]
pub(crate) fn claim_rows_then_each(
    inserted: QueryResult<usize>,
    schema: &InboxSchema,
    rows: usize,
) -> QueryResult<bool> {
    match inserted_unless_duplicate(inserted, schema)? {
        0 => Ok(false),
        n if n == rows => Ok(true),
        n => Err(diesel::result::Error::QueryBuilderError(
            format!("a multi-row marker insert of {rows} rows reported {n} inserted").into(),
        )),
    }
}

/// `ON CONFLICT … DO NOTHING RETURNING 1`: no row back means the marker existed. A constant,
/// not `id`: the claim depends on no column but the key's.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) const ON_CONFLICT_RETURNING: &str =
    " ON CONFLICT (message_id, consumer) DO NOTHING RETURNING CAST(1 AS BIGINT)";

/// `ON CONFLICT … DO NOTHING`: 0 rows inserted means the row existed.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) const ON_CONFLICT_DO_NOTHING: &str = " ON CONFLICT (message_id, consumer) DO NOTHING";

/// The rows an insert of a marker or a claim wrote: 0 when the row existed. MySQL and
/// MariaDB have no `ON CONFLICT`: their plain insert fails with error 1062 naming the inbox's
/// own index (the statement rolled back, a transaction still open) — a duplicate. Any other
/// error, another index's 1062 included, stays an error.
pub(crate) fn inserted_unless_duplicate(
    inserted: QueryResult<usize>,
    schema: &InboxSchema,
) -> QueryResult<usize> {
    match inserted {
        Err(e)
            if crate::classify::class_of(&e, schema) == inbox_core::ErrorClass::InboxDuplicate =>
        {
            Ok(0)
        }
        other => other,
    }
}

/// `INSERT INTO <table> (message_id, consumer, [key_text, ]received_at, processed_at) VALUES `
fn push_insert_into<DB: diesel::backend::Backend>(
    out: &mut AstPass<'_, '_, DB>,
    table: &str,
    key_text: bool,
) -> QueryResult<()> {
    out.push_sql("INSERT INTO ");
    push_table(out, table)?;
    out.push_sql(match key_text {
        true => " (message_id, consumer, key_text, received_at, processed_at) VALUES ",
        false => " (message_id, consumer, received_at, processed_at) VALUES ",
    });
    Ok(())
}

/// One marker's row of [`push_insert_into`]: `(<id>, <consumer>, [<key text>, ]<now>, <now>)`.
fn push_values<'b, DB: Dialect>(
    out: &mut AstPass<'_, 'b, DB>,
    id: &'b Uuid,
    consumer: &'b str,
    mark: Option<Mark>,
    text: Option<&'b str>,
) -> QueryResult<()>
where
    str: diesel::serialize::ToSql<Text, DB>,
{
    out.push_sql("(");
    DB::bind_id(out, id)?;
    out.push_sql(", ");
    push_consumer(out, consumer, mark)?;
    out.push_sql(", ");
    if let Some(text) = text {
        out.push_bind_param::<Text, str>(text)?;
        out.push_sql(", ");
    }
    out.push_sql(DB::NOW);
    out.push_sql(", ");
    out.push_sql(DB::NOW);
    out.push_sql(")");
    Ok(())
}

/// The consumer's bind, inside the [`Mark`]'s guard where the insert requires one.
fn push_consumer<'b, DB: diesel::backend::Backend>(
    out: &mut AstPass<'_, 'b, DB>,
    consumer: &'b str,
    mark: Option<Mark>,
) -> QueryResult<()>
where
    str: diesel::serialize::ToSql<Text, DB>,
{
    match mark {
        Some(mark) => {
            let (before, after) = mark.guard();
            out.push_sql(&before);
            out.push_bind_param::<Text, str>(consumer)?;
            out.push_sql(after);
        }
        None => out.push_bind_param::<Text, str>(consumer)?,
    }
    Ok(())
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

/// PostgreSQL: the marker's insert as a statement prepared on the session (`PREPARE`), so
/// that the transaction's start can run it in the same simple-protocol string
/// ([`PgMarker::begin`]) without parsing and planning it on every message — and with it the
/// checks the transaction runs after its `BEGIN`
/// ([`HandlerSpec::postgres_begin_checks`](crate::spec::HandlerSpec::postgres_begin_checks)),
/// one `SELECT`, parsed and planned once per session instead of three statements parsed on
/// every message (BENCHMARKS.md measures what that saves the server).
///
/// ```sql
/// PREPARE inbox_begin_<digest> AS SELECT <the transaction is the handler's>, <its settings>;
/// PREPARE inbox_marker_<digest> (uuid, text) AS
///     WITH marker AS (INSERT INTO <table> (message_id, consumer, received_at, processed_at)
///                     VALUES ($1, CASE WHEN <the check's database and table> THEN $2 END,
///                             <now>, <now>) RETURNING 1),
///          arbiter AS (INSERT INTO <table> (message_id, consumer) SELECT message_id, consumer
///                      FROM <table> WHERE false ON CONFLICT (message_id, consumer) DO NOTHING)
///     SELECT CASE count(*) WHEN 1 THEN 1 ELSE CAST('…' || count(*) || ' rows' AS integer) END
///     FROM marker
/// ```
///
/// A duplicate is the plain insert's unique violation naming the inbox's index (23505; the
/// transaction is then aborted, and rolled back): recognised by that name, as on MySQL. The
/// insert waits for another transaction's uncommitted marker as `ON CONFLICT` does. The
/// `arbiter` inserts nothing, but PostgreSQL plans its `ON CONFLICT (message_id, consumer)`
/// only against a unique index on the pair, and plans again when an index is dropped:
/// without one the statement fails before any row is written, as the separate insert's
/// `ON CONFLICT` did — a dropped index is noticed at once, never answered with a second
/// marker. An insert that writes no row without an error (a trigger or rule added after the
/// startup check) fails the `CASE`, never taken for a duplicate or a new message.
///
/// The consumer comes only where the session is in the database, and names the table, that
/// the startup check read ([`DatabaseMark`](super::layout::DatabaseMark)).
///
/// The name is a digest of the statement (the table as checked, `key_text` or not), so that
/// statements of different handlers and layouts never share one.
#[cfg(feature = "postgres")]
pub(crate) struct PgMarker {
    name: String,
    /// The parameters' types, for `PREPARE`.
    types: String,
    statement: String,
    key_text: bool,
    /// The transaction sets the session's messages to English for itself
    /// ([`Layout::english`](super::layout::Layout)).
    english: bool,
    /// What the marker keeps beside the key: where it keeps anything, it is written at the
    /// commit ([`commit`](Self::commit)), and the transaction's start takes the key's lock
    /// and looks for the marker instead ([`seen`](Self::seen)).
    keeps: Keeps,
    /// The look for the marker, prepared with the insert where the marker keeps anything.
    seen: Option<String>,
    /// What the transaction runs after its `BEGIN`
    /// ([`HandlerSpec::postgres_begin_checks`](crate::spec::HandlerSpec::postgres_begin_checks)),
    /// prepared with the insert.
    checks: String,
}

/// What a marker keeps beside its key, written in the same row: the handler's stored result
/// (`store_result`) and the request's fingerprint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Keeps {
    pub(crate) result: bool,
    pub(crate) fingerprint: bool,
}

impl Keeps {
    /// Whether the marker keeps anything beside its key.
    pub(crate) fn any(self) -> bool {
        self.result || self.fingerprint
    }
}

/// What a marker written at the commit keeps ([`PgMarker::commit`]): the stored result's
/// JSON text, the fingerprint's bytes — each where its handler keeps it. Only PostgreSQL
/// writes a marker at the commit: elsewhere nothing reads them.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub struct MarkerValues<'a> {
    pub(crate) result: Option<&'a str>,
    pub(crate) fingerprint: Option<&'a [u8]>,
}

/// What the look for a marker ([`PgMarker::seen`]) fails with where the marker exists, quoted
/// in the server's error whatever its language.
pub(crate) const MARKER_SEEN: &str = "inbox: the marker exists for ";

/// Whether `error` is [`MARKER_SEEN`]'s: the key's marker committed before this transaction
/// took the key's lock — a duplicate.
pub(crate) fn marker_seen(error: &diesel::result::Error) -> bool {
    crate::classify::with_server_error(error, |server| server.message.contains(MARKER_SEEN))
        .unwrap_or(false)
}

/// All that the marker's statement is written from: the handler's table (as checked) and what
/// of its [`Layout`](super::layout::Layout) the statement depends on — the key a thread keeps
/// the marker by ([`PgMarker::of`]).
#[cfg(feature = "postgres")]
#[derive(Clone, Copy, PartialEq, Eq)]
struct PgMarkerOf {
    table: &'static str,
    key_text: bool,
    english: bool,
    mark: Option<Mark>,
    keeps: Keeps,
    /// The handler's idle bound, in the checks after `BEGIN`.
    idle_ms: u32,
}

#[cfg(feature = "postgres")]
impl PgMarkerOf {
    fn new(spec: &crate::spec::HandlerSpec, layout: super::layout::Layout, keeps: Keeps) -> Self {
        PgMarkerOf {
            table: spec.schema.table(),
            key_text: layout.key_text,
            english: layout.english,
            mark: layout.mark(),
            keeps,
            idle_ms: spec.idle_in_transaction_ms,
        }
    }
}

#[cfg(feature = "postgres")]
impl PgMarker {
    /// The marker of a handler on `schema`'s table for `layout`, built once per thread and
    /// kept: only [`begin`](Self::begin) depends on the message, and writing the statement
    /// and hashing it for its name cost about 24 000 instructions per message, a fifth of
    /// the client's work for one. Kept by all that the marker is written from
    /// ([`PgMarkerOf`]: the table as checked, `key_text`, English, the check's mark), so that
    /// a kept marker is the one that would be written afresh — the statement sent is the same
    /// text — and handlers on one table share it. A thread keeps a few: its handlers' tables
    /// by the layouts checked on its connections (a database mark per database, tenants'
    /// included); past 64 it starts again.
    pub(crate) fn of(
        spec: &crate::spec::HandlerSpec,
        layout: super::layout::Layout,
        keeps: Keeps,
    ) -> Rc<Self> {
        /// Markers a thread keeps.
        const KEPT: usize = 64;
        thread_local! {
            static MARKERS: RefCell<Vec<(PgMarkerOf, Rc<PgMarker>)>> =
                const { RefCell::new(Vec::new()) };
        }
        let of = PgMarkerOf::new(spec, layout, keeps);
        MARKERS.with(|markers| {
            if let Some((_, marker)) = markers.borrow().iter().find(|(kept, _)| *kept == of) {
                return Rc::clone(marker);
            }
            let marker = Rc::new(Self::new(of));
            let mut markers = markers.borrow_mut();
            if markers.len() == KEPT {
                markers.clear();
            }
            markers.push((of, Rc::clone(&marker)));
            marker
        })
    }

    /// The marker built afresh ([`of`](Self::of) keeps it).
    fn new(of: PgMarkerOf) -> Self {
        use std::fmt::Write as _;
        let table = quoted_table(of.table, '"');
        let (mut columns, mut values) = (String::from("message_id, consumer"), String::new());
        let (before, after) = of.mark.map(|mark| mark.guard()).unwrap_or_default();
        let _ = write!(values, "$1, {before}$2{after}");
        let mut types = vec!["uuid", "text"];
        let mut column = |name: &str, kind: &'static str, cast: Option<&str>| {
            types.push(kind);
            let n = types.len();
            let _ = write!(columns, ", {name}");
            let _ = match cast {
                Some(to) => write!(values, ", CAST(${n} AS {to})"),
                None => write!(values, ", ${n}"),
            };
        };
        if of.key_text {
            column("key_text", "text", None);
        }
        if of.keeps.result {
            column("result", "text", Some("jsonb"));
        }
        if of.keeps.fingerprint {
            column("fingerprint", "bytea", None);
        }
        let statement = format!(
            "WITH marker AS (INSERT INTO {table} ({columns}, received_at, processed_at) \
             VALUES ({values}, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP) RETURNING 1), \
             arbiter AS (INSERT INTO {table} (message_id, consumer) SELECT message_id, consumer \
             FROM {table} WHERE false ON CONFLICT (message_id, consumer) DO NOTHING) \
             SELECT CASE count(*) WHEN 1 THEN 1 ELSE CAST('{SWALLOWED}' || count(*) || ' rows' \
             AS integer) END FROM marker"
        );
        // A column's value, never a constant: PostgreSQL folds a constant `CAST` while it
        // plans, failing the statement whether or not a row exists.
        let seen = of.keeps.any().then(|| {
            format!(
                "SELECT CAST('{MARKER_SEEN}' || consumer AS integer) FROM {table} \
                 WHERE message_id = $1 AND consumer = $2"
            )
        });
        let checks = crate::spec::HandlerSpec::postgres_begin_checks(of.idle_ms);
        let mut named = statement.clone();
        if let Some(seen) = &seen {
            named.push_str(seen);
        }
        named.push_str(&checks);
        let digest = uuid::Uuid::new_v5(&inbox_core::MessageKey::NAMESPACE, named.as_bytes());
        Self {
            name: format!("inbox_marker_{}", digest.simple()),
            types: types.join(", "),
            statement,
            key_text: of.key_text,
            english: of.english,
            keeps: of.keeps,
            seen,
            checks,
        }
    }

    /// Whether the marker keeps anything beside its key, and so is written at the commit.
    pub(crate) fn deferred(&self) -> bool {
        self.keeps.any()
    }

    /// The handler's transaction start (as [`HandlerSpec::postgres_begin_sql`]'s, its checks
    /// the `EXECUTE` of them prepared), then the marker's insert for `key`, as one string. The simple protocol takes no bind
    /// parameters, so the values are literals that cannot carry SQL: the id is a UUID's
    /// canonical text, the consumer and the key's text travel as hex (decoded by the server,
    /// whatever `standard_conforming_strings` says).
    ///
    /// [`HandlerSpec::postgres_begin_sql`]: crate::spec::HandlerSpec::postgres_begin_sql
    ///
    /// A marker that keeps anything is written at the commit ([`commit`](Self::commit)):
    /// the start takes the key's lock instead (`pg_advisory_xact_lock`, held to the end of
    /// the transaction) and then looks for the marker, failing with [`MARKER_SEEN`] where it
    /// exists. Two statements, so that the look, at READ COMMITTED, sees what committed
    /// while the lock was waited for.
    pub(crate) fn begin(
        &self,
        spec: &crate::spec::HandlerSpec,
        key: &inbox_core::MessageKey,
    ) -> String {
        let english = match self.english {
            true => SET_LOCAL_ENGLISH,
            false => "",
        };
        let begin = spec.postgres_begin_with(&format!("EXECUTE {}", self.checks_name()));
        let id = key.stored_id();
        let consumer = hex_text(spec.consumer.as_str());
        if self.deferred() {
            // The table is in the lock's key: tenants' tables in one database, sharing a
            // consumer and a key, do not wait for each other.
            let (table, name) = (spec.schema.table(), spec.consumer.as_str());
            let lock = super::keys::lock_hash(&format!("inbox marker\0{table}\0{name}\0{id}"));
            return format!(
                "{begin}; {english}SELECT pg_advisory_xact_lock({lock}); \
                 EXECUTE {}('{id}', {consumer})",
                self.seen_name()
            );
        }
        let mut sql = format!("{begin}; {english}EXECUTE {}('{id}', {consumer}", self.name);
        if self.key_text {
            sql.push_str(", ");
            sql.push_str(&hex_text(&super::layout::key_text(key)));
        }
        sql.push(')');
        sql
    }

    /// For a marker that keeps anything ([`begin`](Self::begin)): the marker's insert for
    /// `key` with what it keeps, then `COMMIT`, after the check that the transaction is
    /// still the handler's ([`HandlerSpec::POSTGRES_STILL_OURS`]) — one string, one round
    /// trip, one version of the marker's row. The values are literals, as `begin`'s.
    ///
    /// [`HandlerSpec::POSTGRES_STILL_OURS`]: crate::spec::HandlerSpec::POSTGRES_STILL_OURS
    pub(crate) fn commit(
        &self,
        spec: &crate::spec::HandlerSpec,
        key: &inbox_core::MessageKey,
        kept: MarkerValues<'_>,
    ) -> String {
        let mut sql = format!(
            "{}; EXECUTE {}('{}', {}",
            crate::spec::HandlerSpec::POSTGRES_STILL_OURS,
            self.name,
            key.stored_id(),
            hex_text(spec.consumer.as_str())
        );
        let mut value = |literal: String| {
            sql.push_str(", ");
            sql.push_str(&literal);
        };
        if self.key_text {
            value(hex_text(&super::layout::key_text(key)));
        }
        if self.keeps.result {
            value(kept.result.map_or_else(|| "NULL".to_owned(), hex_text));
        }
        if self.keeps.fingerprint {
            value(kept.fingerprint.map_or_else(
                || "NULL".to_owned(),
                |bytes| hex_literal("decode('", bytes, "', 'hex')"),
            ));
        }
        sql.push_str("); COMMIT");
        sql
    }

    /// The name of the look for the marker ([`begin`](Self::begin)).
    fn seen_name(&self) -> String {
        self.name.replacen("inbox_marker_", "inbox_seen_", 1)
    }

    /// The name of the checks after `BEGIN` ([`begin`](Self::begin)).
    fn checks_name(&self) -> String {
        self.name.replacen("inbox_marker_", "inbox_begin_", 1)
    }

    /// After an `EXECUTE` that found no such statement on the session (a new session, one
    /// reset by `DISCARD ALL`, or another server session behind a transaction-mode pooler):
    /// the rollback of that transaction, the session's messages set to English where the
    /// role may ([`ENGLISH_WHERE_ALLOWED`]; committed at once, or the handler's transaction
    /// rolled back would take it back), `PREPARE`, then `begin` again — one string, so
    /// that a pooler runs all of it on one server session. A server session the startup
    /// check never saw (a connection taken for a checked one, a pooler's other session)
    /// speaks English from its first marker on, as a checked one does.
    /// A marker that keeps anything prepares its look ([`begin`](Self::begin)) with it.
    pub(crate) fn prepared_and(&self, begin: &str) -> String {
        use std::fmt::Write as _;
        let seen = match &self.seen {
            Some(seen) => format!("PREPARE {} (uuid, text) AS {seen}; ", self.seen_name()),
            None => String::new(),
        };
        // A preparation cut off half-way (a lock timeout on the table, a cancel) leaves the
        // statements prepared before the failure on the session: each is dropped where it
        // exists, so that the next preparation does not fail on it for ever.
        let mut drop = String::from("DO $inbox$ BEGIN ");
        for name in [self.checks_name(), self.name.clone(), self.seen_name()] {
            let _ = write!(
                drop,
                "BEGIN EXECUTE 'DEALLOCATE {name}'; \
                 EXCEPTION WHEN invalid_sql_statement_name THEN NULL; END; "
            );
        }
        drop.push_str("END $inbox$");
        format!(
            "ROLLBACK; {ENGLISH_WHERE_ALLOWED}; COMMIT; {drop}; PREPARE {} AS {}; \
             PREPARE {} ({}) AS {}; {seen}{begin}",
            self.checks_name(),
            self.checks,
            self.name,
            self.types,
            self.statement
        )
    }

    /// Whether `error` is the session's lack of this statement (or of its look): the error
    /// names it (26000, in whatever language the server speaks; nothing else the string
    /// runs names it). The statements share the digest their names end with.
    pub(crate) fn missing(&self, error: &diesel::result::Error) -> bool {
        let digest = self.name.trim_start_matches("inbox_marker_");
        crate::classify::with_server_error(error, |server| server.message.contains(digest))
            .unwrap_or(false)
    }
}

/// PostgreSQL: the session's messages in English unless they are, where the role may set
/// them; a role that may not is left as it is (the startup check refuses it where its
/// messages are in another language).
#[cfg(feature = "postgres")]
const ENGLISH_WHERE_ALLOWED: &str = "DO $inbox$ BEGIN \
     PERFORM set_config('lc_messages', 'C', false) \
     WHERE current_setting('lc_messages') !~ '^(C|POSIX|en)([._@]|$)'; \
     EXCEPTION WHEN insufficient_privilege THEN NULL; END $inbox$";

/// PostgreSQL, where the startup check set the session's messages to English
/// ([`Layout::english`](super::layout::Layout)): each handler transaction sets them again for
/// itself, so that a `RESET ALL` (a pooler's reset query) or a `SET` of the application's
/// since the check does not bring back another language for what the runtime classifies.
#[cfg(feature = "postgres")]
const SET_LOCAL_ENGLISH: &str = "SET LOCAL lc_messages = 'C'; ";

/// The handler's `BEGIN` on PostgreSQL ([`HandlerSpec::postgres_begin_sql`]), with the
/// messages set to English for the transaction where the check found them in another
/// language.
///
/// [`HandlerSpec::postgres_begin_sql`]: crate::spec::HandlerSpec::postgres_begin_sql
#[cfg(feature = "postgres")]
pub(crate) fn postgres_begin(
    spec: &crate::spec::HandlerSpec,
    layout: super::layout::Layout,
) -> std::borrow::Cow<'static, str> {
    let begin = spec.postgres_begin_sql();
    match layout.english {
        true => format!("{begin}; {}", SET_LOCAL_ENGLISH.trim_end_matches("; ")).into(),
        false => begin,
    }
}

/// What the server's error says when the marker's insert wrote no row without failing.
#[cfg(feature = "postgres")]
const SWALLOWED: &str = "inbox: the marker insert wrote ";

/// MySQL and MariaDB: what goes before `START TRANSACTION` and it, then the marker's
/// insert, in one multi-statement string:
///
/// ```sql
/// [SET …;] START TRANSACTION;
/// INSERT INTO <table> (message_id, consumer, received_at, processed_at)
///     VALUES (X'<16 bytes>', IF(BINARY @inbox_checked_… = <database>, CONVERT(X'<hex>' USING utf8mb4), NULL), <now>, <now>)
/// ```
///
/// The same insert as [`ClaimMarker`]'s, with literals that cannot carry SQL (the id's bytes
/// and the consumer's and the key text's UTF-8 as hex): a duplicate is its error 1062 naming
/// the inbox's index, which rolls back that statement only; the session's mark is required as
/// in the prepared insert.
#[cfg(feature = "mysql")]
pub(crate) fn start_with_marker(
    spec: &crate::spec::HandlerSpec,
    key: &inbox_core::MessageKey,
    layout: super::layout::Layout,
) -> String {
    use std::fmt::Write as _;
    let begin = spec.mysql_begin_sql(layout.mariadb);
    let table = quoted_table(spec.schema.table(), '`');
    let mut sql = String::with_capacity(400 + begin.len());
    let _ = write!(sql, "{begin}; INSERT INTO {table} (message_id, consumer, ");
    if layout.key_text {
        sql.push_str("key_text, ");
    }
    sql.push_str("received_at, processed_at) VALUES (");
    sql.push_str(&hex_literal("X'", key.stored_id().as_bytes(), "', "));
    let consumer = utf8mb4_text(spec.consumer.as_str());
    match layout.mark() {
        Some(mark) => {
            let (before, after) = mark.guard();
            let _ = write!(sql, "{before}{consumer}{after}, ");
        }
        None => {
            let _ = write!(sql, "{consumer}, ");
        }
    }
    if layout.key_text {
        let _ = write!(sql, "{}, ", utf8mb4_text(&super::layout::key_text(key)));
    }
    let _ = write!(
        sql,
        "{now}, {now})",
        now = <diesel::mysql::Mysql as Dialect>::NOW
    );
    sql
}

/// Text as a MySQL literal that cannot end early: its UTF-8 bytes as a hex literal.
#[cfg(feature = "mysql")]
fn utf8mb4_text(text: &str) -> String {
    hex_literal("CONVERT(X'", text.as_bytes(), "' USING utf8mb4)")
}

/// Text as a literal that cannot end early: its UTF-8 bytes in hex, decoded by the server.
#[cfg(feature = "postgres")]
fn hex_text(text: &str) -> String {
    hex_literal(
        "convert_from(decode('",
        text.as_bytes(),
        "', 'hex'), 'UTF8')",
    )
}

/// `bytes` in lowercase hex, between `before` and `after`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn hex_literal(before: &str, bytes: &[u8], after: &str) -> String {
    use std::fmt::Write as _;
    let mut literal = String::with_capacity(before.len() + 2 * bytes.len() + after.len());
    literal.push_str(before);
    for byte in bytes {
        let _ = write!(literal, "{byte:02x}");
    }
    literal.push_str(after);
    literal
}

/// A table name, each part between `quote`s (doubled inside) as diesel quotes identifiers:
/// `"` for PostgreSQL, `` ` `` for MySQL.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn quoted_table(table: &str, quote: char) -> String {
    let doubled = format!("{quote}{quote}");
    table
        .split('.')
        .map(|part| format!("{quote}{}{quote}", part.replace(quote, &doubled)))
        .collect::<Vec<_>>()
        .join(".")
}

/// The inserts' SQL text on PostgreSQL and MySQL (SQLite's differs from PostgreSQL's only in
/// its placeholders and quotes).
#[cfg(all(test, any(feature = "postgres", feature = "mysql")))]
mod tests;
