//! The startup check's catalog reads on each backend: the table's columns and index, the
//! facts the check refuses (triggers, rules, engines, privileges, settings), as SQL text; the
//! check that runs them and weighs the answers is `schema::check`.

use crate::dialect::Backend;

/// MySQL and MariaDB: a server that does not write its log at each commit
/// (`innodb_flush_log_at_trx_commit = 0`), outside a Galera cluster (whose nodes recover
/// each other's commits): a row when so. The variables are read from MariaDB's
/// `information_schema` or MySQL's `performance_schema`, where `wsrep_on` may not exist.
pub(crate) fn mysql_durability_sql(server: &str) -> String {
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
pub(crate) const PG_REL: &str = "to_regclass(CASE WHEN $1 = '' THEN quote_ident($2) \
     ELSE quote_ident($1) || '.' || quote_ident($2) END)";

/// MySQL and MariaDB: the table's database, without an empty-string literal (which
/// `EMPTY_STRING_IS_NULL` reads as NULL). Binds the qualifier twice.
pub(crate) const MYSQL_SCHEMA: &str = "IF(IFNULL(CHAR_LENGTH(?), 0) = 0, DATABASE(), ?)";

/// MySQL and MariaDB: every row of a `SELECT` whatever the session's `sql_select_limit`
/// (which a `SELECT` with a `LIMIT` of its own ignores): a session with `sql_select_limit = 1`
/// (MySQL Workbench's safe mode sets 1000) read one column of the table and refused it.
pub(crate) const MYSQL_ALL_ROWS: &str = "LIMIT 18446744073709551615";

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
pub(crate) fn sqlite_key_index(schema: &str) -> String {
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
pub(crate) fn facts_sql(backend: Backend, qualifier: &str, needs: &[(&str, &str)]) -> String {
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
                 AND has_schema_privilege(n.oid, 'USAGE') \
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
