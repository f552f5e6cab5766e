//! The startup check: does the database hold the inbox table the runtime expects?

use std::fmt;

use diesel::QueryResult;
use diesel::sql_types::{BigInt, Text};
use inbox_core::InboxSchema;

use crate::dialect::Dialect;
use crate::dialect::Sql;
use crate::dialect::layout::{Layout, SessionMark};
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
        /// Its columns, in order.
        found: Vec<String>,
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
        }
    }
}

/// Why [`verify`](crate::schema::verify) failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum SchemaError {
    /// The table differs from what the runtime needs, in each of these ways.
    Mismatch {
        /// The table checked.
        table: &'static str,
        /// Everything found wrong.
        problems: Vec<SchemaProblem>,
    },
    /// Reading the catalog failed.
    Database(diesel::result::Error),
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaError::Mismatch { table, problems } => {
                write!(
                    f,
                    "the inbox table `{table}` is not as the runtime needs it: "
                )?;
                for (n, problem) in problems.iter().enumerate() {
                    if n > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{problem}")?;
                }
                f.write_str(" (generate the table with `inbox-diesel migration generate`)")
            }
            SchemaError::Database(_) => f.write_str("reading the inbox table's definition failed"),
        }
    }
}

impl std::error::Error for SchemaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SchemaError::Database(e) => Some(e),
            SchemaError::Mismatch { .. } => None,
        }
    }
}

/// The catalog's view of the inbox table: its columns and the named index.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    columns: Vec<ColumnRow>,
    index: Vec<IndexRow>,
    /// `VERSION()` on MySQL and MariaDB; empty elsewhere.
    server: String,
}

#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct ColumnRow {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    type_name: String,
}

#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct ServerRow {
    #[diesel(sql_type = Text)]
    pub(crate) version: String,
}

/// The server's version, read with the catalog on MySQL and MariaDB.
pub(crate) const SERVER_VERSION_SQL: &str = "SELECT CAST(VERSION() AS CHAR) AS version";

#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct IndexRow {
    #[diesel(sql_type = BigInt)]
    is_unique: i64,
    #[diesel(sql_type = Text)]
    name: String,
}

/// The catalog queries of each backend. Binds: the table's qualifier (`''` when none) and
/// its name; the index query then the index name.
pub(crate) fn catalog_sql(backend: Backend) -> (&'static str, &'static str) {
    match backend {
        Backend::Postgres => (
            "SELECT a.attname::text AS name, format_type(a.atttypid, a.atttypmod) AS type_name \
             FROM pg_attribute a WHERE a.attrelid = to_regclass(CASE WHEN $1 = '' \
             THEN quote_ident($2) ELSE quote_ident($1) || '.' || quote_ident($2) END) \
             AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            "SELECT CASE WHEN i.indisunique THEN 1 ELSE 0 END::int8 AS is_unique, \
             a.attname::text AS name FROM pg_index i \
             JOIN pg_class c ON c.oid = i.indexrelid \
             CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE i.indrelid = to_regclass(CASE WHEN $1 = '' THEN quote_ident($2) \
             ELSE quote_ident($1) || '.' || quote_ident($2) END) AND c.relname = $3 \
             ORDER BY k.ord",
        ),
        Backend::Mysql => (
            "SELECT CAST(column_name AS CHAR) AS name, CAST(CONCAT(column_type, \
             IFNULL(CONCAT(' collate ', collation_name), '')) AS CHAR) AS type_name \
             FROM information_schema.columns \
             WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ? \
             ORDER BY ordinal_position",
            "SELECT CAST(1 - non_unique AS SIGNED) AS is_unique, \
             CAST(column_name AS CHAR) AS name FROM information_schema.statistics \
             WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ? \
             AND index_name = ? ORDER BY seq_in_index",
        ),
        Backend::Sqlite => (
            "SELECT name, type AS type_name \
             FROM pragma_table_info(?2, COALESCE(NULLIF(?1, ''), 'main')) ORDER BY cid",
            "SELECT CAST(l.\"unique\" AS BIGINT) AS is_unique, i.name AS name \
             FROM pragma_index_list(?2, COALESCE(NULLIF(?1, ''), 'main')) AS l, \
             pragma_index_info(l.name, COALESCE(NULLIF(?1, ''), 'main')) AS i \
             WHERE l.name = ?3 ORDER BY i.seqno",
        ),
    }
}

/// Reads the [`Catalog`] of `schema`'s table.
async fn read_catalog<S: Io>(io: &mut S, schema: &InboxSchema) -> QueryResult<Catalog> {
    let backend = S::Backend::BACKEND;
    let (columns_sql, index_sql) = catalog_sql(backend);
    let (qualifier, name) = match schema.table().rsplit_once('.') {
        Some((qualifier, name)) => (qualifier, name),
        None => ("", schema.table()),
    };
    let columns = io
        .load(&Sql::new(columns_sql).bind_text(qualifier).bind_text(name))
        .await?;
    let index = io
        .load(
            &Sql::new(index_sql)
                .bind_text(qualifier)
                .bind_text(name)
                .bind_text(schema.constraint()),
        )
        .await?;
    let server = match backend {
        Backend::Mysql => io
            .load::<ServerRow>(&Sql::new(SERVER_VERSION_SQL))
            .await?
            .into_iter()
            .next()
            .map(|row| row.version)
            .unwrap_or_default(),
        Backend::Postgres | Backend::Sqlite => String::new(),
    };
    Ok(Catalog {
        columns,
        index,
        server,
    })
}

/// The startup check on one connection: reads the catalog, compares, and on MySQL and
/// MariaDB marks the session as checked ([`SessionMark`]).
pub(crate) async fn check_table<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
) -> Result<Layout, SchemaError> {
    let catalog = read_catalog(io, schema)
        .await
        .map_err(SchemaError::Database)?;
    let layout = check(S::Backend::BACKEND, schema, catalog)?;
    if let Some(mark) = layout.session_mark {
        io.execute(&Sql::new(mark.set_sql()))
            .await
            .map_err(SchemaError::Database)?;
    }
    Ok(layout)
}

/// Each column the runtime uses, and the types it works with on each backend: a prefix of
/// the catalog's type name, compared case-insensitively.
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
            &["varchar", "text"],
            &["text"],
        ],
        "text",
    ),
    (
        "received_at",
        [
            &["timestamp"],
            &["datetime", "timestamp"],
            &["timestamp", "datetime", "text"],
        ],
        "a timestamp",
    ),
    (
        "processed_at",
        [
            &["timestamp"],
            &["datetime", "timestamp"],
            &["timestamp", "datetime", "text"],
        ],
        "a timestamp",
    ),
    (
        "claimed_until",
        [
            &["timestamp"],
            &["datetime", "timestamp"],
            &["timestamp", "datetime", "text"],
        ],
        "a timestamp",
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

/// The optional column the runtime fills when the table has it, and the types it accepts:
/// the key as text, for operators and for migrating from a table of text ids
/// (`inbox-diesel migration generate --with key_text`).
const KEY_TEXT: (&str, [&[&str]; 3], &str) = (
    "key_text",
    [
        &["text", "character varying"],
        &["text", "mediumtext", "longtext", "varchar"],
        &["text"],
    ],
    "text",
);

/// Compares what the catalog says with what the runtime needs, and says which optional
/// columns the table has.
pub(crate) fn check(
    backend: Backend,
    schema: &InboxSchema,
    catalog: Catalog,
) -> Result<Layout, SchemaError> {
    let mut layout = Layout {
        key_text: false,
        mariadb: backend == Backend::Mysql && catalog.server.contains("MariaDB"),
        session_mark: (backend == Backend::Mysql).then(|| SessionMark::new(schema)),
    };
    let mut problems = Vec::new();
    if catalog.columns.is_empty() {
        problems.push(SchemaProblem::MissingTable {
            table: schema.table().to_owned(),
        });
    } else {
        let slot = match backend {
            Backend::Postgres => 0,
            Backend::Mysql => 1,
            Backend::Sqlite => 2,
        };
        layout.key_text = catalog.columns.iter().any(|c| c.name == KEY_TEXT.0);
        // The optional column is checked only when the table has it.
        let optional = layout.key_text.then_some(&KEY_TEXT);
        for &(column, types, expected) in COLUMNS.iter().chain(optional) {
            match catalog.columns.iter().find(|c| c.name == column) {
                None => problems.push(SchemaProblem::MissingColumn { column }),
                Some(found) => {
                    let type_name = found.type_name.to_ascii_lowercase();
                    if !types[slot].iter().any(|t| type_name.starts_with(t)) {
                        problems.push(SchemaProblem::WrongType {
                            column,
                            found: found.type_name.clone(),
                            expected,
                        });
                    } else if backend == Backend::Mysql
                        && column == "consumer"
                        && !type_name.contains("_bin")
                    {
                        // A case- or accent-insensitive collation would let `Credit` share the
                        // markers of `credit`.
                        problems.push(SchemaProblem::WrongType {
                            column,
                            found: found.type_name.clone(),
                            expected: "VARCHAR(200) with a binary collation (utf8mb4_bin), so \
                                       that consumer names compare byte by byte",
                        });
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
    }
    match problems.is_empty() {
        true => Ok(layout),
        false => Err(SchemaError::Mismatch {
            table: schema.table(),
            problems,
        }),
    }
}
