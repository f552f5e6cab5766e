//! Postgres: what the runtime writes differently for it.

use diesel::query_builder::AstPass;

use diesel::QueryResult;

use uuid::Uuid;

use diesel::pg::{Pg, PgConnection};
use inbox_core::MessageKey;

use super::{InboxConnection, Session, sealed};
use crate::dialect::layout::Layout;
use crate::dialect::{self, Backend, Dialect, Sql, marker};
use crate::io::Io;
use crate::spec::HandlerSpec;
#[cfg(feature = "async")]
use {super::AsyncInboxConnection, diesel_async::AsyncPgConnection};

impl dialect::BindId for diesel::pg::Pg {
    type IdSql = diesel::sql_types::Uuid;
    type IdRow = Uuid;

    fn bind_id<'b>(out: &mut AstPass<'_, 'b, Self>, id: &'b Uuid) -> QueryResult<()> {
        out.push_bind_param::<diesel::sql_types::Uuid, Uuid>(id)
    }

    fn id_of(row: Uuid) -> Option<Uuid> {
        Some(row)
    }
}

impl Dialect for diesel::pg::Pg {
    const NOW: &'static str = "CURRENT_TIMESTAMP";
    const ON_CONFLICT: &'static str = marker::ON_CONFLICT_RETURNING;
    const CLAIM_ON_CONFLICT: &'static str = marker::ON_CONFLICT_DO_NOTHING;
    const LEASE_NOW: &'static str = "CURRENT_TIMESTAMP";
    const LEASE_UNTIL: (&'static str, &'static str) =
        ("CURRENT_TIMESTAMP + ", " * INTERVAL '1 millisecond'");
    const LEASE_LEFT_MS: &'static str =
        "EXTRACT(EPOCH FROM claimed_until - CURRENT_TIMESTAMP) * 1000";
    const BIGINT: &'static str = "BIGINT";
    /// Outside the handler's transaction
    /// ([`HandlerSpec::POSTGRES_NONE_OPEN`](crate::spec::HandlerSpec::POSTGRES_NONE_OPEN)).
    const OPEN_TRANSACTION_PROBE: Option<&'static str> =
        Some(crate::spec::HandlerSpec::POSTGRES_NONE_OPEN);

    const BACKEND: Backend = Backend::Postgres;

    fn store_result(table: &str, fingerprint: bool, fenced: bool) -> String {
        // $1 the result, then the fingerprint if any, then the key and the attempt.
        let (fingerprint, next) = match fingerprint {
            true => (", fingerprint = $2", 3),
            false => ("", 2),
        };
        let fence = match fenced {
            true => format!(" AND attempts = ${} AND processed_at IS NULL", next + 2),
            false => String::new(),
        };
        format!(
            "UPDATE {table} SET result = CAST($1 AS jsonb){fingerprint} \
             WHERE message_id = CAST(${next} AS uuid) AND consumer = ${}{fence}",
            next + 1
        )
    }

    fn read_marker(table: &str, result: bool, fingerprint: bool) -> String {
        let result = if result {
            "CAST(result AS text)"
        } else {
            "CAST(NULL AS text)"
        };
        let fingerprint = if fingerprint {
            "fingerprint"
        } else {
            "CAST(NULL AS bytea)"
        };
        format!(
            "SELECT {result} AS result, {fingerprint} AS fingerprint FROM {table} \
             WHERE message_id = CAST($1 AS uuid) AND consumer = $2"
        )
    }

    fn store_fingerprint(table: &str) -> String {
        format!(
            "UPDATE {table} SET fingerprint = $1 \
             WHERE message_id = CAST($2 AS uuid) AND consumer = $3"
        )
    }

    fn bind_message_id(sql: Sql, id: &Uuid) -> Sql {
        sql.bind_text(id.to_string())
    }

    /// `= ANY(ARRAY(…))` rather than `IN (…)`: the planner then takes the batch's ids from the
    /// `processed_at` index first instead of joining against the whole table.
    fn delete_batch(table: &str) -> String {
        format!(
            "DELETE FROM {table} WHERE id = ANY(ARRAY(SELECT id FROM {table} \
             WHERE processed_at < CURRENT_TIMESTAMP - ($1::bigint * interval '1 second') \
             ORDER BY processed_at LIMIT $2))"
        )
    }

    fn count_stale(table: &str) -> String {
        format!(
            "SELECT count(*) AS n FROM {table} WHERE processed_at IS NULL \
             AND received_at < CURRENT_TIMESTAMP - ($1::bigint * interval '1 second')"
        )
    }

    /// `uuid_send`: the id as its 16 bytes, as the other backends store it.
    fn list_stale(table: &str) -> String {
        format!(
            "SELECT uuid_send(message_id) AS message_id, consumer, attempts::int8 AS attempts \
             FROM {table} WHERE processed_at IS NULL \
             AND received_at < CURRENT_TIMESTAMP - ($1::bigint * interval '1 second') ORDER BY id LIMIT $2"
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
             WHERE processed_at < CURRENT_TIMESTAMP - ($1::bigint * interval '1 second') \
             ORDER BY processed_at LIMIT $2)) RETURNING 1) \
             SELECT CASE WHEN (SELECT ok FROM lock) THEN 1 ELSE 0 END::int8 AS locked, \
             (SELECT count(*) FROM deleted)::int8 AS n"
        ))
    }
}

/// The handler's transaction on PostgreSQL, for both IO models.
impl Session for Pg {
    async fn begin<I: Io<Backend = Self>>(
        io: &mut I,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> QueryResult<()> {
        io.begin_sql(&marker::postgres_begin(spec, layout)).await
    }

    /// `BEGIN` and the marker's insert in one round trip ([`PgMarker`](marker::PgMarker));
    /// the first time on a session, the insert is prepared there first.
    async fn begin_with_claim<I: Io<Backend = Self>>(
        io: &mut I,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
    ) -> Option<QueryResult<bool>> {
        if !super::none_open(io.transaction_status()) {
            return None;
        }
        let marker = marker::PgMarker::new(&spec.schema, layout);
        let sql = marker.begin(spec, key);
        let mut begun = io.begin_sql(&sql).await;
        if let Err(e) = &begun
            && marker.missing(e)
        {
            begun = io.begin_sql(&marker.prepared_and(&sql)).await;
        }
        Some(super::claimed(begun, &spec.schema, io.transaction_status()))
    }

    /// After a duplicate or a failed claim the transaction is aborted, and it is rolled
    /// back with its `SET LOCAL`.
    async fn wait_for_locks<I: Io<Backend = Self>>(
        io: &mut I,
        _spec: &'static HandlerSpec,
        claimed: bool,
    ) -> QueryResult<()> {
        match claimed {
            true => io.batch(HandlerSpec::POSTGRES_LOCK_WAIT).await,
            false => Ok(()),
        }
    }

    /// Whether the transaction open is no longer the one the handler began
    /// ([`HandlerSpec::POSTGRES_STILL_OURS`]): PostgreSQL ends none by itself but with the
    /// session. An aborted transaction (25P02) is still the handler's.
    async fn ended_in_body<I: Io<Backend = Self>>(io: &mut I) -> bool {
        match io.batch(HandlerSpec::POSTGRES_STILL_OURS).await {
            Ok(()) => false,
            Err(e) => dialect::ended_in_body(&e),
        }
    }

    /// READ COMMITTED, so that each statement sees what committed before it.
    async fn begin_write<I: Io<Backend = Self>>(io: &mut I) -> QueryResult<()> {
        io.begin_sql("BEGIN ISOLATION LEVEL READ COMMITTED").await
    }

    /// PostgreSQL answers `COMMIT` in an aborted transaction with a silent `ROLLBACK`, so
    /// diesel would report success for work that was thrown away — and with a warning only
    /// where the body's own `ROLLBACK` or `COMMIT` ended the transaction. The check sent in
    /// the same round trip ([`HandlerSpec::POSTGRES_STILL_OURS`]) fails in either case
    /// (25P02 in the first), and the `COMMIT` after it is then never run. The transaction
    /// manager, which did not send the `COMMIT`, is told the transaction ended once the
    /// server answered; until then it counts the transaction open, so a commit dropped
    /// half-way leaves a connection that a pool discards.
    ///
    /// A manager in error refuses the commit before anything is sent. One that counts no
    /// transaction open does not: a sync `PgConnection` reads the session's state after
    /// each statement, and counts none after a body's own `ROLLBACK` or `COMMIT` — which
    /// the check then reports as the transaction the body ended.
    async fn commit<I: Io<Backend = Self>>(
        io: &mut I,
        _: &'static HandlerSpec,
        _: bool,
    ) -> QueryResult<()> {
        super::open(io.transaction_status())?;
        io.batch(HandlerSpec::POSTGRES_COMMIT_IF_OURS).await?;
        super::ended(io.transaction_status())
    }
}

impl InboxConnection for PgConnection {}

impl sealed::Connection for PgConnection {}

#[cfg(feature = "async")]
impl AsyncInboxConnection for AsyncPgConnection {}

#[cfg(feature = "async")]
impl crate::io::BeginWithSql for AsyncPgConnection {
    async fn begin_sql(&mut self, sql: &str) -> QueryResult<()> {
        diesel_async::AnsiTransactionManager::begin_transaction_sql(self, sql).await
    }
}

#[cfg(feature = "async")]
impl sealed::AsyncConnection for AsyncPgConnection {
    fn statement_cancel(&self) -> Option<super::StatementCancel> {
        Some(super::StatementCancel::Postgres(self.cancel_token()))
    }
}
