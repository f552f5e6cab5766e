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
}

impl Sql {
    pub(crate) fn new(text: impl Into<Cow<'static, str>>) -> Self {
        Self {
            text: text.into(),
            binds: Vec::new(),
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

    /// The statement as diesel runs it: a boxed `sql_query`, prepared and cached by its text.
    pub(crate) fn query<DB: Dialect>(&self) -> BoxedSqlQuery<'_, DB, SqlQuery> {
        self.binds.iter().fold(
            diesel::sql_query(self.text.as_ref()).into_boxed(),
            |query, bind| match bind {
                Bind::BigInt(value) => DB::bind_i64(query, value),
                Bind::Text(value) => DB::bind_text(query, value),
                Bind::Bytes(value) => DB::bind_bytes(query, value),
            },
        )
    }
}

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
    for<'f> BoxedSqlQuery<'f, DB, SqlQuery>: diesel::query_dsl::methods::ExecuteDsl<C>,
{
    diesel::RunQueryDsl::execute(sql.query::<DB>(), conn)
}

/// A query run on a sync connection: what each backend's [`Dialect::load`] calls.
pub(crate) fn load<DB, C, R>(conn: &mut C, sql: &Sql) -> QueryResult<Vec<R>>
where
    DB: Dialect,
    C: diesel::connection::LoadConnection<Backend = DB>,
    for<'f> BoxedSqlQuery<'f, DB, SqlQuery>: diesel::query_dsl::LoadQuery<'f, C, R>,
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
    for<'f> BoxedSqlQuery<'f, DB, SqlQuery>: diesel_async::methods::ExecuteDsl<C>,
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
    BoxedSqlQuery<'c, DB, SqlQuery>: diesel_async::methods::LoadQuery<'c, C, R>,
{
    diesel_async::RunQueryDsl::load(sql.query::<DB>(), conn)
}
