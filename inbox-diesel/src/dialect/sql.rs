//! A statement as the runtime sends it — SQL text and binds — and how each backend runs one.

use std::borrow::Cow;

use diesel::QueryResult;
use diesel::query_builder::{AstPass, BoxedSqlQuery, SqlQuery};
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, Binary, Text};

/// A value bound to a statement.
#[derive(Debug, Clone)]
pub enum Bind {
    BigInt(i64),
    Text(String),
    Bytes(Vec<u8>),
}

/// A statement: SQL text with `?` (or `$n`) placeholders, and the values bound to them.
#[derive(Debug, Clone)]
pub struct Sql {
    text: Cow<'static, str>,
    binds: Vec<Bind>,
    /// Prepared once per connection and kept ([`cached`](Sql::cached)).
    cached: bool,
}

impl Sql {
    pub(crate) fn new(text: impl Into<Cow<'static, str>>) -> Self {
        Self {
            text: text.into(),
            binds: Vec::new(),
            cached: false,
        }
    }

    /// A statement whose text is one of a few a process runs, again and again (the outbox's
    /// insert): each connection prepares it once and keeps it in diesel's statement cache,
    /// by its text. Never for text that embeds values (a list of `seq`s): the cache would
    /// keep every variant.
    pub(crate) fn cached(self) -> Self {
        Self {
            cached: true,
            ..self
        }
    }

    pub(crate) fn bind_i64(mut self, value: i64) -> Self {
        self.binds.push(Bind::BigInt(value));
        self
    }

    pub(crate) fn bind_text(mut self, value: impl Into<String>) -> Self {
        self.binds.push(Bind::Text(value.into()));
        self
    }

    pub(crate) fn bind_bytes(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.binds.push(Bind::Bytes(value.into()));
        self
    }

    /// The statement as diesel runs it on backend `DB`: a boxed `sql_query`, prepared for
    /// each run, or, when [`cached`](Sql::cached), kept prepared.
    pub(crate) fn query<DB: Binds>(&self) -> Statement<'_, DB> {
        if self.cached {
            return Statement::Cached(self, std::marker::PhantomData);
        }
        Statement::Boxed(
            self.binds
                .iter()
                .fold(diesel::sql_query(self.text.as_ref()).into_boxed(), DB::bind),
        )
    }
}

/// A [`Sql`] as diesel runs it. Diesel's `sql_query` tells diesel not to keep the prepared
/// statement, which is right for text built from values; a [`cached`](Sql::cached) one is
/// written out with its binds in the order of its placeholders (`?`, or `$1`, `$2`, … in
/// order), and diesel keeps it prepared by its text.
pub enum Statement<'f, DB: diesel::backend::Backend> {
    Boxed(BoxedSqlQuery<'f, DB, SqlQuery>),
    /// `fn() ->`: the statement is `Send` whatever the backend's type is.
    Cached(&'f Sql, std::marker::PhantomData<fn() -> DB>),
}

impl<DB: Binds> diesel::query_builder::QueryFragment<DB> for Statement<'_, DB> {
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, DB>,
    ) -> QueryResult<()> {
        let sql = match self {
            Statement::Boxed(query) => return DB::walk_boxed(query, out),
            Statement::Cached(sql, _) => sql,
        };
        let mut binds = sql.binds.iter();
        for (at, segment) in placeholders(&sql.text).into_iter().enumerate() {
            if at > 0 {
                match binds.next() {
                    Some(bind) => DB::push_bind(&mut out, bind)?,
                    None => {
                        return Err(diesel::result::Error::QueryBuilderError(
                            "a statement has more placeholders than binds".into(),
                        ));
                    }
                }
            }
            out.push_sql(segment);
        }
        Ok(())
    }
}

/// `text` split at its placeholders (`?`, `$1`…), which diesel writes back for each bind.
/// Only for statements of the runtime's own, without `?` or `$` in a literal.
fn placeholders(text: &str) -> Vec<&str> {
    let mut segments = Vec::new();
    let mut start = 0;
    let bytes = text.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'?' => {
                segments.push(&text[start..at]);
                at += 1;
                start = at;
            }
            b'$' if bytes.get(at + 1).is_some_and(u8::is_ascii_digit) => {
                segments.push(&text[start..at]);
                at += 1;
                while bytes.get(at).is_some_and(u8::is_ascii_digit) {
                    at += 1;
                }
                start = at;
            }
            _ => at += 1,
        }
    }
    segments.push(&text[start..]);
    segments
}

impl<DB: diesel::backend::Backend> diesel::query_builder::QueryId for Statement<'_, DB> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<DB: diesel::backend::Backend> diesel::query_builder::Query for Statement<'_, DB> {
    type SqlType = diesel::sql_types::Untyped;
}

impl<DB: diesel::backend::Backend, C> diesel::RunQueryDsl<C> for Statement<'_, DB> {}

/// How a backend binds the runtime's values: written once, for every diesel backend that
/// binds `i64`, text and bytes — facts each backend states for its concrete type, which code
/// generic over the backend cannot name. A [`Dialect`](super::Dialect) is one.
pub trait Binds:
    BindId
    + diesel::sql_types::HasSqlType<BigInt>
    + diesel::sql_types::HasSqlType<Text>
    + diesel::sql_types::HasSqlType<Binary>
    + Sized
    + 'static
{
    /// Binds a value into a statement, its placeholder written.
    fn push_bind<'b>(out: &mut AstPass<'_, 'b, Self>, bind: &'b Bind) -> QueryResult<()>;

    /// Binds a value to a boxed `sql_query`, whose text has the placeholders.
    fn bind<'f>(
        query: BoxedSqlQuery<'f, Self, SqlQuery>,
        bind: &'f Bind,
    ) -> BoxedSqlQuery<'f, Self, SqlQuery>;

    /// Writes a boxed `sql_query` out.
    fn walk_boxed<'b>(
        query: &'b BoxedSqlQuery<'_, Self, SqlQuery>,
        out: AstPass<'_, 'b, Self>,
    ) -> QueryResult<()>;

    /// Binds text, its placeholder written.
    fn push_text<'b>(out: &mut AstPass<'_, 'b, Self>, value: &'b str) -> QueryResult<()>;

    /// Binds a 64-bit integer, its placeholder written.
    fn push_int<'b>(out: &mut AstPass<'_, 'b, Self>, value: &'b i64) -> QueryResult<()>;

    /// Binds bytes, its placeholder written.
    fn push_bytes<'b>(out: &mut AstPass<'_, 'b, Self>, value: &'b [u8]) -> QueryResult<()>;
}

impl<DB> Binds for DB
where
    DB: BindId
        + diesel::sql_types::HasSqlType<BigInt>
        + diesel::sql_types::HasSqlType<Text>
        + diesel::sql_types::HasSqlType<Binary>
        + 'static,
    i64: ToSql<BigInt, DB>,
    str: ToSql<Text, DB>,
    [u8]: ToSql<Binary, DB>,
    for<'f> BoxedSqlQuery<'f, DB, SqlQuery>: diesel::query_builder::QueryFragment<DB>,
{
    fn push_bind<'b>(out: &mut AstPass<'_, 'b, Self>, bind: &'b Bind) -> QueryResult<()> {
        match bind {
            Bind::BigInt(value) => out.push_bind_param::<BigInt, i64>(value),
            Bind::Text(value) => out.push_bind_param::<Text, str>(value),
            Bind::Bytes(value) => out.push_bind_param::<Binary, [u8]>(value),
        }
    }

    fn bind<'f>(
        query: BoxedSqlQuery<'f, Self, SqlQuery>,
        bind: &'f Bind,
    ) -> BoxedSqlQuery<'f, Self, SqlQuery> {
        match bind {
            Bind::BigInt(value) => query.bind::<BigInt, _>(value),
            Bind::Text(value) => query.bind::<Text, _>(value.as_str()),
            Bind::Bytes(value) => query.bind::<Binary, _>(value.as_slice()),
        }
    }

    fn walk_boxed<'b>(
        query: &'b BoxedSqlQuery<'_, Self, SqlQuery>,
        out: AstPass<'_, 'b, Self>,
    ) -> QueryResult<()> {
        diesel::query_builder::QueryFragment::walk_ast(query, out)
    }

    fn push_text<'b>(out: &mut AstPass<'_, 'b, Self>, value: &'b str) -> QueryResult<()> {
        out.push_bind_param::<Text, str>(value)
    }

    fn push_int<'b>(out: &mut AstPass<'_, 'b, Self>, value: &'b i64) -> QueryResult<()> {
        out.push_bind_param::<BigInt, i64>(value)
    }

    fn push_bytes<'b>(out: &mut AstPass<'_, 'b, Self>, value: &'b [u8]) -> QueryResult<()> {
        out.push_bind_param::<Binary, [u8]>(value)
    }
}

/// A row the runtime reads: one the derive `QueryableByName` reads on every enabled backend.
pub trait Row: Send + 'static + rows::OnPostgres + rows::OnMysql + rows::OnSqlite {}

impl<R: Send + 'static + rows::OnPostgres + rows::OnMysql + rows::OnSqlite> Row for R {}

/// [`Row`]'s parts, one per backend, empty where the backend's feature is off: each backend's
/// [`Dialect`](super::Dialect) reads rows through its own part, where the backend is a concrete type.
pub mod rows {
    /// `$part`: a row the derive `QueryableByName` reads on `$backend` where `$feature` is on;
    /// every type where it is off.
    macro_rules! part {
        ($part:ident, $feature:literal, $backend:ty) => {
            #[cfg(feature = $feature)]
            pub trait $part: diesel::QueryableByName<$backend> {}
            #[cfg(feature = $feature)]
            impl<R: diesel::QueryableByName<$backend>> $part for R {}
            #[cfg(not(feature = $feature))]
            pub trait $part {}
            #[cfg(not(feature = $feature))]
            impl<R> $part for R {}
        };
    }

    part!(OnPostgres, "postgres", diesel::pg::Pg);
    part!(OnMysql, "mysql", diesel::mysql::Mysql);
    part!(OnSqlite, "sqlite", diesel::sqlite::Sqlite);
}

/// How a backend binds a message id, the one value the backends bind differently: a
/// `uuid` on PostgreSQL, its 16 bytes elsewhere.
pub trait BindId: diesel::backend::Backend {
    /// The SQL type an insert returns its markers' ids in (`RETURNING message_id`).
    type IdSql: diesel::sql_types::SqlType + diesel::sql_types::SingleValue + 'static;

    /// What such an id is read into.
    type IdRow: Send + 'static;

    /// Binds the message id into a query fragment.
    fn bind_id<'b>(out: &mut AstPass<'_, 'b, Self>, id: &'b uuid::Uuid) -> QueryResult<()>;

    /// The id an insert returned; `None` for one that is not 16 bytes.
    fn id_of(row: Self::IdRow) -> Option<uuid::Uuid>;
}

/// Runs a statement on a sync connection.
pub(crate) fn execute<DB, C>(conn: &mut C, sql: &Sql) -> QueryResult<usize>
where
    DB: Binds,
    C: diesel::Connection<Backend = DB>,
{
    diesel::RunQueryDsl::execute(sql.query::<DB>(), conn)
}

/// Runs a statement on a diesel-async connection.
#[cfg(feature = "async")]
pub(crate) fn execute_async<'c, DB, C>(
    conn: &'c mut C,
    sql: &'c Sql,
) -> impl Future<Output = QueryResult<usize>> + Send + 'c
where
    DB: Binds,
    C: diesel_async::AsyncConnection<Backend = DB>,
{
    diesel_async::RunQueryDsl::execute(sql.query::<DB>(), conn)
}

/// How a backend reads the runtime's rows ([`Row`]): one implementation per backend, written
/// once below, since only for a concrete backend does a [`Row`] read its rows.
pub trait Rows: diesel::backend::Backend {
    /// Runs a query on a sync connection; its rows.
    fn load<C, R: Row>(conn: &mut C, sql: &Sql) -> QueryResult<Vec<R>>
    where
        C: diesel::connection::LoadConnection<Backend = Self>;

    /// Runs a query on a diesel-async connection; its rows.
    #[cfg(feature = "async")]
    fn load_async<'c, C, R: Row>(
        conn: &'c mut C,
        sql: &'c Sql,
    ) -> impl Future<Output = QueryResult<Vec<R>>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>;
}

/// [`Rows`] for a backend whose rows every [`Row`] reads.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
macro_rules! rows {
    ($backend:ty) => {
        impl Rows for $backend {
            fn load<C, R: Row>(conn: &mut C, sql: &Sql) -> QueryResult<Vec<R>>
            where
                C: diesel::connection::LoadConnection<Backend = Self>,
            {
                diesel::RunQueryDsl::load(sql.query::<Self>(), conn)
            }

            #[cfg(feature = "async")]
            fn load_async<'c, C, R: Row>(
                conn: &'c mut C,
                sql: &'c Sql,
            ) -> impl Future<Output = QueryResult<Vec<R>>> + Send + 'c
            where
                C: diesel_async::AsyncConnection<Backend = Self>,
            {
                diesel_async::RunQueryDsl::load(sql.query::<Self>(), conn)
            }
        }
    };
}

#[cfg(feature = "postgres")]
rows!(diesel::pg::Pg);
#[cfg(feature = "mysql")]
rows!(diesel::mysql::Mysql);
#[cfg(feature = "sqlite")]
rows!(diesel::sqlite::Sqlite);

#[cfg(test)]
mod tests {
    use super::placeholders;

    #[test]
    fn a_statement_is_split_at_its_placeholders() {
        assert_eq!(
            placeholders("INSERT INTO t (a, b) VALUES (?, ?)"),
            ["INSERT INTO t (a, b) VALUES (", ", ", ")"]
        );
        assert_eq!(
            placeholders("SELECT CAST($1 AS uuid), $2, pg_notify($10, '')"),
            ["SELECT CAST(", " AS uuid), ", ", pg_notify(", ", '')"]
        );
        assert_eq!(placeholders("SELECT 1"), ["SELECT 1"]);
        assert_eq!(placeholders("SELECT '$'"), ["SELECT '$'"]);
    }
}
