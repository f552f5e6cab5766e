//! Sqlite: what the runtime writes differently for it.

use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Text};

use diesel::QueryResult;

use crate::dialect::{self, Backend, Dialect, Row, Sql};

impl Dialect for diesel::sqlite::Sqlite {
    const BACKEND: Backend = Backend::Sqlite;

    fn bind_i64<'f>(
        query: BoxedSqlQuery<'f, Self, SqlQuery>,
        value: &'f i64,
    ) -> BoxedSqlQuery<'f, Self, SqlQuery> {
        query.bind::<BigInt, _>(value)
    }

    fn bind_text<'f>(
        query: BoxedSqlQuery<'f, Self, SqlQuery>,
        value: &'f str,
    ) -> BoxedSqlQuery<'f, Self, SqlQuery> {
        query.bind::<Text, _>(value)
    }

    fn execute<C>(conn: &mut C, sql: &Sql) -> QueryResult<usize>
    where
        C: diesel::Connection<Backend = Self>,
    {
        dialect::execute(conn, sql)
    }

    fn load<C, R: Row>(conn: &mut C, sql: &Sql) -> QueryResult<Vec<R>>
    where
        C: diesel::connection::LoadConnection<Backend = Self>,
    {
        dialect::load(conn, sql)
    }

    #[cfg(feature = "async")]
    fn execute_async<'c, C>(
        conn: &'c mut C,
        sql: &'c Sql,
    ) -> impl Future<Output = QueryResult<usize>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>,
    {
        dialect::execute_async(conn, sql)
    }

    #[cfg(feature = "async")]
    fn load_async<'c, C, R: Row>(
        conn: &'c mut C,
        sql: &'c Sql,
    ) -> impl Future<Output = QueryResult<Vec<R>>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>,
    {
        dialect::load_async(conn, sql)
    }

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
