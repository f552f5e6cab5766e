//! Mysql: what the runtime writes differently for it.
//!
//! # A `COMMIT` alone
//!
//! Why a `COMMIT` on MySQL and MariaDB is the only statement of its round trip, while the
//! transaction's start shares one with the marker's insert.
//!
//! A Galera node may abort a local transaction at any moment: an applier's write set from
//! another node that conflicts with it wins (a brute-force abort), and a `COMMIT` that fails
//! certification rolls back. A client learns of either by the error of its next statement —
//! but within one multi-statement string the server does not always say so. Measured on a
//! two-node MariaDB 10.11 cluster (galera-4), one session committing a transaction that
//! updates a row the other node's sessions update too: of 11 000 single `COMMIT`s, every one
//! that answered success had committed; of 6 000 `SET …; COMMIT` strings, 13 answered
//! success for a transaction that had rolled back (the `SET`'s own answer already said "no
//! transaction open", and the `COMMIT` then ended none), and of 8 000 `COMMIT; SET …`
//! strings, 38. A message whose `COMMIT` answered so was acknowledged and lost.
//!
//! So the runtime's `COMMIT` travels alone on every MySQL and MariaDB server; on MariaDB
//! the check that the transaction is still the handler's, with a restore of the session's
//! settings, goes in a round trip of its own before it, and `autocommit` is put back in one
//! after it. A statement that runs before the transaction opens (`SET`, `START
//! TRANSACTION`), or inside it before it has written (`SAVEPOINT`), may share the round
//! trip of the one statement after it — the marker's insert, whose error a brute-force abort during it
//! still becomes (measured: 3 000 copies raced against another node's, none
//! answered success without its row) — since nothing before it holds a lock that another
//! node's write could take. `ROLLBACK` may share its round trip with a restore after it:
//! whatever it answers, nothing commits.

use diesel::QueryResult;
use std::borrow::Cow;

use uuid::Uuid;

use diesel::mysql::{Mysql, MysqlConnection};
use inbox_core::MessageKey;

use super::{InboxConnection, Session, sealed};
use crate::dialect::catalog::{self, Catalogs, FactRow};
use crate::dialect::layout::SessionMark;
use crate::dialect::layout::{self, Layout};
use crate::dialect::marker::{
    self, ClaimMarker, ClaimMarkers, claim_rows_then_each, inserted_unless_duplicate,
    marker_chunks, marker_fits,
};
use crate::dialect::{self, Backend, Dialect, Sql};
use crate::error::schema::{SchemaError, SchemaProblem};
use crate::io::Io;
use crate::spec::HandlerSpec;
use diesel::sql_types::{BigInt, Text};
use inbox_core::InboxSchema;

bind_id_as_bytes!(Mysql);

impl Dialect for diesel::mysql::Mysql {
    fn outbox_insert_sql(table: &str, _notify: bool) -> String {
        format!(
            "INSERT INTO {table} (id, destination, ordering_key, headers, payload, created_at) \
             VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6))"
        )
    }

    /// `DELETE … ORDER BY … LIMIT`: MySQL and MariaDB refuse the table in a subquery of its
    /// own `DELETE`.
    fn outbox_purge_sql(table: &str, batch: u32) -> String {
        let (before, after) = Self::LEASE_UNTIL;
        format!(
            "DELETE FROM {table} WHERE sent_at < {before}?{after} ORDER BY sent_at LIMIT {batch}"
        )
    }

    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const UPDATES_FROM_OWN_SUBQUERY: bool = false;
    const SINGLE_WRITER: bool = false;

    const CONFLICTS: dialect::keys::Conflicts = dialect::keys::Conflicts::OnDuplicateKey;

    /// `GET_LOCK`, waiting as long as a row lock would: 1 granted, 0 timed out, NULL an
    /// error (out of memory, a killed thread).
    fn lock_key(key: &str) -> Option<Sql> {
        Some(
            Sql::new("SELECT GET_LOCK(?, @@innodb_lock_wait_timeout) AS n")
                .bind_text(lock_name(key)),
        )
    }

    fn unlock_key(key: &str) -> Option<Sql> {
        Some(Sql::new("SELECT RELEASE_LOCK(?) AS n").bind_text(lock_name(key)))
    }

    /// UTC, whatever the session's `time_zone`: `DATETIME` stores what it is given, and
    /// instances whose pools set different time zones must agree on every lease and cutoff.
    const NOW: &'static str = "UTC_TIMESTAMP(6)";
    /// None: the plain insert fails with 1062 on a duplicate
    /// ([`inserted_unless_duplicate`](crate::dialect::marker::inserted_unless_duplicate)).
    const ON_CONFLICT: &'static str = "";
    const CLAIM_ON_CONFLICT: &'static str = "";
    const LEASE_NOW: &'static str = "UTC_TIMESTAMP(6)";
    const LEASE_UNTIL: (&'static str, &'static str) =
        ("UTC_TIMESTAMP(6) + INTERVAL (", " * 1000) MICROSECOND");
    const LEASE_LEFT_MS: &'static str =
        "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), claimed_until) DIV 1000";
    const BIGINT: &'static str = "SIGNED";
    /// MariaDB: the claim's insert requires `@@in_transaction = 0`
    /// (`Part::AutocommittedId`, in `dialect::claim`). MySQL has no such variable,
    /// and no statement that tells without a privilege: not checked there.
    const OPEN_TRANSACTION_PROBE: Option<&'static str> = None;

    /// The session's `wait_timeout` raised to `kept_ms` where it is shorter.
    fn keep_session(kept_ms: u64) -> Option<String> {
        Some(format!(
            "SET SESSION wait_timeout = GREATEST(@@SESSION.wait_timeout, {})",
            kept_ms.div_ceil(1000)
        ))
    }

    const LATEST_READ: &'static str = " LOCK IN SHARE MODE";

    /// A session set to read uncommitted rows for its next transaction only cannot be told
    /// from the variables: the read locks. Only on a session in autocommit: with
    /// `autocommit` off the read would begin a transaction that keeps the lock after a
    /// duplicate is answered; there the condition is false before any row is read, and the
    /// transaction decides.
    fn precheck_read(mariadb: bool, nowait: bool) -> Option<(&'static str, &'static str)> {
        // MariaDB before 11.1 has only `tx_isolation`; MySQL 8 only `transaction_isolation`.
        let head = match mariadb {
            true => {
                "SELECT CAST(CASE WHEN @@SESSION.tx_isolation = 'READ-UNCOMMITTED' \
                 THEN 4 WHEN processed_at IS NOT NULL THEN 0 "
            }
            false => {
                "SELECT CAST(CASE WHEN @@SESSION.transaction_isolation = 'READ-UNCOMMITTED' \
                 THEN 4 WHEN processed_at IS NOT NULL THEN 0 "
            }
        };
        let lock = match (nowait, mariadb) {
            (false, _) => " AND @@autocommit = 1 LOCK IN SHARE MODE",
            (true, true) => " AND @@autocommit = 1 LOCK IN SHARE MODE NOWAIT",
            (true, false) => " AND @@autocommit = 1 FOR SHARE NOWAIT",
        };
        Some((head, lock))
    }
    /// MySQL's `JSON`, cast to text (MariaDB's is `LONGTEXT` already).
    const RESULT_AS_TEXT: &'static str = "CAST(result AS CHAR)";

    const BACKEND: Backend = Backend::Mysql;

    fn delete_batch(table: &str) -> String {
        format!(
            "DELETE FROM {table} WHERE processed_at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND \
             ORDER BY processed_at LIMIT ?"
        )
    }

    fn count_stale(table: &str) -> String {
        format!(
            "SELECT count(*) AS n FROM {table} WHERE processed_at IS NULL \
             AND received_at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND"
        )
    }

    fn list_stale(table: &str) -> String {
        format!(
            "SELECT message_id, consumer, CAST(attempts AS SIGNED) AS attempts FROM {table} \
             WHERE processed_at IS NULL AND received_at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND \
             ORDER BY id LIMIT ?"
        )
    }

    /// `GET_LOCK` names are server-wide: the database goes into the name, so that purges of
    /// different databases do not exclude each other (PostgreSQL's advisory locks are per
    /// database already). The lock is the session's; one this session still holds — left by a
    /// purge dropped before its release — is released first, so that it is held once, not
    /// once more per purge.
    ///
    /// A session with `autocommit = 0` answers -1 without taking the lock: none of its
    /// batches would commit; one whose clock is set (`SET timestamp`) -2: its cutoff would
    /// not be the server's.
    fn try_lock(_: &str) -> Option<String> {
        Some(
            "SELECT CAST(CASE WHEN @@SESSION.autocommit = 0 THEN -1 \
             WHEN NOT (ABS(TIMESTAMPDIFF(SECOND, NOW(), SYSDATE())) < 60) THEN -2 ELSE \
             COALESCE(CASE WHEN IS_USED_LOCK(CONCAT(DATABASE(), ' ', ?)) = \
             CONNECTION_ID() THEN 1 ELSE GET_LOCK(CONCAT(DATABASE(), ' ', ?), 0) END, 0) END \
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

/// MySQL and MariaDB: the table's database, without an empty-string literal (which
/// `EMPTY_STRING_IS_NULL` reads as NULL). Binds the qualifier twice.
const MYSQL_SCHEMA: &str = "IF(IFNULL(CHAR_LENGTH(?), 0) = 0, DATABASE(), ?)";

/// MySQL and MariaDB: every row of a `SELECT` whatever the session's `sql_select_limit`
/// (which a `SELECT` with a `LIMIT` of its own ignores): a session with `sql_select_limit = 1`
/// (MySQL Workbench's safe mode sets 1000) read one column of the table and refused it.
const MYSQL_ALL_ROWS: &str = "LIMIT 18446744073709551615";

/// Get-or-create's lock name for `key`: at most 64 characters, whatever the key.
fn lock_name(key: &str) -> String {
    format!("inbox:{:016x}", dialect::keys::lock_hash(key) as u64)
}

/// MySQL and MariaDB: a server that does not write its log at each commit
/// (`innodb_flush_log_at_trx_commit = 0`), outside a Galera cluster (whose nodes recover
/// each other's commits): a row when so. The variables are read from MariaDB's
/// `information_schema` or MySQL's `performance_schema`, where `wsrep_on` may not exist.
fn mysql_durability_sql(server: &str) -> String {
    let variables = match server.contains("MariaDB") {
        true => "information_schema.GLOBAL_VARIABLES",
        false => "performance_schema.global_variables",
    };
    format!(
        "SELECT CAST('flush log' AS CHAR) AS kind, \
         CAST(@@global.innodb_flush_log_at_trx_commit AS CHAR) AS detail FROM DUAL \
         WHERE @@global.innodb_flush_log_at_trx_commit = 0 AND NOT EXISTS (SELECT 1 FROM \
         {variables} WHERE UPPER(VARIABLE_NAME) = 'WSREP_ON' AND VARIABLE_VALUE = 'ON') \
         {MYSQL_ALL_ROWS}"
    )
}

/// The server's version and packet limit, read with the catalog on MySQL and MariaDB.
const SERVER_VERSION_SQL: &str = "SELECT CAST(VERSION() AS CHAR) AS version, \
     CAST(@@max_allowed_packet AS SIGNED) AS max_packet";

#[derive(Debug, diesel::QueryableByName)]
struct ServerInfo {
    #[diesel(sql_type = Text)]
    version: String,
    #[diesel(sql_type = BigInt)]
    max_packet: i64,
}

/// MySQL and MariaDB: the privileges the handler's statements take, asked of the server by
/// `EXPLAIN`ing them — which needs the statement's privileges and writes nothing — rather
/// than read from grants (roles, wildcard databases and column grants are the server's to
/// weigh). A `privilege` fact for each refused; any other failure of an `EXPLAIN` is no
/// answer, and the check goes on without it.
async fn privileges<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
    claim: bool,
    key_text: bool,
) -> Vec<FactRow> {
    let table = Backend::Mysql.quote_table(schema.table());
    let mut columns = String::from("message_id, consumer, received_at, processed_at");
    if claim {
        columns.push_str(", claimed_until, attempts");
    }
    if key_text {
        columns.push_str(", key_text");
    }
    let mut read = String::from("message_id, consumer, processed_at");
    if claim {
        read.push_str(", claimed_until, attempts");
    }
    let nulls = vec!["NULL"; columns.split(", ").count()].join(", ");
    // Each privilege by a statement that needs it alone: an `INSERT … SELECT` refused for
    // want of SELECT would be reported as INSERT.
    let mut statements = vec![
        (
            "SELECT",
            format!("EXPLAIN SELECT {read} FROM {table} WHERE 1 = 0"),
        ),
        (
            "INSERT",
            format!("EXPLAIN INSERT INTO {table} ({columns}) VALUES ({nulls})"),
        ),
    ];
    if claim {
        statements.push((
            "UPDATE",
            format!(
                "EXPLAIN UPDATE {table} SET claimed_until = NULL, processed_at = NULL, \
                 attempts = attempts WHERE id = 0"
            ),
        ));
    }
    let mut refused = Vec::new();
    for (privilege, sql) in statements {
        if let Err(e) = io.load::<ExplainRow>(&Sql::new(sql)).await
            && crate::classify::class_of(&e, schema) == inbox_core::ErrorClass::PermissionDenied
        {
            // The command the server names (`SELECT command denied … for column 'id'`: the
            // UPDATE's `WHERE` reads), where it names one.
            let named = crate::classify::with_server_error(&e, |server| {
                server
                    .message
                    .split_once(" command denied")
                    .map(|(command, _)| command.to_owned())
            })
            .flatten()
            .filter(|command| ["SELECT", "INSERT", "UPDATE"].contains(&command.as_str()));
            let detail = named.unwrap_or_else(|| privilege.to_owned());
            if !refused.iter().any(|fact: &FactRow| fact.detail == detail) {
                refused.push(FactRow {
                    kind: "privilege".into(),
                    detail,
                });
            }
        }
    }
    refused
}

/// A row of MySQL's `EXPLAIN`, of which only its being there matters.
#[derive(Debug, diesel::QueryableByName)]
struct ExplainRow {
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    #[allow(dead_code)]
    select_type: Option<String>,
}

impl Catalogs for Mysql {
    fn catalog_sql() -> (String, String) {
        (
            format!(
                "SELECT CAST(column_name AS CHAR) AS name, \
                 CAST(CONCAT_WS(' collate ', column_type, collation_name) AS CHAR) AS type_name, \
                 CAST(is_nullable = 'YES' AS SIGNED) AS nullable \
                 FROM information_schema.columns \
                 WHERE table_schema = {MYSQL_SCHEMA} AND table_name = ? \
                 ORDER BY ordinal_position {MYSQL_ALL_ROWS}"
            ),
            format!(
                "SELECT CAST(1 - non_unique AS SIGNED) AS is_unique, \
                 CAST(IFNULL(column_name, '(expression)') AS CHAR) AS name \
                 FROM information_schema.statistics \
                 WHERE table_schema = {MYSQL_SCHEMA} AND table_name = ? \
                 AND index_name = ? ORDER BY seq_in_index {MYSQL_ALL_ROWS}"
            ),
        )
    }

    fn facts_sql(_qualifier: &str, _needs: &[(&str, &str)]) -> String {
        format!(
            "WITH w AS (SELECT CAST({MYSQL_SCHEMA} AS CHAR) AS s, CAST(? AS CHAR) AS t, \
                        CAST(? AS CHAR) AS ix) \
             SELECT CAST(f.kind AS CHAR) AS kind, CAST(f.detail AS CHAR) AS detail FROM ( \
             SELECT 'table' AS kind, CONCAT(tb.table_schema, '.', tb.table_name) AS detail \
             FROM information_schema.tables tb JOIN w \
             ON tb.table_schema = w.s AND tb.table_name = w.t \
             UNION ALL SELECT 'engine', IFNULL(tb.engine, tb.table_type) \
             FROM information_schema.tables tb JOIN w \
             ON tb.table_schema = w.s AND tb.table_name = w.t \
             WHERE tb.table_type <> 'BASE TABLE' OR tb.engine IS NULL OR tb.engine <> 'InnoDB' \
             UNION ALL SELECT 'trigger', tr.trigger_name FROM information_schema.triggers tr \
             JOIN w ON tr.event_object_schema = w.s AND tr.event_object_table = w.t \
             UNION ALL SELECT 'index prefix', \
             CONCAT(IFNULL(st.column_name, '(expression)'), '(', st.sub_part, ')') \
             FROM information_schema.statistics st JOIN w \
             ON st.table_schema = w.s AND st.table_name = w.t AND st.index_name = w.ix \
             WHERE st.sub_part IS NOT NULL \
             UNION ALL SELECT 'other unique', CONCAT(st.index_name, ' (', \
             GROUP_CONCAT(IFNULL(st.column_name, '(expression)') ORDER BY st.seq_in_index \
             SEPARATOR ', '), ')') FROM information_schema.statistics st JOIN w \
             ON st.table_schema = w.s AND st.table_name = w.t \
             WHERE st.non_unique = 0 AND st.index_name <> w.ix GROUP BY st.index_name \
             UNION ALL SELECT DISTINCT 'index name elsewhere', \
             CONCAT(st.table_schema, '.', st.table_name) FROM information_schema.statistics st \
             JOIN w ON st.table_schema = w.s AND st.table_name <> w.t AND st.index_name = w.ix \
             WHERE st.non_unique = 0 AND VERSION() LIKE '%MariaDB%' \
             UNION ALL SELECT 'clock', CAST(NOW(6) AS CHAR) FROM DUAL \
             WHERE NOT ({clock})) AS f {MYSQL_ALL_ROWS}",
            clock = crate::dialect::layout::SessionMark::CLOCK
        )
    }

    /// `?` is positional: the qualifier is bound twice.
    const QUALIFIER_BINDS: usize = 2;

    fn accepts(column: &str) -> &'static [&'static str] {
        match column {
            "id" => &["bigint"],
            "message_id" => &["binary(16)"],
            "consumer" => &["varchar", "text", "mediumtext", "longtext"],
            "key_text" => &["mediumtext", "longtext"],
            "received_at" | "processed_at" | "claimed_until" => &["datetime"],
            "attempts" => &["int", "bigint"],
            "result" => &["json", "longtext", "mediumtext"],
            "fingerprint" => &["binary(32)", "varbinary", "blob"],
            _ => &[],
        }
    }

    /// Any character of a UTF-8 name, compared byte by byte.
    fn holds(column: &str, type_name: &str) -> bool {
        match column {
            "consumer" => {
                type_name.contains("collate utf8mb4_")
                    && type_name.contains("_bin")
                    && catalog::bound(type_name).is_none_or(|n| n >= catalog::CONSUMER_CHARS)
            }
            "key_text" => type_name.contains("collate utf8mb4_"),
            _ => true,
        }
    }

    /// A case- or accent-insensitive collation would let `Credit` share the markers of
    /// `credit`; another character set would turn names it cannot hold into `?`s that
    /// compare equal.
    fn expected(column: &str) -> Option<&'static str> {
        (column == "consumer").then_some(
            "VARCHAR(200) with a binary utf8mb4 collation (utf8mb4_bin), so that every \
             consumer name fits and compares byte by byte",
        )
    }

    /// MySQL and MariaDB report whichever index a duplicate meets first: only an index with
    /// `id` is harmless.
    fn harmless_unique(columns: &[&str]) -> bool {
        columns.contains(&"id")
    }

    const OTHER_UNIQUE_FIX: &'static str = "drop it (MySQL and MariaDB name whichever unique \
        index a duplicate meets first, so even one on (message_id, consumer) under another \
        name is not harmless here); a primary key belongs on `id` alone";

    /// A database-qualified name means the same table to every session.
    const PINS_TABLE: bool = false;

    const MARKS_SESSIONS: bool = true;

    fn mark(layout: &mut Layout, schema: &InboxSchema, claim: bool, _oids: Option<&str>) {
        layout.session_mark = Some(SessionMark::new(schema, *layout, claim));
    }
}

/// A `ROLLBACK` of the handler's transaction that did not reach the server (the session
/// lost, `wait_timeout` passed): diesel's manager, which the raw statement bypasses, would
/// still count the transaction, and the next delivery on the connection would be refused as
/// one called inside a caller's transaction. Put in error, the manager says the connection
/// is broken (`BrokenTransactionManager`, a lost connection: drop it), as it does on
/// PostgreSQL.
fn broken(status: &mut diesel::connection::TransactionManagerStatus) {
    status.set_in_error();
}

/// The handler's transaction on MySQL and MariaDB, for both IO models.
impl Session for Mysql {
    fn begin_statement(spec: &'static HandlerSpec, layout: Layout) -> Cow<'static, str> {
        spec.mysql_begin_sql(layout.mariadb)
    }

    /// `START TRANSACTION` and the marker's insert in one round trip
    /// ([`start_with_marker`](marker::start_with_marker)).
    fn begin_with_marker_statement(
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
        _: marker::Keeps,
    ) -> Option<String> {
        let sql = marker::start_with_marker(spec, key, layout);
        // Too long for one packet (a long key's text in hex): the prepared insert takes
        // it as a parameter, or refuses it.
        layout.fits(sql.len()).then_some(sql)
    }

    /// MariaDB: `ROLLBACK` and the restore in one round trip
    /// ([`HandlerSpec::MARIADB_ROLLBACK_AND_RESTORE`]), wherever the transaction ended
    /// otherwise than by [`commit`](Session::commit).
    fn end_statement(mariadb: bool) -> Option<&'static str> {
        mariadb.then_some(HandlerSpec::MARIADB_ROLLBACK_AND_RESTORE)
    }

    /// The session's lock wait is put back whether the claim succeeded or not.
    fn lock_wait_statement(_claimed: bool) -> Option<&'static str> {
        Some(HandlerSpec::MYSQL_LOCK_WAIT)
    }

    /// `COMMIT` as the only statement of its round trip (the module's "A `COMMIT`
    /// alone"); on MariaDB the check that the transaction is still the handler's and the
    /// idle bound's restore before it, and `autocommit` put back after it, each alone.
    async fn commit<I: Io<Backend = Self>>(
        io: &mut I,
        spec: &'static HandlerSpec,
        mariadb: bool,
    ) -> QueryResult<()> {
        if mariadb {
            let ours = io.batch(HandlerSpec::MARIADB_STILL_OURS).await;
            ours.map_err(|e| super::transaction_gone(e, &spec.schema))?;
        }
        io.batch(HandlerSpec::MYSQL_COMMIT).await?;
        crate::io::status::ended(io.transaction_status())?;
        if mariadb {
            super::autocommit_back(io.batch(HandlerSpec::MARIADB_AUTOCOMMIT_BACK).await);
        }
        Ok(())
    }

    /// The handler's transaction rolled back whatever `completion_type` says
    /// ([`HandlerSpec::MYSQL_ROLLBACK`]); a savepoint of a caller's transaction
    /// (`transaction = "caller"`) as the manager rolls it back.
    async fn roll_back<I: Io<Backend = Self>>(io: &mut I) -> QueryResult<()> {
        let depth = io.transaction_status().transaction_depth()?;
        match depth.map(std::num::NonZeroU32::get) {
            None => Ok(()),
            Some(1) => {
                if let Err(e) = io.batch(HandlerSpec::MYSQL_ROLLBACK).await {
                    broken(io.transaction_status());
                    return Err(e);
                }
                crate::io::status::ended(io.transaction_status())
            }
            Some(_) => io.rollback_transaction().await,
        }
    }

    /// The rollback, then MariaDB's settings put back where a handler kept them
    /// ([`HandlerSpec::MARIADB_ABANDONED_RESTORE`]; its failure on MySQL ignored).
    async fn roll_back_abandoned<I: Io<Backend = Self>>(io: &mut I) -> QueryResult<()> {
        io.batch(HandlerSpec::MYSQL_ROLLBACK).await?;
        if let Err(e) = io.batch(HandlerSpec::MARIADB_ABANDONED_RESTORE).await {
            tracing::debug!(error = %e, "no MariaDB session settings to put back");
        }
        Ok(())
    }

    async fn claim_marker<I: Io<Backend = Self>>(
        io: &mut I,
        spec: &'static HandlerSpec,
        key: &MessageKey,
        layout: Layout,
    ) -> QueryResult<bool> {
        let (schema, consumer) = (&spec.schema, spec.consumer.as_str());
        let id = key.stored_id();
        let text = layout.key_text.then(|| layout::key_text(key));
        marker_fits(consumer, text.as_deref(), layout)?;
        let insert = ClaimMarker::new(schema, consumer, &id, text.as_deref(), layout.mark());
        Ok(inserted_unless_duplicate(io.run(insert).await, schema)? > 0)
    }

    /// In chunks of [`ROWS_PER_INSERT`](marker::ROWS_PER_INSERT), each one multi-row insert;
    /// a chunk with a duplicate among its keys fails whole (1062 on the inbox's index, that
    /// statement rolled back) and is claimed row by row, since MySQL and MariaDB return no
    /// rows from an `INSERT` to say which were new. Still one transaction and one commit.
    async fn claim_markers<I: Io<Backend = Self>>(
        io: &mut I,
        spec: &'static HandlerSpec,
        ids: &[Uuid],
        texts: Option<&[String]>,
        layout: Layout,
    ) -> QueryResult<Vec<Uuid>> {
        let (schema, consumer) = (&spec.schema, spec.consumer.as_str());
        let mut inserted = Vec::with_capacity(ids.len());
        let all_ids = ids;
        for range in marker_chunks(all_ids.len(), consumer, texts, layout)? {
            let ids = &all_ids[range.clone()];
            let texts = texts.map(|texts| &texts[range]);
            if ids.len() > 1 {
                let all = ClaimMarkers::<Mysql, diesel::sql_types::BigInt>::new(
                    schema,
                    consumer,
                    ids,
                    texts,
                    layout.mark(),
                )
                .all_or_none(layout.mariadb);
                if claim_rows_then_each(io.run(all).await, schema, ids.len())? {
                    inserted.extend_from_slice(ids);
                    continue;
                }
            }
            for (n, id) in ids.iter().enumerate() {
                let text = texts.map(|texts| texts[n].as_str());
                let insert = ClaimMarker::new(schema, consumer, id, text, layout.mark());
                if inserted_unless_duplicate(io.run(insert).await, schema)? > 0 {
                    inserted.push(*id);
                }
            }
        }
        Ok(inserted)
    }

    /// The startup check told of claim handlers ([`Needs::claim`](crate::schema::Needs::claim)),
    /// on MySQL and MariaDB: a session with `autocommit` off refused. Claim mode commits its
    /// claim and its stamp each on its own; each delivery refuses such a session before it
    /// writes (`SessionProblem::AutocommitOff`, an alert that halts a pump) — told at startup
    /// instead, where a deploy pipeline reads it.
    async fn refuse_autocommit_off<I: Io<Backend = Self>>(
        io: &mut I,
        schema: &InboxSchema,
    ) -> Result<(), SchemaError> {
        if super::autocommit_on(io)
            .await
            .map_err(SchemaError::Database)?
        {
            return Ok(());
        }
        Err(SchemaError::Session {
            table: schema.table(),
            problem: SchemaProblem::Unsupported {
                found: "autocommit is off on this session".into(),
                why: "claim mode commits its claim and its stamp each on its own: with autocommit \
                      off neither would commit, and the claim would vanish with the connection \
                      after the side effect ran",
                fix: "give claim mode connections with autocommit on: remove `SET autocommit = 0` \
                      from the pool's connection setup, or `SET GLOBAL autocommit = 1` (and in the \
                      server's configuration)"
                    .into(),
            },
        })
    }

    /// `VERSION()` and `@@max_allowed_packet`.
    async fn read_server<I: Io<Backend = Self>>(io: &mut I) -> QueryResult<(String, u64)> {
        Ok(io
            .load::<ServerInfo>(&Sql::new(SERVER_VERSION_SQL))
            .await?
            .into_iter()
            .next()
            .map(|row| (row.version, u64::try_from(row.max_packet).unwrap_or(0)))
            .unwrap_or_default())
    }

    async fn more_facts<I: Io<Backend = Self>>(
        io: &mut I,
        schema: &InboxSchema,
        claim: bool,
        key_text: bool,
        server: &str,
    ) -> QueryResult<Vec<FactRow>> {
        let mut facts = privileges(io, schema, claim, key_text).await;
        facts.extend(io.load(&Sql::new(mysql_durability_sql(server))).await?);
        Ok(facts)
    }

    /// The server's messages in English on this session ([`MYSQL_ENGLISH`]): any session may
    /// set its own.
    async fn english_messages<I: Io<Backend = Self>>(
        io: &mut I,
        _schema: &InboxSchema,
        _in_transaction: bool,
    ) -> Result<bool, SchemaError> {
        io.execute(&Sql::new(MYSQL_ENGLISH))
            .await
            .map(|_| false)
            .map_err(SchemaError::Database)
    }
}

/// MySQL and MariaDB: the session's messages in English, unless they are already (`en_GB`
/// stays `en_GB`). Any session may set its own `lc_messages`.
const MYSQL_ENGLISH: &str =
    "SET SESSION lc_messages = IF(@@lc_messages LIKE 'en\\_%', @@lc_messages, 'en_US')";

impl InboxConnection for MysqlConnection {}

impl sealed::Connection for MysqlConnection {}

#[cfg(feature = "async")]
async_server_connection!(
    diesel_async::AsyncMysqlConnection,
    super::StatementCancel::Mysql
);
