//! Postgres: what the runtime writes differently for it.

use diesel::query_builder::AstPass;

use diesel::QueryResult;
use std::borrow::Cow;

use uuid::Uuid;

use diesel::pg::{Pg, PgConnection};
use inbox_core::MessageKey;

use super::{InboxConnection, Session, sealed};
use crate::dialect::catalog::{self, Catalogs};
use crate::dialect::layout::DatabaseMark;
use crate::dialect::layout::Layout;
use crate::dialect::marker::{Keeps, MarkerValues};
use crate::dialect::{self, Backend, Dialect, Sql, marker};
use crate::error::schema::{SchemaError, SchemaProblem};
use crate::io::Io;
use crate::spec::HandlerSpec;
use inbox_core::InboxSchema;

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
    const NOTIFIES: bool = true;

    fn outbox_insert_sql(table: &str, notify: bool) -> String {
        match notify {
            // The notification in the same statement: no round trip of its own.
            true => format!(
                "WITH appended AS (INSERT INTO {table} (id, destination, ordering_key, headers, \
                 payload) VALUES (CAST($1 AS uuid), $2, $3, $4, $5) RETURNING seq) \
                 SELECT pg_notify($6, '') FROM appended"
            ),
            false => format!(
                "INSERT INTO {table} (id, destination, ordering_key, headers, payload) \
                 VALUES (CAST($1 AS uuid), $2, $3, $4, $5)"
            ),
        }
    }

    const SKIP_LOCKED: &'static str = " FOR UPDATE OF o SKIP LOCKED";
    const UPDATES_FROM_OWN_SUBQUERY: bool = true;
    const SINGLE_WRITER: bool = false;

    /// The outbox's id is a `UUID`.
    fn outbox_id_text(column: &str) -> String {
        format!("CAST({column} AS text)")
    }

    /// `clock_timestamp()`, not the statement's start: a claim taking seconds does not hand
    /// out rows whose lease has already run.
    const LEASE_PER_ROW: (&'static str, &'static str) =
        ("clock_timestamp() + ", " * INTERVAL '1 millisecond'");

    const CONFLICTS: dialect::keys::Conflicts = dialect::keys::Conflicts::OnConflict;

    /// `pg_advisory_xact_lock`, held until the transaction ends; 2 when the transaction's
    /// snapshot was taken before the lock was granted (above READ COMMITTED).
    fn lock_key(key: &str) -> Option<Sql> {
        Some(
            Sql::new(
                "SELECT (CASE current_setting('transaction_isolation') \
                 WHEN 'read committed' THEN 1 ELSE 2 END)::BIGINT AS n \
                 FROM (SELECT pg_advisory_xact_lock($1)) AS locked",
            )
            .bind_i64(dialect::keys::lock_hash(key)),
        )
    }

    const ABORTED_PROBE: Option<&'static str> = Some("SELECT CAST(1 AS BIGINT) AS n");

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

    /// The session's `idle_session_timeout` (PostgreSQL 14+; a role's or an operator's
    /// setting) raised to `kept_ms` where it is shorter: a server that ended the session
    /// while the side effect ran would leave the effect unrecorded — its stamp failing on a
    /// closed connection (`EffectNotRecorded`) — and, once the lease ended, taken over and
    /// run again. Nothing where it is off or long enough, or on a server without the setting.
    fn keep_session(kept_ms: u64) -> Option<String> {
        Some(format!(
            "SELECT set_config('idle_session_timeout', '{kept_ms}', false) FROM pg_settings \
             WHERE name = 'idle_session_timeout' AND setting::bigint BETWEEN 1 AND {}",
            kept_ms - 1
        ))
    }

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

/// PostgreSQL: the table's oid, resolved as the runtime's statements resolve its name. Binds
/// `$1` (qualifier, `''` when none) and `$2` (name).
const PG_REL: &str = "to_regclass(CASE WHEN $1 = '' THEN quote_ident($2) \
     ELSE quote_ident($1) || '.' || quote_ident($2) END)";

impl Catalogs for Pg {
    fn catalog_sql() -> (String, String) {
        (
            format!(
                "SELECT a.attname::text AS name, \
                 replace(format_type(a.atttypid, a.atttypmod), '\"', '') AS type_name, \
                 CASE WHEN a.attnotnull THEN 0 ELSE 1 END::int8 AS nullable \
                 FROM pg_attribute a WHERE a.attrelid = {PG_REL} \
                 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"
            ),
            // Key columns only (not `INCLUDE`d ones); an expression is named `(expression)`,
            // so that an index on (message_id, consumer, lower(x)) is not taken for the key.
            format!(
                "SELECT CASE WHEN i.indisunique THEN 1 ELSE 0 END::int8 AS is_unique, \
                 COALESCE(a.attname::text, '(expression)') AS name FROM pg_index i \
                 JOIN pg_class c ON c.oid = i.indexrelid \
                 CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
                 LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                 AND k.attnum > 0 \
                 WHERE i.indrelid = {PG_REL} AND c.relname = $3 AND k.ord <= i.indnkeyatts \
                 ORDER BY k.ord"
            ),
        )
    }

    fn facts_sql(_qualifier: &str, needs: &[(&str, &str)]) -> String {
        let privileges = needs
            .iter()
            .map(|(privilege, column)| format!("('{privilege}', '{column}')"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "WITH t AS (SELECT {PG_REL} AS rel), \
             ix AS (SELECT i.* FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
                    JOIN t ON i.indrelid = t.rel WHERE c.relname = $3), \
             parts AS (SELECT t.rel AS relid FROM t WHERE t.rel IS NOT NULL \
                       UNION SELECT p.relid FROM t, pg_partition_tree(t.rel) AS p) \
             SELECT 'table' AS kind, n.nspname::text || '.' || c.relname::text AS detail \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             JOIN t ON c.oid = t.rel \
             UNION ALL SELECT 'oids', d.oid::text || ' ' || t.rel::oid::text \
             FROM pg_database d JOIN t ON t.rel IS NOT NULL \
             WHERE d.datname = current_database() \
             UNION ALL SELECT 'persistence', c.relpersistence::text FROM pg_class c \
             JOIN parts ON c.oid = parts.relid WHERE c.relpersistence <> 'p' \
             UNION ALL SELECT 'relkind', c.relkind::text FROM pg_class c \
             JOIN parts ON c.oid = parts.relid WHERE c.relkind NOT IN ('r', 'p') \
             UNION ALL SELECT 'trigger', tg.tgname::text || ' ON ' || \
             tg.tgrelid::regclass::text FROM pg_trigger tg \
             JOIN parts ON tg.tgrelid = parts.relid WHERE NOT tg.tgisinternal \
             UNION ALL SELECT 'row security', c.oid::regclass::text FROM pg_class c \
             JOIN parts ON c.oid = parts.relid WHERE c.relrowsecurity \
             AND (c.relforcerowsecurity OR c.relowner <> (SELECT oid FROM pg_roles \
             WHERE rolname = current_user)) AND NOT (SELECT rolsuper OR rolbypassrls \
             FROM pg_roles WHERE rolname = current_user) \
             UNION ALL SELECT 'rule', r.rulename::text FROM pg_rewrite r \
             JOIN parts ON r.ev_class = parts.relid WHERE r.rulename <> '_RETURN' \
             UNION ALL SELECT 'child', h.inhrelid::regclass::text FROM pg_inherits h \
             JOIN pg_class k ON k.oid = h.inhrelid JOIN parts ON h.inhparent = parts.relid \
             WHERE NOT k.relispartition \
             UNION ALL SELECT 'other unique', c.relname::text || ' (' || \
             string_agg(COALESCE(a.attname::text, '(expression)'), ', ' ORDER BY k.ord) || ')' \
             FROM pg_index i JOIN t ON i.indrelid = t.rel \
             JOIN pg_class c ON c.oid = i.indexrelid \
             CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
             LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             AND k.attnum > 0 \
             WHERE (i.indisunique OR i.indisexclusion) AND c.relname <> $3 \
             AND k.ord <= i.indnkeyatts GROUP BY c.relname \
             UNION ALL SELECT 'index collation', co.collname::text FROM ix \
             CROSS JOIN LATERAL unnest(ix.indcollation::oid[]) AS ic(oid) \
             JOIN pg_collation co ON co.oid = ic.oid WHERE NOT co.collisdeterministic \
             UNION ALL SELECT 'synchronous_commit', current_setting('synchronous_commit') \
             WHERE current_setting('synchronous_commit') = 'off' \
             UNION ALL SELECT 'read only', source FROM pg_settings \
             WHERE name = 'default_transaction_read_only' AND setting = 'on' \
             AND source IN ('user', 'database user') \
             AND NOT pg_is_in_recovery() \
             UNION ALL SELECT 'exit_on_error', current_setting('exit_on_error') \
             WHERE current_setting('exit_on_error') = 'on' \
             UNION ALL SELECT DISTINCT 'unidentified', c.oid::regclass::text \
             FROM pg_class c JOIN parts ON c.oid = parts.relid \
             JOIN pg_namespace pn ON pn.oid = c.relnamespace \
             JOIN pg_publication_tables pt ON pt.schemaname = pn.nspname \
             AND pt.tablename = c.relname \
             JOIN pg_publication pb ON pb.pubname = pt.pubname AND (pb.pubupdate OR pb.pubdelete) \
             WHERE c.relkind = 'r' AND (c.relreplident = 'n' OR (c.relreplident = 'd' \
             AND NOT EXISTS (SELECT 1 FROM pg_index pk WHERE pk.indrelid = c.oid AND pk.indisprimary))) \
             UNION ALL SELECT 'index invalid', 'invalid' FROM ix \
             WHERE NOT (ix.indisvalid AND ix.indisready AND ix.indislive) \
             UNION ALL SELECT 'index partial', pg_get_expr(ix.indpred, ix.indrelid) FROM ix \
             WHERE ix.indpred IS NOT NULL \
             UNION ALL SELECT 'index deferrable', co.conname::text FROM pg_constraint co \
             JOIN ix ON co.conindid = ix.indexrelid AND co.conrelid = ix.indrelid \
             WHERE co.condeferrable \
             UNION ALL SELECT 'collation', co.collname::text FROM pg_attribute a \
             JOIN pg_collation co ON co.oid = a.attcollation JOIN t ON a.attrelid = t.rel \
             WHERE a.attname = 'consumer' AND NOT co.collisdeterministic \
             UNION ALL SELECT 'encoding', pg_encoding_to_char(d.encoding)::text \
             FROM pg_database d WHERE d.datname = current_database() \
             AND d.encoding <> pg_char_to_encoding('UTF8') \
             UNION ALL SELECT 'same name', n.nspname::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE $1 = '' AND c.relname = $2 AND c.relkind IN ('r', 'p', 'v', 'm', 'f') \
             AND n.nspname NOT LIKE 'pg\\_temp\\_%' \
             AND has_schema_privilege(n.oid, 'USAGE') \
             UNION ALL SELECT 'privilege', p.privilege || ' on ' || p.col \
             FROM (VALUES {privileges}) AS p(privilege, col) JOIN t ON true \
             JOIN pg_attribute a ON a.attrelid = t.rel AND a.attname = p.col \
             AND NOT a.attisdropped \
             WHERE NOT has_column_privilege(t.rel, a.attnum, p.privilege)"
        )
    }

    fn accepts(column: &str) -> &'static [&'static str] {
        match column {
            "id" => &["bigint"],
            "message_id" => &["uuid"],
            "consumer" | "key_text" => &["text", "character varying"],
            "received_at" | "processed_at" | "claimed_until" => {
                &["timestamp with time zone", "timestamp("]
            }
            "attempts" => &["integer", "bigint"],
            "result" => &["jsonb", "json", "text"],
            "fingerprint" => &["bytea"],
            _ => &[],
        }
    }

    fn holds(column: &str, type_name: &str) -> bool {
        match column {
            "received_at" | "processed_at" | "claimed_until" => {
                type_name.contains("with time zone") && !type_name.contains("without")
            }
            "consumer" => catalog::bound(type_name).is_none_or(|n| n >= catalog::CONSUMER_CHARS),
            "key_text" => catalog::bound(type_name).is_none(),
            _ => true,
        }
    }

    /// The name as the handler gives it, resolved by the session's `search_path` as the
    /// check resolved it: a session pointed at another schema since is checked there.
    fn mark(layout: &mut Layout, schema: &InboxSchema, _claim: bool, oids: Option<&str>) {
        layout.database_mark = oids.and_then(|fact| DatabaseMark::postgres(fact, schema.table()));
    }
}

/// The handler's transaction on PostgreSQL, for both IO models.
impl Session for Pg {
    fn begin_statement(spec: &'static HandlerSpec, layout: Layout) -> Cow<'static, str> {
        marker::postgres_begin(spec, layout)
    }

    /// `BEGIN` and the marker's insert in one round trip ([`PgMarker`](marker::PgMarker));
    /// for a deferred marker, `BEGIN`, the key's lock and the look for the marker.
    fn begin_with_marker_statement(
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
        keeps: Keeps,
    ) -> Option<String> {
        Some(marker::PgMarker::of(spec, layout, keeps).begin(spec, key))
    }

    /// The first time on a session, the insert (and a deferred marker's look) is prepared
    /// there first.
    fn begin_again_statement(
        spec: &'static HandlerSpec,
        layout: Layout,
        keeps: Keeps,
        begun: &str,
        error: &diesel::result::Error,
    ) -> Option<String> {
        let marker = marker::PgMarker::of(spec, layout, keeps);
        marker.missing(error).then(|| marker.prepared_and(begun))
    }

    /// At READ COMMITTED, where the look after the lock sees a marker that committed while
    /// the lock was waited for; and at the server's default, which is READ COMMITTED unless
    /// an operator changed it (not read here: on a server whose default is above it, the
    /// snapshot is taken before the lock is granted, and a concurrent duplicate runs its
    /// body only to be refused at the commit and rolled back — the README says so). A
    /// handler that asks for REPEATABLE READ or SERIALIZABLE inserts its marker first.
    fn defers_marker(spec: &'static HandlerSpec, keeps: Keeps) -> bool {
        keeps.any()
            && matches!(
                spec.isolation,
                inbox_core::Isolation::ServerDefault | inbox_core::Isolation::ReadCommitted
            )
    }

    fn commit_with_marker_statement(
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
        values: MarkerValues<'_>,
    ) -> Option<String> {
        let keeps = Keeps {
            result: values.result.is_some(),
            fingerprint: values.fingerprint.is_some(),
        };
        Some(marker::PgMarker::of(spec, layout, keeps).commit(spec, key, values))
    }

    /// After a duplicate or a failed claim the transaction is aborted, and it is rolled
    /// back with its `SET LOCAL`.
    fn lock_wait_statement(claimed: bool) -> Option<&'static str> {
        claimed.then_some(HandlerSpec::POSTGRES_LOCK_WAIT)
    }

    /// READ COMMITTED, so that each statement sees what committed before it.
    const BEGIN_WRITE: Option<&'static str> = Some("BEGIN ISOLATION LEVEL READ COMMITTED");

    /// Whether the transaction open is no longer the one the handler began
    /// ([`HandlerSpec::POSTGRES_STILL_OURS`]): PostgreSQL ends none by itself but with the
    /// session. An aborted transaction (25P02) is still the handler's.
    async fn ended_in_body<I: Io<Backend = Self>>(io: &mut I) -> bool {
        match io.batch(HandlerSpec::POSTGRES_STILL_OURS).await {
            Ok(()) => false,
            Err(e) => dialect::ended_in_body(&e),
        }
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
        crate::io::status::open(io.transaction_status())?;
        io.batch(HandlerSpec::POSTGRES_COMMIT_IF_OURS).await?;
        crate::io::status::ended(io.transaction_status())
    }

    /// PostgreSQL behind PgBouncer in statement mode (`pool_mode = statement`): it allows no
    /// transaction of more than one statement and closes the client at the first, with a
    /// `FATAL` neither driver hands on — every handler's transaction would fail as a lost
    /// connection, on every new connection too, and a pump would retry each message until the
    /// broker's delivery limit dead-letters it. [`verify`](crate::schema::verify) opens a
    /// transaction of its own and rolls it back: a session that answered the catalog's read a
    /// moment ago and is gone at that `BEGIN` is refused, naming the setting. Only outside any
    /// transaction (diesel's, or one opened as SQL); elsewhere nothing is sent.
    async fn refuse_statement_pooling<I: Io<Backend = Self>>(
        io: &mut I,
        schema: &InboxSchema,
    ) -> Result<(), SchemaError> {
        if !matches!(io.transaction_status().transaction_depth(), Ok(None)) {
            return Ok(());
        }
        // A transaction opened as SQL, which diesel does not count, is left alone, and asked
        // about without an error that would abort it: a savepoint is refused only outside any
        // transaction (25P01), where there is nothing to abort.
        if io.batch("SAVEPOINT inbox_probe").await.is_ok() {
            return io
                .batch("RELEASE SAVEPOINT inbox_probe")
                .await
                .map_err(SchemaError::Database);
        }
        match io.batch("BEGIN").await {
            Ok(()) => io.batch("ROLLBACK").await.map_err(SchemaError::Database),
            // Sync, a lost connection (libpq drops the `FATAL`); async, PgBouncer's words.
            Err(e)
                if matches!(
                    crate::classify(&e, schema),
                    inbox_core::ErrorClass::ConnectionLost | inbox_core::ErrorClass::ServerSetting
                ) =>
            {
                Err(SchemaError::Mismatch {
                    table: schema.table(),
                    resolved: None,
                    problems: vec![SchemaProblem::Unsupported {
                        found: "the session closed at a BEGIN of its own, right after it answered \
                                the catalog's read"
                            .into(),
                        why: "PgBouncer in statement mode (`pool_mode = statement`) allows no \
                              transaction and closes the client: every handler's transaction would \
                              fail as a lost connection, on every connection",
                        fix:
                            "set `pool_mode = transaction` (with diesel's statement cache off) or \
                              `session` for the consumers' database; if no pooler is there, the \
                              server went away at that moment: verify again"
                                .into(),
                    }],
                })
            }
            Err(e) => Err(SchemaError::Database(e)),
        }
    }

    /// Lifts a short `statement_timeout` for the check's reads ([`PG_TIGHT_TIMEOUT`]): whether
    /// it began the transaction that does, which the check then ends. Not inside a transaction
    /// diesel knows of (a handler that joins the caller's): the caller's transaction keeps its
    /// bound.
    async fn lift_statement_timeout<I: Io<Backend = Self>>(io: &mut I) -> bool {
        if !matches!(io.transaction_status().transaction_depth(), Ok(None)) {
            return false;
        }
        let tight = io
            .load::<ServerRow>(&Sql::new(PG_TIGHT_TIMEOUT))
            .await
            .is_ok_and(|rows| !rows.is_empty());
        if !tight {
            return false;
        }
        if io.batch(PG_LIFT_TIMEOUT).await.is_err() {
            // Its `BEGIN` may have opened the transaction its `SELECT` then failed in (timed
            // out under the very bound it lifts): ended here, or every read of the check after
            // it would fail as an aborted transaction's (25P02, an alert) instead of as itself.
            let _ = io.batch("ROLLBACK").await;
            return false;
        }
        io.load::<ServerRow>(&Sql::new(PG_LIFTED))
            .await
            .is_ok_and(|rows| rows.iter().any(|row| row.version == "lifted"))
    }

    /// Makes the server speak English on this session, before anything else of the check.
    ///
    /// The runtime decides what a failure means by its code (SQLSTATE, MySQL's error number)
    /// where the driver reports one — a unique violation, a serialization failure, a read-only
    /// transaction, a `NOT NULL` violation, a lost connection —, but diesel's error carries no
    /// code for the others (a deadlock, a lock or statement timeout, a cancelled statement, a
    /// missing table or privilege): for those the server's message is all there is, and the
    /// server writes it in the session's `lc_messages`. A server installed on a German system
    /// reports a deadlock as `Verklemmung (Deadlock) entdeckt`; read as English, that is an
    /// unknown error, dead-lettered instead of retried. So the session's messages are set to
    /// English (a session setting; the server's and other sessions' stay as they are), the same
    /// on every driver, sync and async.
    ///
    /// PostgreSQL lets only a superuser, or a role granted `SET` on the parameter (PostgreSQL
    /// 15+) (MySQL and MariaDB let every session): for any other role whose messages are in
    /// another language the check refuses, naming the two fixes (`ALTER ROLE … SET
    /// lc_messages = 'C'`, or the grant). A role that may not set it, on a server whose messages
    /// are English anyway (built without translations), passes: its refusal came in English.
    ///
    /// `in_transaction`: the check's reads run in a transaction of their own
    /// ([`lift_statement_timeout`](Session::lift_statement_timeout)), which a refusal here must not leave aborted: the attempt
    /// runs under a savepoint.
    async fn english_messages<I: Io<Backend = Self>>(
        io: &mut I,
        schema: &InboxSchema,
        in_transaction: bool,
    ) -> Result<bool, SchemaError> {
        if in_transaction {
            io.batch("SAVEPOINT inbox_english")
                .await
                .map_err(SchemaError::Database)?;
        }
        let refused = match io.execute(&Sql::new(PG_ENGLISH)).await {
            // PostgreSQL: the row `set_config` returned, where it changed the setting.
            Ok(rows) => return Ok(rows > 0),
            Err(refused) => refused,
        };
        if in_transaction {
            io.batch("ROLLBACK TO SAVEPOINT inbox_english")
                .await
                .map_err(SchemaError::Database)?;
        }
        let english = crate::classify::with_server_error(&refused, |server| {
            server
                .message
                .starts_with("permission denied to set parameter")
        });
        // Refused in English: the messages are English already (a server without
        // translations). An error the runtime reads otherwise (a lost connection, a statement a
        // pooler lost) is that error; only one it cannot read is the refusal in another language.
        let unread = crate::classify::class_of(&refused, schema) == inbox_core::ErrorClass::Other;
        match english {
            Some(true) => return Ok(false),
            Some(false) if unread => {}
            _ => return Err(SchemaError::Database(refused)),
        }
        // Unread, it may be another failure in the session's language — a statement timeout, a
        // session ended — of a role that may set the parameter: that failure, not a refusal
        // (whose advice would be wrong, and an alert).
        if may_set_messages(io).await {
            return Err(SchemaError::Database(refused));
        }
        let setting = read_setting(io, PG_MESSAGES).await?;
        Err(SchemaError::Session {
            table: schema.table(),
            problem: SchemaProblem::Unsupported {
                found: format!(
                    "the session's server messages are in `lc_messages = '{setting}'`, which its \
                     role may not change"
                ),
                why: "the runtime reads deadlocks, timeouts and cancellations from the server's \
                      English messages (diesel reports no SQLSTATE for them): in another language \
                      they would be dead-lettered instead of retried",
                fix: "give the role English messages as a superuser: `ALTER ROLE <role> SET \
                      lc_messages = 'C'` (or `ALTER DATABASE <database> SET lc_messages = 'C'`), \
                      or let it set them itself: `GRANT SET ON PARAMETER lc_messages TO <role>` \
                      (PostgreSQL 15+; transaction mode only: claim mode needs the role's \
                      default)"
                    .into(),
            },
        })
    }

    /// PostgreSQL, claim mode: refused where a new session of the role speaks another language.
    ///
    /// The startup check sets its own session's messages to English, and each handler
    /// transaction sets them again for itself (`SET LOCAL`). Claim mode's statements run outside
    /// any transaction, each on whichever server session a transaction-mode pooler has free:
    /// one the check never ran on, or one reset since (`DISCARD ALL`), where the role's default
    /// holds. There a wait before the statement runs — for a migration's lock on the table — or
    /// a prepared statement the reset dropped fails in that language, read as an unknown error:
    /// a schema fault, an alert that halts a pump (an operator's trial: a Japanese server behind
    /// PgBouncer, three in three). Each claim statement sets English for its server session
    /// before it waits for a row, but not before the statement starts. The role's own default,
    /// `ALTER ROLE … SET lc_messages = 'C'`, holds on every session from its first statement.
    async fn refuse_default_messages_for_claims<I: Io<Backend = Self>>(
        io: &mut I,
        schema: &InboxSchema,
    ) -> Result<(), SchemaError> {
        let default = read_setting(io, PG_DEFAULT_MESSAGES).await?;
        if default == "english" {
            return Ok(());
        }
        Err(SchemaError::Session {
            table: schema.table(),
            problem: SchemaProblem::Unsupported {
                found: format!(
                    "claim mode, for a role whose sessions start with their server messages in \
                     `lc_messages = '{default}'`"
                ),
                why: "claim mode's statements run outside any transaction, each on whichever \
                      server session a transaction-mode pooler has free, where the role's default \
                      language holds: a wait for a migration's table lock or a prepared statement \
                      the pooler's reset dropped would fail in that language, read as an unknown \
                      error — a schema fault, an alert",
                fix: "give the role English messages by default: `ALTER ROLE <role> SET \
                      lc_messages = 'C'` (or `ALTER DATABASE <database> SET lc_messages = 'C'`), \
                      which sessions take when they start — a pooler's server sessions open \
                      before it keep their language until they are opened again (PgBouncer: \
                      `RECONNECT` on its console, or `server_lifetime`); the grant of `SET` on \
                      the parameter is not enough for claim mode"
                    .into(),
            },
        })
    }
}

// The startup check's session on PostgreSQL: what it sets and reads.

/// One text value a query of the server's settings reads, named `version`.
#[derive(Debug, diesel::QueryableByName)]
struct ServerRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    version: String,
}

/// PostgreSQL: a session's `statement_timeout` shorter than the check's catalog reads may
/// take (several milliseconds each, more on a loaded server, the first statements of a new
/// session most) — a role's `statement_timeout = '5ms'` timed the check out on every new
/// session, and every delivery failed as a transient timeout. A row where the session has
/// such a bound.
const PG_TIGHT_TIMEOUT: &str = "SELECT setting AS version FROM pg_settings \
     WHERE name = 'statement_timeout' AND setting::bigint BETWEEN 1 AND 29999";

/// The check's reads then run in a transaction of their own, with the bound lifted for it
/// alone (`SET LOCAL`: gone at its end, so nothing of the session changes, also where a
/// transaction-mode pooler hands each transaction another server session). Only where the
/// `BEGIN` opened it: in the simple protocol a statement in `BEGIN`'s message has its
/// timestamp ([`HandlerSpec::POSTGRES_NONE_OPEN`]); in a transaction the application opened
/// as SQL the `BEGIN` only warns, nothing is set, and the check reads as it did.
///
/// [`HandlerSpec::POSTGRES_NONE_OPEN`]: crate::spec::HandlerSpec::POSTGRES_NONE_OPEN
const PG_LIFT_TIMEOUT: &str = "BEGIN; SELECT set_config('statement_timeout', '30s', true), \
     set_config('inbox.check', 'lifted', true) \
     WHERE transaction_timestamp() = statement_timestamp()";

/// Whether [`PG_LIFT_TIMEOUT`] began the transaction it lifted the bound in.
const PG_LIFTED: &str = "SELECT coalesce(current_setting('inbox.check', true), '') AS version";

/// PostgreSQL: the session's messages in English where the setting names another language
/// (or none: an empty `lc_messages` takes the server's environment), now or after a `RESET`
/// (`reset_val`: the role's, the database's or the server's setting). A row where either
/// does: the handler's transactions then set English for themselves. Only a superuser, or
/// a role granted `SET` on the parameter, may; see [`Session::english_messages`]. Read from the reset
/// value as well, because a session can be English already without being so by default: the
/// marker's statement prepared on it set English before a check ran there
/// (`PgMarker::prepared_and`).
const PG_ENGLISH: &str = "SELECT set_config('lc_messages', 'C', false) FROM pg_settings \
     WHERE name = 'lc_messages' AND (reset_val !~ '^(C|POSIX|en)([._@]|$)' \
     OR current_setting('lc_messages') !~ '^(C|POSIX|en)([._@]|$)')";

/// PostgreSQL: `lc_messages` as a new session of the role starts with it (`reset_val`: the
/// role's, the database's or the server's setting), or `english` where that is English.
const PG_DEFAULT_MESSAGES: &str = "SELECT CASE WHEN reset_val ~ \
     '^(C|POSIX|en)([._@]|$)' THEN 'english' ELSE reset_val END AS version FROM pg_settings \
     WHERE name = 'lc_messages'";

/// The one value `sql` reads (as `version`), empty where it reads no row.
async fn read_setting<I: Io>(io: &mut I, sql: &'static str) -> Result<String, SchemaError> {
    Ok(io
        .load::<ServerRow>(&Sql::new(sql))
        .await
        .map_err(SchemaError::Database)?
        .into_iter()
        .next()
        .map(|row| row.version)
        .unwrap_or_default())
}

/// `lc_messages` as the session has it.
const PG_MESSAGES: &str = "SELECT current_setting('lc_messages') AS version";

/// Whether the session's role is a superuser, and the server's version number.
const PG_SUPERUSER: &str = "SELECT CASE WHEN rolsuper THEN 'superuser' \
     ELSE current_setting('server_version_num') END AS version \
     FROM pg_roles WHERE rolname = current_user";

/// PostgreSQL 15+: whether the session's role was granted `SET` on `lc_messages`.
const PG_MAY_SET_MESSAGES: &str = "SELECT CASE WHEN has_parameter_privilege('lc_messages', \
     'SET') THEN 'granted' ELSE '' END AS version";

/// PostgreSQL: whether the session's role may set `lc_messages` (a superuser, or a role
/// granted `SET` on it); `false` where that cannot be read either.
async fn may_set_messages<I: Io>(io: &mut I) -> bool {
    let read = |rows: QueryResult<Vec<ServerRow>>| {
        rows.ok()
            .and_then(|rows| rows.into_iter().next())
            .map(|row| row.version)
            .unwrap_or_default()
    };
    let role = read(io.load::<ServerRow>(&Sql::new(PG_SUPERUSER)).await);
    match role.as_str() {
        "superuser" => true,
        version if version.parse::<u32>().is_ok_and(|v| v >= 150_000) => {
            read(io.load::<ServerRow>(&Sql::new(PG_MAY_SET_MESSAGES)).await) == "granted"
        }
        _ => false,
    }
}

impl InboxConnection for PgConnection {}

impl sealed::Connection for PgConnection {}

#[cfg(feature = "async")]
async_server_connection!(
    diesel_async::AsyncPgConnection,
    super::StatementCancel::Postgres
);
