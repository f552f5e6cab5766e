//! Sqlite: what the runtime writes differently for it.

use diesel::query_builder::{AstPass, BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Text};

use diesel::QueryResult;

use uuid::Uuid;

use crate::dialect::claim::{ClaimRead, ClaimSql};
use crate::dialect::{self, Backend, Dialect, Row, Sql, marker};

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
    const BIGINT: &'static str = "BIGINT";

    fn bind_id<'b>(out: &mut AstPass<'_, 'b, Self>, id: &'b Uuid) -> QueryResult<()> {
        out.push_bind_param::<diesel::sql_types::Binary, [u8]>(&id.as_bytes()[..])
    }

    fn bind_int<'b>(out: &mut AstPass<'_, 'b, Self>, value: &'b i64) -> QueryResult<()> {
        out.push_bind_param::<BigInt, i64>(value)
    }

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

    fn execute_claim<C>(conn: &mut C, sql: ClaimSql<'_, Self>) -> QueryResult<usize>
    where
        C: diesel::Connection<Backend = Self>,
    {
        diesel::RunQueryDsl::execute(sql, conn)
    }

    fn read_claim<C>(conn: &mut C, sql: ClaimRead<'_, Self>) -> QueryResult<Vec<(i64, i64)>>
    where
        C: diesel::connection::LoadConnection<Backend = Self>,
    {
        diesel::RunQueryDsl::load(sql, conn)
    }

    #[cfg(feature = "async")]
    fn execute_claim_async<'c, C>(
        conn: &'c mut C,
        sql: ClaimSql<'c, Self>,
    ) -> impl Future<Output = QueryResult<usize>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>,
    {
        diesel_async::RunQueryDsl::execute(sql, conn)
    }

    #[cfg(feature = "async")]
    fn read_claim_async<'c, C>(
        conn: &'c mut C,
        sql: ClaimRead<'c, Self>,
    ) -> impl Future<Output = QueryResult<Vec<(i64, i64)>>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>,
    {
        diesel_async::RunQueryDsl::load(sql, conn)
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
