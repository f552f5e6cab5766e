//! Postgres: what the runtime writes differently for it.

use diesel::query_builder::AstPass;

use diesel::QueryResult;

use uuid::Uuid;

use crate::dialect::{self, Backend, Dialect, Sql, marker};

impl dialect::BindId for diesel::pg::Pg {
    fn bind_id<'b>(out: &mut AstPass<'_, 'b, Self>, id: &'b Uuid) -> QueryResult<()> {
        out.push_bind_param::<diesel::sql_types::Uuid, Uuid>(id)
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

/// The sync connection.
mod sync {
    use diesel::connection::AnsiTransactionManager;
    use diesel::{QueryResult, RunQueryDsl};
    use inbox_core::{InboxSchema, MessageKey};
    use uuid::Uuid;

    use crate::backends::{InboxConnection, sealed};
    use crate::dialect::layout::Layout;
    use crate::dialect::marker::ClaimMarkers;
    use crate::dialect::marker::claim_returning;
    use crate::spec::HandlerSpec;

    use diesel::connection::SimpleConnection;
    use diesel::pg::{Pg, PgConnection};

    impl InboxConnection for PgConnection {}

    impl sealed::Connection for PgConnection {
        fn begin_inbox_transaction(
            &mut self,
            spec: &HandlerSpec,
            layout: Layout,
        ) -> QueryResult<()> {
            AnsiTransactionManager::begin_transaction_sql(
                self,
                &crate::dialect::marker::postgres_begin(spec, layout),
            )
        }

        /// `BEGIN` and the marker's insert in one round trip
        /// ([`PgMarker`](crate::dialect::marker::PgMarker)); the first time on a session, the
        /// insert is prepared there first.
        fn begin_with_claim(
            &mut self,
            spec: &HandlerSpec,
            key: &MessageKey,
            layout: Layout,
        ) -> Option<QueryResult<bool>> {
            use diesel::connection::TransactionManager;
            if !crate::backends::none_open(AnsiTransactionManager::transaction_manager_status_mut(
                self,
            )) {
                return None;
            }
            let marker = crate::dialect::marker::PgMarker::new(&spec.schema, layout);
            let sql = marker.begin(spec, key);
            let mut begun = AnsiTransactionManager::begin_transaction_sql(self, &sql);
            if let Err(e) = &begun
                && marker.missing(e)
            {
                begun =
                    AnsiTransactionManager::begin_transaction_sql(self, &marker.prepared_and(&sql));
            }
            Some(crate::backends::claimed(
                begun,
                &spec.schema,
                AnsiTransactionManager::transaction_manager_status_mut(self),
            ))
        }

        /// After a duplicate or a failed claim the transaction is aborted, and it is rolled
        /// back with its `SET LOCAL`.
        fn wait_for_locks(&mut self, _spec: &HandlerSpec, claimed: bool) -> QueryResult<()> {
            match claimed {
                true => self.batch_execute(HandlerSpec::POSTGRES_LOCK_WAIT),
                false => Ok(()),
            }
        }

        fn begin_write_transaction(&mut self) -> QueryResult<()> {
            AnsiTransactionManager::begin_transaction_sql(
                self,
                "BEGIN ISOLATION LEVEL READ COMMITTED",
            )
        }

        fn claim_marker(
            &mut self,
            schema: &InboxSchema,
            consumer: &str,
            key: &MessageKey,
            layout: Layout,
        ) -> QueryResult<bool> {
            claim_returning(self, schema, consumer, key, layout)
        }

        fn claim_markers(
            &mut self,
            schema: &InboxSchema,
            consumer: &str,
            ids: &[Uuid],
            texts: Option<&[String]>,
            layout: Layout,
        ) -> QueryResult<Vec<Uuid>> {
            ClaimMarkers::<Pg, diesel::sql_types::Uuid>::new(
                schema,
                consumer,
                ids,
                texts,
                layout.mark(),
            )
            .load(self)
        }

        /// PostgreSQL answers `COMMIT` in an aborted transaction with a silent `ROLLBACK`, so
        /// diesel would report success for work that was thrown away — and with a warning
        /// only where the body's own `ROLLBACK` or `COMMIT` ended the transaction. The check
        /// sent in the same round trip ([`HandlerSpec::POSTGRES_STILL_OURS`]) fails in
        /// either case (25P02 in the first), and the `COMMIT` after it is then never run.
        fn commit_inbox_transaction(&mut self, _: &HandlerSpec, _: bool) -> QueryResult<()> {
            self.batch_execute(HandlerSpec::POSTGRES_COMMIT_IF_OURS)
        }
    }
}

/// The diesel-async connection.
#[cfg(feature = "async")]
mod asynchronous {
    use diesel::QueryResult;
    use inbox_core::MessageKey;

    use crate::backends::{AsyncInboxConnection, sealed};
    use crate::dialect::layout::Layout;
    use crate::spec::HandlerSpec;

    use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

    use diesel::pg::Pg;
    use diesel_async::{AnsiTransactionManager, TransactionManager};

    use crate::dialect::marker::ClaimMarker;

    impl AsyncInboxConnection for AsyncPgConnection {}

    impl sealed::AsyncConnection for AsyncPgConnection {
        fn statement_cancel(&self) -> Option<crate::backends::StatementCancel> {
            Some(crate::backends::StatementCancel::Postgres(
                self.cancel_token(),
            ))
        }

        /// READ COMMITTED, so that each statement sees what committed before it.
        async fn begin_write_transaction(&mut self) -> QueryResult<()> {
            AnsiTransactionManager::begin_transaction_sql(
                self,
                "BEGIN ISOLATION LEVEL READ COMMITTED",
            )
            .await
        }

        async fn begin_inbox_transaction(
            &mut self,
            spec: &'static HandlerSpec,
            layout: Layout,
        ) -> QueryResult<()> {
            let sql = crate::dialect::marker::postgres_begin(spec, layout);
            AnsiTransactionManager::begin_transaction_sql(self, &sql).await
        }

        /// `BEGIN` and the marker's insert in one round trip, as on the sync connection.
        async fn begin_with_claim(
            &mut self,
            spec: &'static HandlerSpec,
            key: &MessageKey,
            layout: Layout,
        ) -> Option<QueryResult<bool>> {
            if !crate::backends::none_open(AnsiTransactionManager::transaction_manager_status_mut(
                self,
            )) {
                return None;
            }
            let marker = crate::dialect::marker::PgMarker::new(&spec.schema, layout);
            let sql = marker.begin(spec, key);
            let mut begun = AnsiTransactionManager::begin_transaction_sql(self, &sql).await;
            if let Err(e) = &begun
                && marker.missing(e)
            {
                begun =
                    AnsiTransactionManager::begin_transaction_sql(self, &marker.prepared_and(&sql))
                        .await;
            }
            Some(crate::backends::claimed(
                begun,
                &spec.schema,
                AnsiTransactionManager::transaction_manager_status_mut(self),
            ))
        }

        async fn wait_for_locks(
            &mut self,
            _spec: &'static HandlerSpec,
            claimed: bool,
        ) -> QueryResult<()> {
            match claimed {
                true => self.batch_execute(HandlerSpec::POSTGRES_LOCK_WAIT).await,
                false => Ok(()),
            }
        }

        async fn claim_marker(
            &mut self,
            spec: &'static HandlerSpec,
            key: &MessageKey,
            layout: Layout,
        ) -> QueryResult<bool> {
            let id = key.stored_id();
            let text = layout
                .key_text
                .then(|| crate::dialect::layout::key_text(key));
            let claim = ClaimMarker::<Pg>::new(
                &spec.schema,
                spec.consumer.as_str(),
                &id,
                text.as_deref(),
                None,
            );
            let rows: Vec<i64> = RunQueryDsl::load(claim, self).await?;
            Ok(!rows.is_empty())
        }

        async fn claim_markers(
            &mut self,
            spec: &'static HandlerSpec,
            ids: &[uuid::Uuid],
            texts: Option<&[String]>,
            layout: Layout,
        ) -> QueryResult<Vec<uuid::Uuid>> {
            let claim = crate::dialect::marker::ClaimMarkers::<Pg, diesel::sql_types::Uuid>::new(
                &spec.schema,
                spec.consumer.as_str(),
                ids,
                texts,
                layout.mark(),
            );
            RunQueryDsl::load(claim, self).await
        }

        /// PostgreSQL answers `COMMIT` in an aborted transaction with a silent `ROLLBACK`. As
        /// on the sync connection, `SELECT 1` goes in the same round trip as `COMMIT` and fails
        /// with 25P02 in exactly that case, and the `COMMIT` after it is then never run. The
        /// transaction manager, which did not send the `COMMIT`, is told the transaction ended
        /// once the server answered; until then it counts the transaction open, so a commit
        /// dropped half-way leaves a connection that a pool discards.
        async fn commit_inbox_transaction(
            &mut self,
            _: &'static HandlerSpec,
            _: bool,
        ) -> QueryResult<()> {
            if !crate::backends::open(AnsiTransactionManager::transaction_manager_status_mut(self))?
            {
                return Err(diesel::result::Error::NotInTransaction);
            }
            SimpleAsyncConnection::batch_execute(self, HandlerSpec::POSTGRES_COMMIT_IF_OURS)
                .await?;
            crate::backends::ended(AnsiTransactionManager::transaction_manager_status_mut(self))
        }
    }
}
