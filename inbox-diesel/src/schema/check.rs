//! The startup check: does the database hold the inbox table the runtime expects?

use std::fmt;

use diesel::QueryResult;
use diesel::sql_types::{BigInt, Text};
use inbox_core::InboxSchema;

use crate::dialect::Dialect;
use crate::dialect::Sql;
use crate::dialect::layout::{DatabaseMark, Layout, SessionMark};
use crate::io::Io;
use crate::schema::Backend;

/// What [`verify`](crate::schema::verify) found different from what the runtime needs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaProblem {
    /// The table does not exist (or is not visible on this connection's search path or
    /// database).
    MissingTable {
        /// The table looked for.
        table: String,
    },
    /// A column the runtime reads or writes is missing.
    MissingColumn {
        /// The column.
        column: &'static str,
    },
    /// A column has a type the runtime cannot work with.
    WrongType {
        /// The column.
        column: &'static str,
        /// Its type in the database.
        found: String,
        /// What it should be.
        expected: &'static str,
    },
    /// A key column may hold NULL. On MySQL and MariaDB the runtime relies on `consumer`
    /// being `NOT NULL` to refuse a marker from a session that did not check the table; a
    /// NULL in a unique index is distinct from every other, so no duplicate would be seen.
    Nullable {
        /// The column.
        column: &'static str,
    },
    /// No index of the name the runtime recognises duplicates by. Without it, two
    /// deliveries both insert their marker and both run the body.
    MissingUniqueIndex {
        /// The index looked for (`constraint = "…"`).
        index: String,
    },
    /// The index exists but is not unique.
    IndexNotUnique {
        /// The index.
        index: String,
    },
    /// The index is unique but not on `(message_id, consumer)`.
    IndexColumns {
        /// The index.
        index: String,
        /// Its columns, in order (`(expression)` for an expression).
        found: Vec<String>,
    },
    /// The table or its index has a property that breaks an assumption of the runtime: a
    /// trigger or rule that can swallow or rewrite the marker, an inheritance child, a
    /// table that is not crash-safe or not transactional, an index that is invalid, partial,
    /// on a prefix or deferrable, a missing privilege, a name that means different tables on
    /// different sessions.
    Unsupported {
        /// What was found, e.g. ``trigger `audit_inbox` ``.
        found: String,
        /// What it breaks.
        why: &'static str,
        /// How to fix it.
        fix: String,
    },
}

impl fmt::Display for SchemaProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaProblem::MissingTable { table } => write!(f, "table `{table}` does not exist"),
            SchemaProblem::MissingColumn { column } => write!(f, "column `{column}` is missing"),
            SchemaProblem::WrongType {
                column,
                found,
                expected,
            } => write!(f, "column `{column}` is {found}, expected {expected}"),
            SchemaProblem::Nullable { column } => write!(
                f,
                "column `{column}` allows NULL: a NULL key is distinct from every other in the \
                 unique index, so duplicates would not be recognised; make it NOT NULL"
            ),
            SchemaProblem::MissingUniqueIndex { index } => write!(
                f,
                "unique index `{index}` on (message_id, consumer) is missing: without it \
                 deliveries of one message are not recognised as duplicates; create it \
                 (`CREATE UNIQUE INDEX {index} ON … (message_id, consumer)`), or, if the \
                 table has such an index under another name, name that one with \
                 `constraint = \"…\"`"
            ),
            SchemaProblem::IndexNotUnique { index } => write!(f, "index `{index}` is not unique"),
            SchemaProblem::IndexColumns { index, found } => write!(
                f,
                "index `{index}` is on ({}), expected (message_id, consumer)",
                found.join(", ")
            ),
            SchemaProblem::Unsupported { found, why, fix } => {
                write!(f, "{found}: {why}; {fix}")
            }
        }
    }
}

/// Why [`verify`](crate::schema::verify) failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum SchemaError {
    /// The table differs from what the runtime needs, in each of these ways.
    Mismatch {
        /// The table checked, as the handler names it.
        table: &'static str,
        /// The table the name resolved to on the session checked, with its schema or
        /// database (`public.inbox`, `shop.inbox`); `None` where it did not resolve.
        resolved: Option<String>,
        /// Everything found wrong.
        problems: Vec<SchemaProblem>,
    },
    /// The session the check ran on cannot be used, whatever the table: a setting of its
    /// role or database it may not change (its server messages' language). Class
    /// [`ErrorClass::ServerSetting`](crate::ErrorClass::ServerSetting), an alert.
    Session {
        /// The table checked, as the handler names it.
        table: &'static str,
        /// What was found, why it matters, and the fix.
        problem: SchemaProblem,
    },
    /// Reading the catalog failed.
    Database(diesel::result::Error),
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaError::Mismatch {
                table,
                resolved,
                problems,
            } => {
                match resolved {
                    Some(resolved) if resolved != table => write!(
                        f,
                        "the inbox table `{table}` (`{resolved}` on this session) is not as \
                         the runtime needs it: "
                    )?,
                    _ => write!(
                        f,
                        "the inbox table `{table}` is not as the runtime needs it: "
                    )?,
                }
                for (n, problem) in problems.iter().enumerate() {
                    if n > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{problem}")?;
                }
                // The generator's table fixes the table's shape; the other refusals (a
                // trigger, a privilege, the session's language) name their own fix.
                match problems
                    .iter()
                    .any(|problem| !matches!(problem, SchemaProblem::Unsupported { .. }))
                {
                    true => {
                        f.write_str(" (generate the table with `inbox-diesel migration generate`)")
                    }
                    false => Ok(()),
                }
            }
            SchemaError::Session { table, problem } => write!(
                f,
                "the session checking the inbox table `{table}` is not as the runtime needs \
                 it: {problem}"
            ),
            SchemaError::Database(_) => f.write_str("reading the inbox table's definition failed"),
        }
    }
}

impl std::error::Error for SchemaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SchemaError::Database(e) => Some(e),
            SchemaError::Mismatch { .. } | SchemaError::Session { .. } => None,
        }
    }
}

/// The catalog's view of the inbox table: its columns, the named index, and the facts of
/// [`facts_sql`].
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    columns: Vec<ColumnRow>,
    index: Vec<IndexRow>,
    facts: Vec<FactRow>,
    /// `VERSION()` on MySQL and MariaDB; empty elsewhere.
    server: String,
    /// `@@max_allowed_packet` on MySQL and MariaDB; 0 elsewhere.
    max_packet: u64,
}

#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct ColumnRow {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    type_name: String,
    #[diesel(sql_type = BigInt)]
    nullable: i64,
}

#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct ServerRow {
    #[diesel(sql_type = Text)]
    pub(crate) version: String,
}

/// The server's version and packet limit, read with the catalog on MySQL and MariaDB.
pub(crate) const SERVER_VERSION_SQL: &str = "SELECT CAST(VERSION() AS CHAR) AS version, \
     CAST(@@max_allowed_packet AS SIGNED) AS max_packet";

#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct ServerInfo {
    #[diesel(sql_type = Text)]
    version: String,
    #[diesel(sql_type = BigInt)]
    max_packet: i64,
}

#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct IndexRow {
    #[diesel(sql_type = BigInt)]
    is_unique: i64,
    #[diesel(sql_type = Text)]
    name: String,
}

/// One fact about the table that the check refuses or reports: its kind and a detail.
#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct FactRow {
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Text)]
    detail: String,
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

/// PostgreSQL: the table's oid, resolved as the runtime's statements resolve its name. Binds
/// `$1` (qualifier, `''` when none) and `$2` (name).
const PG_REL: &str = "to_regclass(CASE WHEN $1 = '' THEN quote_ident($2) \
     ELSE quote_ident($1) || '.' || quote_ident($2) END)";

/// MySQL and MariaDB: the table's database, without an empty-string literal (which
/// `EMPTY_STRING_IS_NULL` reads as NULL). Binds the qualifier twice.
const MYSQL_SCHEMA: &str = "IF(IFNULL(CHAR_LENGTH(?), 0) = 0, DATABASE(), ?)";

/// MySQL and MariaDB: every row of a `SELECT` whatever the session's `sql_select_limit`
/// (which a `SELECT` with a `LIMIT` of its own ignores): a session with `sql_select_limit = 1`
/// (MySQL Workbench's safe mode sets 1000) read one column of the table and refused it.
const MYSQL_ALL_ROWS: &str = "LIMIT 18446744073709551615";

/// The catalog queries of each backend: the columns (binds: the table's qualifier, `''`
/// when none, and its name) and the index (binds: qualifier, name, index name).
pub(crate) fn catalog_sql(backend: Backend) -> (String, String) {
    match backend {
        Backend::Postgres => (
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
        ),
        Backend::Mysql => (
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
        ),
        Backend::Sqlite => (
            "SELECT name, type AS type_name, CAST(\"notnull\" = 0 AS BIGINT) AS nullable \
             FROM pragma_table_info(?2, COALESCE(NULLIF(?1, ''), 'main')) ORDER BY cid"
                .into(),
            format!(
                "SELECT CAST(l.\"unique\" AS BIGINT) AS is_unique, \
                 COALESCE(i.name, '(expression)') AS name \
                 FROM pragma_index_list(?2, COALESCE(NULLIF(?1, ''), 'main')) AS l, \
                 pragma_index_info(l.name, COALESCE(NULLIF(?1, ''), 'main')) AS i \
                 WHERE l.name = ({}) ORDER BY i.seqno",
                sqlite_key_index("COALESCE(NULLIF(?1, ''), 'main')")
            ),
        ),
    }
}

/// SQLite: the name of the index the inbox's key is checked on, in the database `schema` (an
/// SQL expression): the index named as the inbox's (bound as `?3`), or else the table's
/// primary-key index — the lean table's key (`WITHOUT ROWID`), which SQLite names itself.
/// Every check of the index (its columns, uniqueness, predicate, collations) reads this one.
fn sqlite_key_index(schema: &str) -> String {
    format!(
        "SELECT name FROM pragma_index_list(?2, {schema}) \
         WHERE name = ?3 OR origin = 'pk' ORDER BY name = ?3 DESC LIMIT 1"
    )
}

/// The facts query: rows of (kind, detail) for what the table is (`table`: its name with
/// its schema or database) and what the check refuses. Binds: qualifier, name, index name
/// (on MySQL, where `?` is positional, the qualifier twice). `schema` is the qualifier
/// itself on SQLite, whose catalog of an attached database is named, not bound; `needs` the
/// privileges the handler's statements take (PostgreSQL).
fn facts_sql(backend: Backend, qualifier: &str, needs: &[(&str, &str)]) -> String {
    match backend {
        Backend::Postgres => {
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
                 UNION ALL SELECT 'privilege', p.privilege || ' on ' || p.col \
                 FROM (VALUES {privileges}) AS p(privilege, col) JOIN t ON true \
                 JOIN pg_attribute a ON a.attrelid = t.rel AND a.attname = p.col \
                 AND NOT a.attisdropped \
                 WHERE NOT has_column_privilege(t.rel, a.attnum, p.privilege)"
            )
        }
        Backend::Mysql => format!(
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
        ),
        Backend::Sqlite => {
            let schema = match qualifier {
                "" => "main",
                qualifier => qualifier,
            };
            // A temporary table of the same name shadows an unqualified one: statements
            // would write the marker there, and it is gone with the connection.
            format!(
                "SELECT 'table' AS kind, '{schema}.' || name AS detail \
                 FROM \"{schema}\".sqlite_master WHERE type = 'table' AND name = ?2 COLLATE NOCASE \
                 UNION ALL SELECT 'oids', CAST(m.rootpage AS TEXT) || ' ' || d.file \
                 FROM \"{schema}\".sqlite_master m, pragma_database_list d \
                 WHERE m.type = 'table' AND m.name = ?2 COLLATE NOCASE AND d.name = '{schema}' \
                 UNION ALL SELECT 'trigger', name FROM \"{schema}\".sqlite_master \
                 WHERE type = 'trigger' AND tbl_name = ?2 COLLATE NOCASE \
                 UNION ALL SELECT 'trigger', name FROM temp.sqlite_master \
                 WHERE type = 'trigger' AND tbl_name = ?2 COLLATE NOCASE \
                 UNION ALL SELECT 'relkind', type FROM \"{schema}\".sqlite_master \
                 WHERE name = ?2 COLLATE NOCASE AND type NOT IN ('table', 'index', 'trigger') \
                 UNION ALL SELECT 'shadowed', name FROM temp.sqlite_master \
                 WHERE ?1 = '' AND '{schema}' <> 'temp' AND type = 'table' \
                 AND name = ?2 COLLATE NOCASE \
                 UNION ALL SELECT 'index partial', name \
                 FROM pragma_index_list(?2, '{schema}') WHERE name = ({index}) AND partial = 1 \
                 UNION ALL SELECT 'index collation', coll \
                 FROM pragma_index_xinfo(({index}), '{schema}') WHERE key = 1 AND coll <> 'BINARY'",
                index = sqlite_key_index(&format!("'{schema}'"))
            )
        }
    }
}

/// MySQL and MariaDB: the privileges the handler's statements take, asked of the server by
/// `EXPLAIN`ing them — which needs the statement's privileges and writes nothing — rather
/// than read from grants (roles, wildcard databases and column grants are the server's to
/// weigh). A `privilege` fact for each refused; any other failure of an `EXPLAIN` is no
/// answer, and the check goes on without it.
async fn mysql_privileges<S: Io>(
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
pub(crate) struct ExplainRow {
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    #[allow(dead_code)]
    select_type: Option<String>,
}

/// The privileges a handler's statements take, by column (PostgreSQL): reading and writing
/// the marker; in claim mode also updating the claim.
fn needed_privileges(claim: bool, key_text: bool) -> Vec<(&'static str, &'static str)> {
    let mut needs = vec![
        ("SELECT", "message_id"),
        ("SELECT", "consumer"),
        ("SELECT", "processed_at"),
        ("INSERT", "message_id"),
        ("INSERT", "consumer"),
        ("INSERT", "received_at"),
        ("INSERT", "processed_at"),
    ];
    if key_text {
        needs.push(("INSERT", "key_text"));
    }
    if claim {
        needs.extend([
            ("SELECT", "claimed_until"),
            ("SELECT", "attempts"),
            ("INSERT", "claimed_until"),
            ("INSERT", "attempts"),
            ("UPDATE", "claimed_until"),
            ("UPDATE", "processed_at"),
            ("UPDATE", "attempts"),
        ]);
    }
    needs
}

/// Reads the [`Catalog`] of `schema`'s table.
async fn read_catalog<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
    claim: bool,
) -> QueryResult<Catalog> {
    let backend = S::Backend::BACKEND;
    let (columns_sql, index_sql) = catalog_sql(backend);
    let (qualifier, name) = match schema.table().rsplit_once('.') {
        Some((qualifier, name)) => (qualifier, name),
        None => ("", schema.table()),
    };
    let mysql = backend == Backend::Mysql;
    // MySQL binds are positional: the qualifier is bound twice.
    let with_table = |sql: String| {
        let sql = Sql::new(sql).bind_text(qualifier);
        match mysql {
            true => sql.bind_text(qualifier),
            false => sql,
        }
        .bind_text(name)
    };
    let (server, max_packet) = match backend {
        Backend::Mysql => io
            .load::<ServerInfo>(&Sql::new(SERVER_VERSION_SQL))
            .await?
            .into_iter()
            .next()
            .map(|row| (row.version, u64::try_from(row.max_packet).unwrap_or(0)))
            .unwrap_or_default(),
        Backend::Postgres | Backend::Sqlite => (String::new(), 0),
    };
    // MariaDB: the catalog's reads free of a session's tight `max_statement_time` (a
    // `0.001` timed the check out on every session), for themselves alone.
    let lifted = |sql: String| match server.contains("MariaDB") {
        true => format!("SET STATEMENT max_statement_time = 30 FOR {sql}"),
        false => sql,
    };
    let columns: Vec<ColumnRow> = io.load(&with_table(lifted(columns_sql))).await?;
    let index = io
        .load(&with_table(lifted(index_sql)).bind_text(schema.constraint()))
        .await?;
    let key_text = columns.iter().any(|c| c.name == KEY_TEXT.0);
    let needs = needed_privileges(claim, key_text);
    let mut facts: Vec<FactRow> = io
        .load(
            &with_table(lifted(facts_sql(backend, qualifier, &needs)))
                .bind_text(schema.constraint()),
        )
        .await?;
    if backend == Backend::Mysql && !columns.is_empty() {
        facts.extend(mysql_privileges(io, schema, claim, key_text).await);
        facts.extend(io.load(&Sql::new(mysql_durability_sql(&server))).await?);
    }
    Ok(Catalog {
        columns,
        index,
        facts,
        server,
        max_packet,
    })
}

/// MySQL and MariaDB: whether `autocommit` is on for the session.
pub(crate) async fn autocommit_on<S: Io>(io: &mut S) -> QueryResult<bool> {
    #[derive(diesel::QueryableByName)]
    struct Autocommit {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let sql = Sql::new("SELECT CAST(@@SESSION.autocommit AS SIGNED) AS n");
    let rows = io.load::<Autocommit>(&sql).await?;
    Ok(rows.first().is_some_and(|row| row.n == 1))
}

/// The startup check told of claim handlers ([`Needs::claim`](crate::schema::Needs::claim)),
/// on MySQL and MariaDB: a session with `autocommit` off refused. Claim mode commits its
/// claim and its stamp each on its own; each delivery refuses such a session before it
/// writes (`SessionProblem::AutocommitOff`, an alert that halts a pump) — told at startup
/// instead, where a deploy pipeline reads it.
pub(crate) async fn refuse_autocommit_off<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
) -> Result<(), SchemaError> {
    if S::Backend::BACKEND != Backend::Mysql {
        return Ok(());
    }
    if autocommit_on(io).await.map_err(SchemaError::Database)? {
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

/// PostgreSQL behind PgBouncer in statement mode (`pool_mode = statement`): it allows no
/// transaction of more than one statement and closes the client at the first, with a
/// `FATAL` neither driver hands on — every handler's transaction would fail as a lost
/// connection, on every new connection too, and a pump would retry each message until the
/// broker's delivery limit dead-letters it. [`verify`](crate::schema::verify) opens a
/// transaction of its own and rolls it back: a session that answered the catalog's read a
/// moment ago and is gone at that `BEGIN` is refused, naming the setting. Only outside any
/// transaction (diesel's, or one opened as SQL); elsewhere, and on the other backends,
/// nothing is sent.
pub(crate) async fn refuse_statement_pooling<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
) -> Result<(), SchemaError> {
    if S::Backend::BACKEND != Backend::Postgres
        || !matches!(io.transaction_status().transaction_depth(), Ok(None))
    {
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
                    fix: "set `pool_mode = transaction` (with diesel's statement cache off) or \
                          `session` for the consumers' database; if no pooler is there, the \
                          server went away at that moment: verify again"
                        .into(),
                }],
            })
        }
        Err(e) => Err(SchemaError::Database(e)),
    }
}

/// The startup check on one connection: reads the catalog, compares, and on MySQL and
/// MariaDB marks the session as checked ([`SessionMark`]). `claim`: the handler runs in
/// claim mode, whose statements take more privileges.
pub(crate) async fn check_table<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
    claim: bool,
) -> Result<Layout, SchemaError> {
    let lifted = lift_statement_timeout(io).await;
    let set_english = match english_messages(io, schema, lifted).await {
        Ok(set) => set,
        Err(refused) => {
            if lifted {
                let _ = io.batch("ROLLBACK").await;
            }
            return Err(refused);
        }
    };
    let read = read_catalog(io, schema, claim).await;
    if lifted {
        let end = match read {
            Ok(_) => "COMMIT",
            Err(_) => "ROLLBACK",
        };
        let ended = io.batch(end).await;
        if read.is_ok() {
            ended.map_err(SchemaError::Database)?;
        }
    }
    let catalog = read.map_err(SchemaError::Database)?;
    let mut layout = check(S::Backend::BACKEND, schema, catalog, claim)?;
    layout.english = set_english && S::Backend::BACKEND == Backend::Postgres;
    if let Some(mark) = layout.session_mark {
        io.execute(&Sql::new(mark.set_sql()))
            .await
            .map_err(SchemaError::Database)?;
    }
    Ok(layout)
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

/// Lifts a short `statement_timeout` for the check's reads ([`PG_TIGHT_TIMEOUT`]): whether
/// it began the transaction that does, which the check then ends. Not inside a transaction
/// diesel knows of (a handler that joins the caller's): the caller's transaction keeps its
/// bound.
async fn lift_statement_timeout<S: Io>(io: &mut S) -> bool {
    if S::Backend::BACKEND != Backend::Postgres
        || !matches!(io.transaction_status().transaction_depth(), Ok(None))
    {
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

/// MySQL and MariaDB: the session's messages in English, unless they are already (`en_GB`
/// stays `en_GB`). Any session may set its own `lc_messages`.
const MYSQL_ENGLISH: &str =
    "SET SESSION lc_messages = IF(@@lc_messages LIKE 'en\\_%', @@lc_messages, 'en_US')";

/// PostgreSQL: the session's messages in English where the setting names another language
/// (or none: an empty `lc_messages` takes the server's environment), now or after a `RESET`
/// (`reset_val`: the role's, the database's or the server's setting). A row where either
/// does: the handler's transactions then set English for themselves. Only a superuser, or
/// a role granted `SET` on the parameter, may; see [`english_messages`]. Read from the reset
/// value as well, because a session can be English already without being so by default: the
/// marker's statement prepared on it set English before a check ran there
/// (`PgMarker::prepared_and`).
const PG_ENGLISH: &str = "SELECT set_config('lc_messages', 'C', false) FROM pg_settings \
     WHERE name = 'lc_messages' AND (reset_val !~ '^(C|POSIX|en)([._@]|$)' \
     OR current_setting('lc_messages') !~ '^(C|POSIX|en)([._@]|$)')";

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
async fn may_set_messages<S: Io>(io: &mut S) -> bool {
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
/// MySQL and MariaDB let every session do that. PostgreSQL lets only a superuser, or a
/// role granted `SET` on the parameter (PostgreSQL 15+): for any other role whose messages
/// are in another language the check refuses, naming the two fixes (`ALTER ROLE … SET
/// lc_messages = 'C'`, or the grant). A role that may not set it, on a server whose messages
/// are English anyway (built without translations), passes: its refusal came in English.
///
/// `in_transaction`: the check's reads run in a transaction of their own
/// ([`lift_statement_timeout`]), which a refusal here must not leave aborted: the attempt
/// runs under a savepoint.
async fn english_messages<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
    in_transaction: bool,
) -> Result<bool, SchemaError> {
    if in_transaction {
        io.batch("SAVEPOINT inbox_english")
            .await
            .map_err(SchemaError::Database)?;
    }
    let pinned = match S::Backend::BACKEND {
        Backend::Sqlite => return Ok(false),
        Backend::Mysql => io.execute(&Sql::new(MYSQL_ENGLISH)).await,
        Backend::Postgres => io.execute(&Sql::new(PG_ENGLISH)).await,
    };
    let refused = match pinned {
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
    match (S::Backend::BACKEND, english) {
        (Backend::Postgres, Some(true)) => return Ok(false),
        (Backend::Postgres, Some(false)) if unread => {}
        _ => return Err(SchemaError::Database(refused)),
    }
    // Unread, it may be another failure in the session's language — a statement timeout, a
    // session ended — of a role that may set the parameter: that failure, not a refusal
    // (whose advice would be wrong, and an alert).
    if may_set_messages(io).await {
        return Err(SchemaError::Database(refused));
    }
    let setting = io
        .load::<ServerRow>(&Sql::new(PG_MESSAGES))
        .await
        .map_err(SchemaError::Database)?
        .into_iter()
        .next()
        .map(|row| row.version)
        .unwrap_or_default();
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
                  (PostgreSQL 15+; not enough for claim mode behind a transaction-mode \
                  pooler, whose other server sessions keep the server's language)"
                .into(),
        },
    })
}

/// Each column the runtime uses, and the types it works with on each backend: a prefix of
/// the catalog's type name, compared case-insensitively. Times are UTC everywhere: on
/// PostgreSQL `timestamp with time zone` (a `timestamp` column is compared in each session's
/// `TimeZone`), on MySQL and MariaDB `DATETIME` written with `UTC_TIMESTAMP()` (a `TIMESTAMP`
/// column converts from and to each session's `time_zone`).
const COLUMNS: [(&str, [&[&str]; 3], &str); 7] = [
    // (column, [postgres, mysql, sqlite], expected)
    (
        "id",
        [&["bigint"], &["bigint"], &["integer"]],
        "a 64-bit integer key",
    ),
    (
        "message_id",
        [&["uuid"], &["binary(16)"], &["blob"]],
        "UUID (PostgreSQL), BINARY(16) (MySQL), BLOB (SQLite)",
    ),
    (
        "consumer",
        [
            &["text", "character varying"],
            &["varchar", "text", "mediumtext", "longtext"],
            &["text"],
        ],
        "text of at least 200 characters",
    ),
    (
        "received_at",
        [
            &["timestamp with time zone", "timestamp("],
            &["datetime"],
            &["timestamp", "datetime", "text"],
        ],
        TIMESTAMP,
    ),
    (
        "processed_at",
        [
            &["timestamp with time zone", "timestamp("],
            &["datetime"],
            &["timestamp", "datetime", "text"],
        ],
        TIMESTAMP,
    ),
    (
        "claimed_until",
        [
            &["timestamp with time zone", "timestamp("],
            &["datetime"],
            &["timestamp", "datetime", "text"],
        ],
        TIMESTAMP,
    ),
    (
        "attempts",
        [
            &["integer", "bigint"],
            &["int", "bigint"],
            &["integer", "bigint"],
        ],
        "an integer",
    ),
];

const TIMESTAMP: &str = "a time the runtime writes and compares in UTC: TIMESTAMPTZ \
    (PostgreSQL; `timestamp without time zone` is read in each session's TimeZone), DATETIME \
    (MySQL, MariaDB; `TIMESTAMP` converts with each session's time_zone), TIMESTAMP (SQLite)";

/// The optional column the runtime fills when the table has it, and the types it accepts:
/// the key as text, for operators and for migrating from a table of text ids
/// (`inbox-diesel migration generate --with key_text`). A key is up to 64 KiB of text, a
/// bytes key twice that in hex: no bounded type holds every key.
const KEY_TEXT: (&str, [&[&str]; 3], &str) = (
    "key_text",
    [
        &["text", "character varying"],
        &["mediumtext", "longtext"],
        &["text"],
    ],
    "unbounded text in UTF-8: TEXT (PostgreSQL, SQLite), MEDIUMTEXT with a utf8mb4 collation \
     (MySQL, MariaDB)",
);

/// The optional column where a handler with `store_result` keeps its `Ok` value, as JSON
/// (`inbox-diesel migration generate --with result`).
const RESULT: (&str, [&[&str]; 3], &str) = (
    "result",
    [
        &["jsonb", "json", "text"],
        &["json", "longtext", "mediumtext"],
        &["text"],
    ],
    "JSON text: jsonb (PostgreSQL), JSON (MySQL; MariaDB's JSON is LONGTEXT), TEXT (SQLite)",
);

/// The optional column where a handler with `fingerprint = …` keeps the request's SHA-256
/// digest (`inbox-diesel migration generate --with fingerprint`).
const FINGERPRINT: (&str, [&[&str]; 3], &str) = (
    "fingerprint",
    [&["bytea"], &["binary(32)", "varbinary", "blob"], &["blob"]],
    "32 bytes: BYTEA (PostgreSQL), BINARY(32) (MySQL, MariaDB), BLOB (SQLite)",
);

/// The longest consumer name, in characters: what `consumer` must hold.
const CONSUMER_CHARS: u64 = inbox_core::Consumer::MAX_LEN as u64;

/// The length a type name bounds a text to, `varchar(50)` → 50; `None` when unbounded.
fn bound(type_name: &str) -> Option<u64> {
    let (_, rest) = type_name.split_once('(')?;
    rest.split_once(')')?.0.trim().parse().ok()
}

/// Whether the column `found` (its type name lower-cased, with MySQL's collation) can hold
/// what the runtime writes into `column`, beyond the type's name.
fn holds(backend: Backend, column: &str, type_name: &str) -> bool {
    let timestamp = matches!(column, "received_at" | "processed_at" | "claimed_until");
    match (backend, column) {
        (Backend::Postgres, _) if timestamp => {
            type_name.contains("with time zone") && !type_name.contains("without")
        }
        (Backend::Postgres, "consumer") => bound(type_name).is_none_or(|n| n >= CONSUMER_CHARS),
        (Backend::Postgres, "key_text") => bound(type_name).is_none(),
        // Any character of a UTF-8 name, compared byte by byte.
        (Backend::Mysql, "consumer") => {
            type_name.contains("collate utf8mb4_")
                && type_name.contains("_bin")
                && bound(type_name).is_none_or(|n| n >= CONSUMER_CHARS)
        }
        (Backend::Mysql, "key_text") => type_name.contains("collate utf8mb4_"),
        _ => true,
    }
}

/// Compares what the catalog says with what the runtime needs, and says which optional
/// columns the table has.
pub(crate) fn check(
    backend: Backend,
    schema: &InboxSchema,
    catalog: Catalog,
    claim: bool,
) -> Result<Layout, SchemaError> {
    let mut layout = Layout {
        key_text: false,
        result: false,
        fingerprint: false,
        mariadb: backend == Backend::Mysql && catalog.server.contains("MariaDB"),
        session_mark: None,
        database_mark: None,
        pinned: None,
        max_packet: catalog.max_packet,
        english: false,
    };
    let resolved = catalog
        .facts
        .iter()
        .find(|fact| fact.kind == "table")
        .map(|fact| fact.detail.clone());
    let mut problems = Vec::new();
    if catalog.columns.is_empty() {
        problems.push(SchemaProblem::MissingTable {
            table: schema.table().to_owned(),
        });
        // PostgreSQL: tables of the name in schemas the session's `search_path` leaves out.
        let elsewhere: Vec<&str> = catalog
            .facts
            .iter()
            .filter(|f| f.kind == "same name")
            .map(|f| f.detail.as_str())
            .collect();
        if let [first, ..] = elsewhere[..] {
            let table = schema.table();
            problems.push(SchemaProblem::Unsupported {
                found: format!(
                    "a table `{table}` in {}, which this session's search_path leaves out",
                    elsewhere
                        .iter()
                        .map(|s| format!("`{s}.{table}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                why: "an unqualified name is looked up only in the schemas of the session's \
                      search_path (a role's or a database's setting, a pool's connection setup)",
                fix: format!(
                    "name the table with its schema (`table = \"{first}.{table}\"`), or put \
                     `{first}` on the session's search_path"
                ),
            });
        }
    } else {
        let slot = match backend {
            Backend::Postgres => 0,
            Backend::Mysql => 1,
            Backend::Sqlite => 2,
        };
        layout.key_text = catalog.columns.iter().any(|c| c.name == KEY_TEXT.0);
        layout.result = catalog.columns.iter().any(|c| c.name == RESULT.0);
        layout.fingerprint = catalog.columns.iter().any(|c| c.name == FINGERPRINT.0);
        // The optional columns are checked only when the table has them.
        let optional = [
            layout.key_text.then_some(&KEY_TEXT),
            layout.result.then_some(&RESULT),
            layout.fingerprint.then_some(&FINGERPRINT),
        ];
        for &(column, types, expected) in COLUMNS.iter().chain(optional.into_iter().flatten()) {
            match catalog.columns.iter().find(|c| c.name == column) {
                // SQLite's lean design keys the table by the pair: nothing reads `id` there
                // (the purge goes by the key).
                None if column == "id" && backend == Backend::Sqlite => {}
                None => problems.push(SchemaProblem::MissingColumn { column }),
                Some(found) => {
                    let type_name = found.type_name.to_ascii_lowercase();
                    if !types[slot].iter().any(|t| type_name.starts_with(t))
                        || !holds(backend, column, &type_name)
                    {
                        problems.push(SchemaProblem::WrongType {
                            column,
                            found: found.type_name.clone(),
                            expected: match (backend, column) {
                                // A case- or accent-insensitive collation would let `Credit`
                                // share the markers of `credit`; another character set would
                                // turn names it cannot hold into `?`s that compare equal.
                                (Backend::Mysql, "consumer") => {
                                    "VARCHAR(200) with a binary utf8mb4 collation \
                                     (utf8mb4_bin), so that every consumer name fits and \
                                     compares byte by byte"
                                }
                                _ => expected,
                            },
                        });
                    } else if found.nullable != 0 && matches!(column, "message_id" | "consumer") {
                        problems.push(SchemaProblem::Nullable { column });
                    }
                }
            }
        }
        let index = schema.constraint().to_owned();
        let columns: Vec<String> = catalog.index.iter().map(|r| r.name.clone()).collect();
        if catalog.index.is_empty() {
            problems.push(SchemaProblem::MissingUniqueIndex { index });
        } else if catalog.index.iter().any(|r| r.is_unique == 0) {
            problems.push(SchemaProblem::IndexNotUnique { index });
        } else if columns != InboxSchema::KEY_COLUMNS {
            problems.push(SchemaProblem::IndexColumns {
                index,
                found: columns,
            });
        }
        let index_missing = catalog.index.is_empty();
        problems.extend(
            refusals(backend, schema, &catalog.facts, layout.key_text, claim)
                .into_iter()
                // The inbox's index under another name: the missing index's problem says so.
                .filter(|problem| {
                    !(index_missing
                        && matches!(problem, SchemaProblem::Unsupported { found, .. }
                            if found.ends_with(" (message_id, consumer)`")))
                }),
        );
    }
    if backend != Backend::Mysql && !schema.table().contains('.') {
        layout.pinned = resolved
            .as_deref()
            .filter(|name| InboxSchema::validate_table(name).is_ok())
            .map(intern);
    }
    if backend == Backend::Mysql {
        layout.session_mark = Some(SessionMark::new(schema, layout, claim));
    }
    if backend != Backend::Mysql {
        // PostgreSQL: the name as the handler gives it, resolved by the session's
        // `search_path` as the check resolved it (a session pointed at another schema since
        // is checked there); SQLite: the table as pinned, in its database.
        let name = match backend {
            Backend::Postgres => schema.table(),
            _ => layout.pinned.unwrap_or(schema.table()),
        };
        layout.database_mark = catalog
            .facts
            .iter()
            .find(|fact| fact.kind == "oids")
            .and_then(|fact| DatabaseMark::read(backend == Backend::Postgres, &fact.detail, name));
    }
    match problems.is_empty() {
        true => Ok(layout),
        false => Err(SchemaError::Mismatch {
            table: schema.table(),
            resolved,
            problems,
        }),
    }
}

/// Whether another unique index of the inbox table (`name (columns)`) is harmless: one with
/// `id`; on PostgreSQL also one covering `(message_id, consumer)` (it cannot be violated
/// unless the inbox's index is, and `ON CONFLICT` names the columns) — not on MySQL and
/// MariaDB, which report whichever index a duplicate meets first.
fn harmless_unique(backend: Backend, detail: &str) -> bool {
    let columns: Vec<&str> = detail
        .rsplit_once(" (")
        .and_then(|(_, columns)| columns.strip_suffix(')'))
        .map(|columns| columns.split(", ").collect())
        .unwrap_or_default();
    // `id` is unique by itself (generated): an index with it is never violated first — the
    // primary key a partitioned table needs, `(id, message_id)`, included.
    match backend {
        Backend::Mysql => columns.contains(&"id"),
        _ => {
            columns.contains(&"id")
                || (columns.contains(&"message_id") && columns.contains(&"consumer"))
        }
    }
}

/// The facts the check refuses, each with what it breaks and the fix.
fn refusals(
    backend: Backend,
    schema: &InboxSchema,
    facts: &[FactRow],
    key_text: bool,
    claim: bool,
) -> Vec<SchemaProblem> {
    let table = schema.table();
    let index = schema.constraint();
    let mut problems = Vec::new();
    let mut privileges = Vec::new();
    let same_name: Vec<&str> = facts
        .iter()
        .filter(|f| f.kind == "same name")
        .map(|f| f.detail.as_str())
        .collect();
    if same_name.len() > 1 {
        problems.push(SchemaProblem::Unsupported {
            found: format!(
                "tables named `{table}` in the schemas {}",
                same_name.join(", ")
            ),
            why: "which one an unqualified name means depends on each session's search_path: \
                  instances with different settings would each keep markers in their own \
                  table and apply a message once in each",
            fix: format!(
                "name the table with its schema (`table = \"{}.{table}\"`); tenants that then \
                 share that one table and number their messages each on their own must key by \
                 the tenant too (`key = Scoped(tenant, msg.id)`), or one tenant's message is \
                 another's duplicate",
                same_name[0]
            ),
        });
    }
    for fact in facts {
        let detail = fact.detail.as_str();
        let problem = |found: String, why: &'static str, fix: String| SchemaProblem::Unsupported {
            found,
            why,
            fix,
        };
        match fact.kind.as_str() {
            "persistence" => problems.push(match detail {
                "u" => problem(
                    "an UNLOGGED table".into(),
                    "a crash empties it and replicas do not have it, so every message \
                     processed before a crash or failover would be applied again",
                    format!("ALTER TABLE {table} SET LOGGED"),
                ),
                _ => problem(
                    "a temporary table".into(),
                    "its markers are gone with the session (and it hides the table of that \
                     name from this session)",
                    format!("drop the temporary table `{table}`"),
                ),
            }),
            "relkind" | "engine" => problems.push(problem(
                match (backend, detail) {
                    (Backend::Mysql, "VIEW") | (_, "v") | (_, "view") => "a view".into(),
                    (Backend::Mysql, engine) => format!("the {engine} storage engine"),
                    (_, "f") => "a foreign table".into(),
                    (_, "m") => "a materialized view".into(),
                    (_, other) => format!("a relation of kind `{other}`"),
                },
                "the marker must be a row of a transactional table, written and rolled back \
                 with the business change (MyISAM and Aria keep a marker whose transaction \
                 rolled back: the message would never be applied)",
                match backend {
                    Backend::Mysql => format!("ALTER TABLE {table} ENGINE = InnoDB"),
                    _ => "use a plain table (`inbox-diesel migration generate`)".into(),
                },
            )),
            "trigger" => problems.push(problem(
                match detail.split_once(" ON ") {
                    Some((name, on)) => format!("trigger `{name}` on `{on}`"),
                    None => format!("trigger `{detail}`"),
                },
                "a trigger can swallow, rewrite or move the marker row, and a new message \
                 would then be answered Duplicate and never applied, or two consumers share \
                 markers",
                format!(
                    "drop it (`DROP TRIGGER {detail}`); keep audit triggers off the inbox and \
                     its partitions"
                ),
            )),
            "row security" => problems.push(problem(
                format!("row-level security on `{detail}`, applied to this role"),
                "its policies hide other sessions' markers from this role: the inbox's unique \
                 index still refuses a marker of the same key and consumer, but the duplicate's \
                 marker reads as absent, and every such delivery fails as a fault instead of \
                 answering Duplicate",
                format!(
                    "ALTER TABLE {detail} DISABLE ROW LEVEL SECURITY (key each tenant's \
                     messages by the tenant, `(tenant, id)`, or give each tenant its own \
                     consumer name), or run the consumers as a role with BYPASSRLS"
                ),
            )),
            "rule" => problems.push(problem(
                format!("rule `{detail}`"),
                "a rule can rewrite or swallow the marker's insert",
                format!("DROP RULE {detail} ON {table}"),
            )),
            "child" => problems.push(problem(
                format!("inheritance child `{detail}`"),
                "the unique index does not cover a child's rows, and statements on the \
                 parent read them",
                format!("ALTER TABLE {detail} NO INHERIT {table}"),
            )),
            "index invalid" => problems.push(problem(
                format!("index `{index}` is invalid"),
                "an index left by a failed CREATE UNIQUE INDEX CONCURRENTLY enforces nothing \
                 reliably and cannot serve ON CONFLICT",
                format!("REINDEX INDEX CONCURRENTLY {index}"),
            )),
            "index partial" => problems.push(problem(
                format!("index `{index}` is partial"),
                "ON CONFLICT (message_id, consumer) does not match a partial index, and it \
                 would not cover rows outside its predicate: every delivery would fail",
                format!("recreate it without WHERE (`CREATE UNIQUE INDEX … ON {table} (message_id, consumer)`)"),
            )),
            "index deferrable" => problems.push(problem(
                format!("constraint `{detail}` is DEFERRABLE"),
                "ON CONFLICT does not work with a deferrable constraint, and a deferred check \
                 would find a duplicate only at COMMIT, after the body ran",
                format!("ALTER TABLE {table} ALTER CONSTRAINT {detail} NOT DEFERRABLE"),
            )),
            "index prefix" => problems.push(problem(
                format!("index `{index}` is on a prefix of `{detail}`"),
                "keys (or consumer names) that share the prefix would share one marker",
                format!("recreate it on the whole columns (`UNIQUE KEY {index} (message_id, consumer)`)"),
            )),
            "other unique" if !harmless_unique(backend, detail) => problems.push(problem(
                format!("the unique index `{detail}`"),
                "a marker insert that violates another unique index is not a duplicate to the \
                 runtime: every delivery (or every redelivery) of such a message would fail, \
                 where the inbox's index alone decides",
                match backend {
                    Backend::Mysql => "drop it; the primary key belongs on `id` alone".into(),
                    _ => "drop it, or make it cover (message_id, consumer)".into(),
                },
            )),
            // MariaDB's duplicate-key error names the index but not its table: a business
            // table's violation of an index of the same name would read as the inbox's own,
            // and the message be acknowledged as a duplicate and lost.
            "index name elsewhere" => problems.push(problem(
                format!("`{detail}` has a unique index named `{index}` too"),
                "MariaDB's duplicate-key error names the index, not its table: a violation of \
                 that table's index inside a handler would be taken for the inbox's duplicate, \
                 and the message acknowledged without its change",
                format!("rename one of them (`ALTER TABLE {detail} RENAME INDEX {index} TO …`), or give the inbox's another name (`constraint = \"…\"` on the handler and in the migration)"),
            )),
            "index collation" => problems.push(problem(
                format!("index `{index}` compares with the collation `{detail}`, not byte by byte"),
                "the index would call a new consumer's marker (`Credit`) a duplicate of \
                 another's (`credit`): its messages answered Duplicate, or never processed",
                format!("recreate it without COLLATE (`CREATE UNIQUE INDEX {index} ON {table} (message_id, consumer)`)"),
            )),
            "flush log" => problems.push(problem(
                "innodb_flush_log_at_trx_commit = 0 on a server outside a Galera cluster".into(),
                "a commit the server acknowledged can vanish when the server crashes (about a \
                 second of commits): a message acknowledged to the broker would be lost, a \
                 claim or a stamp would vanish after its side effect ran, and the effect run \
                 again",
                "SET GLOBAL innodb_flush_log_at_trx_commit = 1 (and in the server's \
                 configuration); 2 keeps commits through a crash of the server, not of the \
                 machine"
                    .into(),
            )),
            "clock" => problems.push(problem(
                format!("the session's clock set to {detail} (`SET timestamp`)"),
                "leases and processed_at are written with the session's clock: a live claim \
                 would be taken over, a fresh marker purged",
                "SET timestamp = DEFAULT on the session".into(),
            )),
            // Read-only by a setting of the consumers' role, on a server that takes writes:
            // every connection of the role gets it, and it does not pass. A standby's
            // sessions, a primary fenced by its configuration (`ALTER SYSTEM`, as failover
            // tools do), a database frozen for maintenance (`ALTER DATABASE`) or a session
            // set so are not refused: a new connection may reach the new primary, or the
            // freeze end (`Reconnect`, paused by the pumps' outage gate).
            "read only" => problems.push(problem(
                format!(
                    "default_transaction_read_only = on, set for the role{} on a server that \
                     takes writes",
                    match detail {
                        "user" => "",
                        _ => " in this database",
                    }
                ),
                "every handler's transaction would be refused its first write, and a new \
                 connection gets the same setting: each delivery answered Reconnect until the \
                 broker's delivery limit dead-lettered it",
                "remove it from the role, database or pool setup (`ALTER ROLE … RESET \
                 default_transaction_read_only`), or point the consumers at a server meant \
                 for writes"
                    .into(),
            )),
            "synchronous_commit" => problems.push(problem(
                "synchronous_commit = off on this session".into(),
                "a commit the server acknowledged can vanish in a crash: a message acknowledged \
                 to the broker would be lost, a claim would vanish after its side effect ran",
                "remove it from the role, database or pool setup (`SET synchronous_commit = on`)"
                    .into(),
            )),
            // Claim mode stamps, takes over and releases its claims with `UPDATE` and
            // `DELETE`, which the server refuses on such a table after the side effect ran.
            "unidentified" if claim => problems.push(problem(
                format!(
                    "`{detail}` is published for updates or deletes without a replica identity"
                ),
                "claim mode stamps its claims with UPDATE and releases them with DELETE, which \
                 the server then refuses — after the side effect ran, so that it would run \
                 again once the lease ends",
                format!(
                    "give it one (`ALTER TABLE {detail} REPLICA IDENTITY FULL`, or a primary \
                     key), or leave it out of the publication"
                ),
            )),
            "unidentified" => {}
            "exit_on_error" => problems.push(problem(
                "exit_on_error = on on this session".into(),
                "the runtime meets errors it expects — a redelivery's unique violation, its \
                 marker statement not yet prepared on a new server session — and the server \
                 would end the session at each: every delivery would fail as a lost \
                 connection, for ever",
                "remove it from the role, database or pool setup (`ALTER ROLE … RESET \
                 exit_on_error`, `SET exit_on_error = off`)"
                    .into(),
            )),
            "collation" => problems.push(problem(
                format!("`consumer` has the nondeterministic collation `{detail}`"),
                "names that the collation calls equal (`Credit`, `credit`) would share \
                 markers",
                format!("ALTER TABLE {table} ALTER COLUMN consumer TYPE TEXT COLLATE \"C\""),
            )),
            "encoding" if key_text => problems.push(problem(
                format!("the database encoding {detail}"),
                "`key_text` must hold any key's text, and a key with a character the \
                 encoding lacks would fail on every delivery",
                "drop `key_text` (nothing reads it) or use a UTF8 database".into(),
            )),
            "shadowed" => problems.push(problem(
                format!("a temporary table `{detail}`"),
                "it hides the table from this connection's statements; its markers are gone \
                 with the connection",
                format!("drop the temporary table, or name the table `main.{table}`"),
            )),
            "privilege" => privileges.push(detail.to_owned()),
            _ => {}
        }
    }
    if !privileges.is_empty() {
        problems.push(SchemaProblem::Unsupported {
            found: format!("no privilege {}", privileges.join(", ")),
            why: "the handler's statements would be refused on every delivery",
            fix: format!(
                "GRANT SELECT, INSERT{} ON {table} TO the handler's role",
                match privileges.iter().any(|p| p.starts_with("UPDATE")) {
                    true => ", UPDATE",
                    false => "",
                }
            ),
        });
    }
    problems
}

/// A resolved table name, or an SQLite database's file, kept for the life of the process:
/// one per table a handler's name resolved to, and per database file checked.
pub(crate) fn intern(name: &str) -> &'static str {
    static NAMES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    match names.iter().find(|known| **known == name) {
        Some(known) => known,
        None => {
            let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
            names.push(leaked);
            leaked
        }
    }
}
