//! A statement as the runtime sends it — SQL text and binds — and how each backend runs one.

use std::borrow::Cow;

use diesel::QueryResult;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};

use super::Dialect;

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

    /// The statement as diesel runs it: a boxed `sql_query`, prepared for each run, or, when
    /// [`cached`](Sql::cached), kept prepared.
    pub(crate) fn query<DB: Dialect>(&self) -> Statement<'_, DB> {
        if self.cached {
            return Statement::Cached(self, std::marker::PhantomData);
        }
        Statement::Boxed(self.binds.iter().fold(
            diesel::sql_query(self.text.as_ref()).into_boxed(),
            |query, bind| match bind {
                Bind::BigInt(value) => DB::bind_i64(query, value),
                Bind::Text(value) => DB::bind_text(query, value),
                Bind::Bytes(value) => DB::bind_bytes(query, value),
            },
        ))
    }
}

/// A [`Sql`] as diesel runs it. Diesel's `sql_query` tells diesel not to keep the prepared
/// statement, which is right for text built from values; a [`cached`](Sql::cached) one is
/// written out with its binds in the order of its placeholders (`?`, or `$1`, `$2`, … in
/// order), and diesel keeps it prepared by its text.
pub enum Statement<'f, DB: Dialect> {
    Boxed(BoxedSqlQuery<'f, DB, SqlQuery>),
    Cached(&'f Sql, std::marker::PhantomData<DB>),
}

impl<'f, DB> diesel::query_builder::QueryFragment<DB> for Statement<'f, DB>
where
    DB: Dialect
        + diesel::sql_types::HasSqlType<diesel::sql_types::BigInt>
        + diesel::sql_types::HasSqlType<diesel::sql_types::Binary>,
    BoxedSqlQuery<'f, DB, SqlQuery>: diesel::query_builder::QueryFragment<DB>,
    i64: diesel::serialize::ToSql<diesel::sql_types::BigInt, DB>,
    str: diesel::serialize::ToSql<diesel::sql_types::Text, DB>,
    [u8]: diesel::serialize::ToSql<diesel::sql_types::Binary, DB>,
{
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, DB>,
    ) -> QueryResult<()> {
        let sql = match self {
            Statement::Boxed(query) => return query.walk_ast(out),
            Statement::Cached(sql, _) => sql,
        };
        let mut binds = sql.binds.iter();
        for (at, segment) in placeholders(&sql.text).into_iter().enumerate() {
            if at > 0 {
                match binds.next() {
                    Some(Bind::BigInt(value)) => {
                        out.push_bind_param::<diesel::sql_types::BigInt, i64>(value)?
                    }
                    Some(Bind::Text(value)) => {
                        out.push_bind_param::<diesel::sql_types::Text, str>(value.as_str())?
                    }
                    Some(Bind::Bytes(value)) => {
                        out.push_bind_param::<diesel::sql_types::Binary, [u8]>(value.as_slice())?
                    }
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

impl<DB: Dialect> diesel::query_builder::QueryId for Statement<'_, DB> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<DB: Dialect> diesel::query_builder::Query for Statement<'_, DB> {
    type SqlType = diesel::sql_types::Untyped;
}

impl<DB: Dialect, C> diesel::RunQueryDsl<C> for Statement<'_, DB> {}

/// A row the runtime reads: one the derive `QueryableByName` reads on every enabled backend.
pub trait Row: Send + 'static + rows::OnPostgres + rows::OnMysql + rows::OnSqlite {}

impl<R: Send + 'static + rows::OnPostgres + rows::OnMysql + rows::OnSqlite> Row for R {}

/// [`Row`]'s parts, one per backend, empty where the backend's feature is off: each backend's
/// [`Dialect`] reads rows through its own part, where the backend is a concrete type.
pub mod rows {
    #[cfg(feature = "postgres")]
    pub trait OnPostgres: diesel::QueryableByName<diesel::pg::Pg> {}
    #[cfg(feature = "postgres")]
    impl<R: diesel::QueryableByName<diesel::pg::Pg>> OnPostgres for R {}
    #[cfg(not(feature = "postgres"))]
    pub trait OnPostgres {}
    #[cfg(not(feature = "postgres"))]
    impl<R> OnPostgres for R {}

    #[cfg(feature = "mysql")]
    pub trait OnMysql: diesel::QueryableByName<diesel::mysql::Mysql> {}
    #[cfg(feature = "mysql")]
    impl<R: diesel::QueryableByName<diesel::mysql::Mysql>> OnMysql for R {}
    #[cfg(not(feature = "mysql"))]
    pub trait OnMysql {}
    #[cfg(not(feature = "mysql"))]
    impl<R> OnMysql for R {}

    #[cfg(feature = "sqlite")]
    pub trait OnSqlite: diesel::QueryableByName<diesel::sqlite::Sqlite> {}
    #[cfg(feature = "sqlite")]
    impl<R: diesel::QueryableByName<diesel::sqlite::Sqlite>> OnSqlite for R {}
    #[cfg(not(feature = "sqlite"))]
    pub trait OnSqlite {}
    #[cfg(not(feature = "sqlite"))]
    impl<R> OnSqlite for R {}
}

/// A statement run on a sync connection of a backend `DB`, whose query diesel can run there:
/// what each backend's [`Dialect::execute`] calls, with `DB` concrete.
pub(crate) fn execute<DB, C>(conn: &mut C, sql: &Sql) -> QueryResult<usize>
where
    DB: Dialect,
    C: diesel::Connection<Backend = DB>,
    for<'f> Statement<'f, DB>: diesel::query_dsl::methods::ExecuteDsl<C>,
{
    diesel::RunQueryDsl::execute(sql.query::<DB>(), conn)
}

/// A query run on a sync connection: what each backend's [`Dialect::load`] calls.
pub(crate) fn load<DB, C, R>(conn: &mut C, sql: &Sql) -> QueryResult<Vec<R>>
where
    DB: Dialect,
    C: diesel::connection::LoadConnection<Backend = DB>,
    for<'f> Statement<'f, DB>: diesel::query_dsl::LoadQuery<'f, C, R>,
{
    diesel::RunQueryDsl::load(sql.query::<DB>(), conn)
}

/// A statement run on a diesel-async connection: what each backend's
/// [`Dialect::execute_async`] calls.
#[cfg(feature = "async")]
pub(crate) async fn execute_async<DB, C>(conn: &mut C, sql: &Sql) -> QueryResult<usize>
where
    DB: Dialect,
    C: diesel_async::AsyncConnection<Backend = DB>,
    for<'f> Statement<'f, DB>: diesel_async::methods::ExecuteDsl<C>,
{
    diesel_async::RunQueryDsl::execute(sql.query::<DB>(), conn).await
}

/// A query run on a diesel-async connection: what each backend's [`Dialect::load_async`]
/// calls.
#[cfg(feature = "async")]
pub(crate) fn load_async<'c, DB, C, R>(
    conn: &'c mut C,
    sql: &'c Sql,
) -> impl Future<Output = QueryResult<Vec<R>>> + Send + 'c
where
    DB: Dialect,
    C: diesel_async::AsyncConnection<Backend = DB>,
    R: Send + 'static,
    Statement<'c, DB>: diesel_async::methods::LoadQuery<'c, C, R>,
{
    diesel_async::RunQueryDsl::load(sql.query::<DB>(), conn)
}

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
