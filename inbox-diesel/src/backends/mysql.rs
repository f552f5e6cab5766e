//! Mysql: what the runtime writes differently for it.

use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Text};

use diesel::QueryResult;

use crate::dialect::{self, Backend, Dialect, Row, Sql};

impl Dialect for diesel::mysql::Mysql {
    const BACKEND: Backend = Backend::Mysql;

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
