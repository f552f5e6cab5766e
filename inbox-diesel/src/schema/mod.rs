//! The inbox table: its SQL for each backend, and its diesel `table!`.
//!
//! | column | PostgreSQL | MySQL, MariaDB | SQLite | why |
//! |---|---|---|---|---|
//! | `id` | `BIGINT GENERATED ALWAYS AS IDENTITY` primary key | `BIGINT AUTO_INCREMENT` primary key | `INTEGER PRIMARY KEY NOT NULL` (the rowid) | new rows land at the end of the primary-key (on InnoDB, clustered) index |
//! | `message_id` | `UUID` | `BINARY(16)` | `BLOB` (16 bytes) | [`MessageKey::stored_id`](crate::MessageKey::stored_id): a fixed 16 bytes keeps the unique index narrow (37 bytes as text) and compares as memory, not by collation |
//! | `consumer` | `TEXT COLLATE "C"` | `VARCHAR(200)` `utf8mb4_bin` | `TEXT` | byte-wise comparison: the name is an identifier, not prose, so locale-aware collation would only cost time; 200 bytes is the name's limit |
//! | `received_at` | `TIMESTAMPTZ DEFAULT now()` | `DATETIME(6) DEFAULT (UTC_TIMESTAMP(6))` | `TIMESTAMP DEFAULT CURRENT_TIMESTAMP` (text, UTC) | when the marker was written; every time the runtime writes or compares is UTC, taken from the database's clock, whatever a session's time zone |
//! | `processed_at` | `TIMESTAMPTZ` | `DATETIME(6)` | `TIMESTAMP` | when the work committed; written in the same statement in transaction mode; NULL while a claim is open |
//! | `claimed_until` | `TIMESTAMPTZ` | `DATETIME(6)` | `TIMESTAMP` (text, milliseconds) | claim mode: the end of the claim's lease; NULL once completed, or when a failed attempt released the claim |
//! | `attempts` | `INTEGER DEFAULT 1` | `INT DEFAULT 1` | `INTEGER DEFAULT 1` | claim mode: how many deliveries claimed the key; each claim-mode statement names its attempt, so a claim taken over is never stamped by the delivery that lost it |
//! | `key_text` (optional) | `TEXT` | `MEDIUMTEXT` `utf8mb4` | `TEXT` | the key as text, for operators; written when the table has it (`--with key_text`, [`Backend::add_key_text_sql`]) |
//! | `result` (optional) | `JSONB` | `JSON` | `TEXT` | the `Ok` value of a handler with `store_result`, as JSON, replayed to its duplicates; required by such a handler (`--with result`, [`Backend::add_result_sql`]) |
//! | `fingerprint` (optional) | `BYTEA` | `BINARY(32)` | `BLOB` | the SHA-256 digest of the request of a handler with `fingerprint = …`; another request under the key is refused; required by such a handler (`--with fingerprint`, [`Backend::add_fingerprint_sql`]) |
//!
//! and the unique index `ux_inbox_message_consumer` on `(message_id, consumer)`, whose
//! violation — and no other — means "already processed". `message_id` leads the index: it is
//! the selective column. An index on `processed_at` lets [`purge`](crate::purge) take the
//! oldest rows in small batches without scanning the table.
//!
//! The easiest way to create it is the migration the `inbox-diesel` command writes into a
//! diesel project (see [`migration`]):
//!
//! ```text
//! cargo install inbox-diesel
//! inbox-diesel migration generate      # backend from DATABASE_URL, like the diesel CLI
//! diesel migration run
//! ```
//!
//! The same SQL is [`Backend::create_table_sql`] (and `postgres::create_table_sql`, … with
//! the backend's feature), for custom table and index names through an [`InboxSchema`]. The
//! `table!` of each backend is what `diesel print-schema` prints for that table, and
//! [`verify`] checks at startup that the database has it.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use diesel::connection::SimpleConnection;
//! use diesel::prelude::*;
//! use inbox_diesel::{InboxSchema, schema};
//!
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! conn.batch_execute(&schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))?;
//! let markers: i64 = schema::sqlite::inbox::table.count().get_result(&mut conn)?;
//! assert_eq!(markers, 0);
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use inbox_core::InboxSchema;

pub(crate) mod check;
pub mod migration;

pub use check::{SchemaError, SchemaProblem};

/// Checks, at startup, that the inbox table on `conn` is what the runtime needs: the table,
/// each column with a type the runtime works with, and the unique index the classifier
/// recognises duplicates by — named `schema.constraint()`, unique, on
/// `(message_id, consumer)`. Every difference is reported, each in words. On PostgreSQL,
/// outside any transaction, it also opens one and rolls it back: PgBouncer in statement mode
/// closes the session there, and is refused by name (each handler's own check does not
/// probe; there it is a lost connection).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::connection::SimpleConnection;
/// use diesel::prelude::*;
/// use inbox_diesel::{InboxSchema, schema};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// conn.batch_execute(&schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))?;
/// schema::verify(&mut conn, &InboxSchema::DEFAULT)?;
///
/// conn.batch_execute("DROP INDEX ux_inbox_message_consumer")?;
/// let error = schema::verify(&mut conn, &InboxSchema::DEFAULT).unwrap_err();
/// assert!(error.to_string().contains("unique index `ux_inbox_message_consumer` on (message_id, consumer) is missing"));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`SchemaError::Mismatch`] listing each problem, [`SchemaError::Session`] for a session
/// that cannot be used whatever the table, or [`SchemaError::Database`] when the catalog
/// could not be read.
pub fn verify<C: crate::HandlerConnection>(
    conn: &mut C,
    schema: &InboxSchema,
) -> Result<(), SchemaError> {
    verify_for(conn, schema, Needs::default())
}

/// What the handlers on an inbox table need of it beyond the shipped table, for
/// [`verify_for`]: the optional columns they write (`store_result`, `fingerprint = …`,
/// `key_text`), and whether one runs in claim mode (its claims are updated: the `UPDATE`
/// privilege).
///
/// ```
/// use inbox_diesel::schema::Needs;
///
/// let needs = Needs::default().result().fingerprint().claim();
/// assert!(needs != Needs::default());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    columns: OptionalColumns,
    claim: bool,
}

impl Needs {
    /// A handler stores its results (`store_result = true`): the `result` column.
    pub const fn result(mut self) -> Self {
        self.columns.result = true;
        self
    }

    /// A handler keeps its requests' fingerprints (`fingerprint = …`, `inbox-axum`): the
    /// `fingerprint` column.
    pub const fn fingerprint(mut self) -> Self {
        self.columns.fingerprint = true;
        self
    }

    /// Operators read each marker's key as text: the `key_text` column.
    pub const fn key_text(mut self) -> Self {
        self.columns.key_text = true;
        self
    }

    /// A handler runs in claim mode: the privilege to update the markers, and on MySQL and
    /// MariaDB a session with `autocommit` on (claim mode commits each statement on its own).
    pub const fn claim(mut self) -> Self {
        self.claim = true;
        self
    }
}

/// [`verify`], and what the application's handlers need of the table beyond it
/// ([`Needs`]): a startup check that refuses a table without the `result` column a
/// `store_result` handler writes, instead of each of its deliveries being refused.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::connection::SimpleConnection;
/// use diesel::prelude::*;
/// use inbox_diesel::schema::{self, Needs};
/// use inbox_diesel::InboxSchema;
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// conn.batch_execute(&schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))?;
/// let error = schema::verify_for(&mut conn, &InboxSchema::DEFAULT, Needs::default().result())
///     .unwrap_err();
/// assert!(error.to_string().contains("no `result` column"), "{error}");
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`verify`], with a missing column each handler would need among the problems.
pub fn verify_for<C: crate::HandlerConnection>(
    conn: &mut C,
    schema: &InboxSchema,
    needs: Needs,
) -> Result<(), SchemaError> {
    struct Verify<'s>(&'s InboxSchema, Needs);
    impl crate::backends::OnBackend for Verify<'_> {
        type Output = Result<(), SchemaError>;
        fn run<C: crate::InboxConnection>(self, conn: &mut C) -> Self::Output {
            let layout = verify_layout(conn, self.0, self.1.claim)?;
            has_what_is_needed(self.0, layout, self.1)?;
            let io = &mut crate::io::Blocking(conn);
            if self.1.claim {
                crate::io::complete_now(crate::schema::check::refuse_autocommit_off(io, self.0))?;
            }
            crate::io::complete_now(crate::schema::check::refuse_statement_pooling(io, self.0))
        }
    }
    crate::backends::on_backend(conn, Verify(schema, needs))
}

/// The optional columns `needs` names and `layout` lacks, refused: at startup
/// ([`verify_for`]) and by each handler's first delivery on a connection.
pub(crate) fn has_what_is_needed(
    schema: &InboxSchema,
    layout: crate::dialect::layout::Layout,
    needs: Needs,
) -> Result<(), SchemaError> {
    let wanted = [
        (needs.columns.result && !layout.result, "result"),
        (
            needs.columns.fingerprint && !layout.fingerprint,
            "fingerprint",
        ),
        (needs.columns.key_text && !layout.key_text, "key_text"),
    ];
    let problems: Vec<SchemaProblem> = wanted
        .into_iter()
        .filter(|(missing, _)| *missing)
        .map(|(_, column)| missing_column(column))
        .collect();
    match problems.is_empty() {
        true => Ok(()),
        false => Err(SchemaError::Mismatch {
            table: schema.table(),
            resolved: None,
            problems,
        }),
    }
}

/// An optional column a handler writes, missing: what it is for and how to add it.
fn missing_column(column: &'static str) -> SchemaProblem {
    let why = match column {
        "result" => "the handler stores its result with its marker (`store_result`)",
        "fingerprint" => {
            "the handler keeps the request's fingerprint with its marker (`fingerprint`)"
        }
        _ => "operators read each marker's key as text there",
    };
    SchemaProblem::Unsupported {
        found: format!("no `{column}` column"),
        why,
        fix: format!(
            "add it: `inbox-diesel migration generate --with {column}` (a new table) or \
             `--add {column}`"
        ),
    }
}

/// [`verify`], saying which optional columns the table has; `claim` for a claim-mode
/// handler's privileges.
pub(crate) fn verify_layout<C: crate::InboxConnection>(
    conn: &mut C,
    schema: &InboxSchema,
    claim: bool,
) -> Result<crate::dialect::layout::Layout, SchemaError> {
    crate::io::complete_now(crate::schema::check::check_table(
        &mut crate::io::Blocking(conn),
        schema,
        claim,
    ))
}

/// [`verify`] on a diesel-async connection.
///
/// # Errors
/// As [`verify`].
#[cfg(feature = "async")]
pub async fn verify_async<C: crate::AsyncInboxConnection>(
    conn: &mut C,
    schema: &InboxSchema,
) -> Result<(), SchemaError> {
    verify_for_async(conn, schema, Needs::default()).await
}

/// [`verify_for`] on a diesel-async connection.
///
/// # Errors
/// As [`verify_for`].
#[cfg(feature = "async")]
pub async fn verify_for_async<C: crate::AsyncInboxConnection>(
    conn: &mut C,
    schema: &InboxSchema,
    needs: Needs,
) -> Result<(), SchemaError> {
    let layout = verify_layout_async(conn, schema, needs.claim).await?;
    has_what_is_needed(schema, layout, needs)?;
    let io = &mut crate::io::Awaiting(conn);
    if needs.claim {
        crate::schema::check::refuse_autocommit_off(io, schema).await?;
    }
    crate::schema::check::refuse_statement_pooling(io, schema).await
}

/// [`verify_async`], saying which optional columns the table has.
#[cfg(feature = "async")]
pub(crate) async fn verify_layout_async<C: crate::AsyncInboxConnection>(
    conn: &mut C,
    schema: &InboxSchema,
    claim: bool,
) -> Result<crate::dialect::layout::Layout, SchemaError> {
    crate::schema::check::check_table(&mut crate::io::Awaiting(conn), schema, claim).await
}

pub use crate::dialect::{Backend, UnknownBackend};

/// The optional columns of an inbox table
/// ([`Backend::create_table_with_sql`]): each one the runtime writes when the table has it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OptionalColumns {
    /// `key_text`: each marker's key as text, for operators.
    pub key_text: bool,
    /// `result`: the value of a handler with `store_result`.
    pub result: bool,
    /// `fingerprint`: the request's digest, of a handler with `fingerprint = …`.
    pub fingerprint: bool,
    /// SQLite only: the lean design — a `WITHOUT ROWID` table keyed by
    /// `(message_id, consumer)`, with neither the `id` column nor the index on `processed_at`.
    /// Each commit writes fewer pages to the WAL (a marker is one row in one b-tree instead
    /// of a row and two index entries); the purge then scans the table once per run instead
    /// of taking the oldest rows from the index (see [`purge`](crate::purge)). The other
    /// backends keep the shipped design (`--lean` refuses them).
    pub lean: bool,
}

/// The DDL and the SQL recipes of each backend.
impl Backend {
    /// `CREATE TABLE` and its indexes for `schema` (idempotent: `IF NOT EXISTS`).
    pub fn create_table_sql(self, schema: &InboxSchema) -> String {
        self.create_sql(schema, OptionalColumns::default())
    }

    /// [`create_table_sql`](Self::create_table_sql) with the optional `key_text` column,
    /// where the runtime keeps each marker's key as text (see [`add_key_text_sql`](Self::add_key_text_sql)).
    pub fn create_table_with_key_text_sql(self, schema: &InboxSchema) -> String {
        self.create_sql(
            schema,
            OptionalColumns {
                key_text: true,
                ..OptionalColumns::default()
            },
        )
    }

    /// [`create_table_sql`](Self::create_table_sql) with the optional `result` column,
    /// where a handler with `store_result` keeps its value (see
    /// [`add_result_sql`](Self::add_result_sql)).
    pub fn create_table_with_result_sql(self, schema: &InboxSchema) -> String {
        self.create_sql(
            schema,
            OptionalColumns {
                result: true,
                ..OptionalColumns::default()
            },
        )
    }

    /// [`create_table_sql`](Self::create_table_sql) with the optional columns asked for.
    pub fn create_table_with_sql(self, schema: &InboxSchema, columns: OptionalColumns) -> String {
        self.create_sql(schema, columns)
    }

    fn create_sql(self, schema: &InboxSchema, columns: OptionalColumns) -> String {
        let mut optional = String::new();
        if columns.key_text {
            optional.push_str(&format!("    key_text      {},\n", self.key_text_type()));
        }
        if columns.result {
            optional.push_str(&format!("    result        {},\n", self.result_type()));
        }
        if columns.fingerprint {
            optional.push_str(&format!("    fingerprint   {},\n", self.fingerprint_type()));
        }
        let key_text = optional;
        match self {
            Backend::Postgres => postgres_create(schema, &key_text),
            Backend::Mysql => mysql_create(schema, &key_text),
            Backend::Sqlite if columns.lean => sqlite_lean_create(schema, &key_text),
            Backend::Sqlite => sqlite_create(schema, &key_text),
        }
    }

    /// Adds the optional `key_text` column to an existing inbox table:
    ///
    /// ```sql
    /// ALTER TABLE inbox ADD COLUMN key_text TEXT;   -- MEDIUMTEXT (utf8mb4) on MySQL and MariaDB
    /// ```
    ///
    /// The runtime's startup check finds the column and from then on writes each new marker's
    /// key there as its text (`Display` of [`MessageKey`](crate::MessageKey): the text itself,
    /// the integer in decimal, the UUID hyphenated, bytes in hex, `topic/partition@offset`,
    /// `source#id`; a NUL character as U+FFFD, which PostgreSQL's text cannot hold), for
    /// operators reading the table; rows written before stay `NULL`. The
    /// column is not indexed and nothing reads it: deduplication goes by `message_id` alone.
    /// Connections checked before the column existed go on without it until a new connection
    /// (or thread) runs the handler. Dropping the column again fails the next claim of a
    /// connection that wrote it; the runtime then checks the table again and that delivery
    /// goes in without the column.
    ///
    /// A text key's `key_text` turns back into its `message_id` by
    /// [`text_key_sql`](Self::text_key_sql).
    ///
    /// ```
    /// use inbox_diesel::InboxSchema;
    /// use inbox_diesel::schema::Backend;
    ///
    /// assert_eq!(
    ///     Backend::Postgres.add_key_text_sql(&InboxSchema::DEFAULT),
    ///     "ALTER TABLE \"inbox\" ADD COLUMN key_text TEXT;\n"
    /// );
    /// ```
    pub fn add_key_text_sql(self, schema: &InboxSchema) -> String {
        self.add_column_sql(schema, "key_text", self.key_text_type())
    }

    /// Adds the optional `result` column to an existing inbox table, where a handler with
    /// `store_result` keeps its `Ok` value as JSON, written in the same transaction as the
    /// marker, and read back by a later delivery of the message:
    ///
    /// ```sql
    /// ALTER TABLE inbox ADD COLUMN result JSONB;   -- JSON on MySQL and MariaDB, TEXT on SQLite
    /// ```
    ///
    /// A handler with `store_result` refuses a table without it, before anything is written.
    /// Rows written before stay `NULL`: their duplicates answer `stored: None`. Stored
    /// results make rows larger (up to
    /// [`MAX_STORED_RESULT_BYTES`](crate::MAX_STORED_RESULT_BYTES) each): the purge removes
    /// them with their markers.
    ///
    /// ```
    /// use inbox_diesel::InboxSchema;
    /// use inbox_diesel::schema::Backend;
    ///
    /// assert_eq!(
    ///     Backend::Postgres.add_result_sql(&InboxSchema::DEFAULT),
    ///     "ALTER TABLE \"inbox\" ADD COLUMN result JSONB;\n"
    /// );
    /// ```
    pub fn add_result_sql(self, schema: &InboxSchema) -> String {
        self.add_column_sql(schema, "result", self.result_type())
    }

    /// Drops the optional `result` column (the `down.sql` of [`add_result_sql`](Self::add_result_sql)).
    pub fn drop_result_sql(self, schema: &InboxSchema) -> String {
        self.drop_column_sql(schema, "result")
    }

    /// Adds the optional `fingerprint` column to an existing inbox table, where a handler
    /// with `fingerprint = …` keeps the SHA-256 digest of its request with the marker; a
    /// later delivery of the key with another digest is refused
    /// ([`Error::KeyReused`](crate::Error::KeyReused)):
    ///
    /// ```sql
    /// ALTER TABLE inbox ADD COLUMN fingerprint BYTEA;   -- BINARY(32) on MySQL and MariaDB, BLOB on SQLite
    /// ```
    ///
    /// A handler with a fingerprint refuses a table without it. Markers written before have
    /// none, and are not known to differ from any request.
    pub fn add_fingerprint_sql(self, schema: &InboxSchema) -> String {
        self.add_column_sql(schema, "fingerprint", self.fingerprint_type())
    }

    /// Drops the optional `fingerprint` column (the `down.sql` of
    /// [`add_fingerprint_sql`](Self::add_fingerprint_sql)).
    pub fn drop_fingerprint_sql(self, schema: &InboxSchema) -> String {
        self.drop_column_sql(schema, "fingerprint")
    }

    /// `ALTER TABLE … ADD COLUMN <column> <type>`: an optional column added.
    fn add_column_sql(self, schema: &InboxSchema, column: &str, type_name: &str) -> String {
        format!(
            "ALTER TABLE {} ADD COLUMN {column} {type_name};\n",
            self.quote_table(schema.table())
        )
    }

    /// `ALTER TABLE … DROP COLUMN <column>`: an optional column dropped again.
    fn drop_column_sql(self, schema: &InboxSchema, column: &str) -> String {
        format!(
            "ALTER TABLE {} DROP COLUMN {column};\n",
            self.quote_table(schema.table())
        )
    }

    /// The type of `fingerprint`: a SHA-256 digest's 32 bytes.
    fn fingerprint_type(self) -> &'static str {
        match self {
            Backend::Postgres => "BYTEA",
            Backend::Mysql => "BINARY(32)",
            Backend::Sqlite => "BLOB",
        }
    }

    /// The type of `result`: JSON an operator can read (and query, on PostgreSQL).
    fn result_type(self) -> &'static str {
        match self {
            Backend::Postgres => "JSONB",
            Backend::Mysql => "JSON",
            Backend::Sqlite => "TEXT",
        }
    }

    /// Drops the optional `key_text` column (the `down.sql` of [`add_key_text_sql`](Self::add_key_text_sql)).
    pub fn drop_key_text_sql(self, schema: &InboxSchema) -> String {
        self.drop_column_sql(schema, "key_text")
    }

    /// The type of `key_text`: a key is at most 64 KiB of text, its bytes in hex 128 KiB,
    /// past MySQL's `TEXT` (64 KiB).
    fn key_text_type(self) -> &'static str {
        match self {
            // Any key's text, whatever the database's default character set.
            Backend::Mysql => "MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
            Backend::Postgres | Backend::Sqlite => "TEXT",
        }
    }

    /// `DROP TABLE` for `schema` (drops its indexes too).
    pub fn drop_table_sql(self, schema: &InboxSchema) -> String {
        format!(
            "DROP TABLE IF EXISTS {};\n",
            self.quote_table(schema.table())
        )
    }

    /// An SQL expression that computes, from the SQL text expression `text`, the
    /// `message_id` the inbox stores for [`MessageKey::text`](crate::MessageKey::text) of that
    /// text, in this backend's column type — for moving an existing deduplication table, keyed
    /// by its own text ids, into the inbox:
    ///
    /// ```sql
    /// INSERT INTO inbox (message_id, consumer, received_at, processed_at)
    /// SELECT <expression over seen.activity_id>, 'activities', seen.published, seen.published
    /// FROM seen;
    /// ```
    ///
    /// It is the same name-based UUID (version 5, SHA-1) the library derives: PostgreSQL
    /// needs the `pgcrypto` extension for SHA-1 (`CREATE EXTENSION pgcrypto`); MySQL and
    /// MariaDB have it built in. SQLite has no SHA-1 and gets `None`: compute the ids there
    /// with [`MessageKey::stored_id`](crate::MessageKey::stored_id).
    ///
    /// ```
    /// use inbox_diesel::schema::Backend;
    ///
    /// let sql = Backend::Postgres.text_key_sql("seen.activity_id").unwrap();
    /// assert!(sql.contains("digest("));
    /// assert_eq!(Backend::Sqlite.text_key_sql("seen.activity_id"), None);
    /// ```
    pub fn text_key_sql(self, text: &str) -> Option<String> {
        let namespace = crate::MessageKey::NAMESPACE.simple();
        match self {
            // digest(NAMESPACE || 't' || length as 4 bytes big-endian || UTF-8 bytes), the
            // first 16 bytes with the version (5) and variant (10xx) bits set.
            Backend::Postgres => {
                let bytes = format!("convert_to({text}, 'UTF8')");
                let digest = format!(
                    "digest(decode('{namespace}74', 'hex') || int4send(octet_length({bytes})) || {bytes}, 'sha1')"
                );
                Some(format!(
                    "(SELECT encode(set_byte(set_byte(substring(d FROM 1 FOR 16), 6, \
                     (get_byte(d, 6) & 15) | 80), 8, (get_byte(d, 8) & 63) | 128), 'hex')::uuid \
                     FROM (SELECT {digest} AS d) AS inbox_key)"
                ))
            }
            // SHA1() answers hex: characters 13 and 17 are the high nibbles of bytes 6 and 8.
            Backend::Mysql => {
                let bytes = format!("CONVERT({text} USING utf8mb4)");
                let hex = format!(
                    "SHA1(CONCAT(UNHEX('{namespace}74'), \
                     UNHEX(LPAD(HEX(OCTET_LENGTH({bytes})), 8, '0')), {bytes}))"
                );
                Some(format!(
                    "UNHEX(CONCAT(SUBSTR({hex}, 1, 12), '5', SUBSTR({hex}, 14, 3), \
                     HEX((CONV(SUBSTR({hex}, 17, 1), 16, 10) & 3) | 8), SUBSTR({hex}, 18, 15)))"
                ))
            }
            Backend::Sqlite => None,
        }
    }
}

/// The name of the index on `processed_at` the schema creates for `table_name`:
/// `ix_<table>_processed_at`, or, where that would pass the 63 bytes every backend takes (a
/// table name of 48 bytes or more), the table name cut short and a digest of it, so that two
/// long names still differ.
pub fn processed_at_index(table_name: &str) -> String {
    let name = format!("ix_{table_name}_processed_at");
    if name.len() <= InboxSchema::MAX_IDENTIFIER_LEN {
        return name;
    }
    let digest = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, table_name.as_bytes()).simple();
    let digest = &digest.to_string()[..8];
    let keep = InboxSchema::MAX_IDENTIFIER_LEN - "ix___processed_at".len() - digest.len();
    format!("ix_{}_{digest}_processed_at", &table_name[..keep])
}

fn postgres_create(schema: &InboxSchema, key_text: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n    \
             id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,\n    \
             message_id    UUID        NOT NULL,\n    \
             consumer      TEXT        COLLATE \"C\" NOT NULL,\n\
             {key_text}    \
             received_at   TIMESTAMPTZ NOT NULL DEFAULT now(),\n    \
             processed_at  TIMESTAMPTZ,\n    \
             claimed_until TIMESTAMPTZ,\n    \
             attempts      INTEGER     NOT NULL DEFAULT 1\n\
         );\n\
         CREATE UNIQUE INDEX IF NOT EXISTS {index} ON {table} (message_id, consumer);\n\
         CREATE INDEX IF NOT EXISTS {processed} ON {table} (processed_at);\n",
        table = Backend::Postgres.quote_table(schema.table()),
        index = Backend::Postgres.quote(schema.constraint()),
        processed = Backend::Postgres.quote(&processed_at_index(schema.table_name())),
    )
}

/// A qualified table name (`aux.inbox`) names an attached database; SQLite then wants the
/// index qualified, not the indexed table.
fn sqlite_create(schema: &InboxSchema, key_text: &str) -> String {
    let quote = |name| Backend::Sqlite.quote(name);
    let (index_prefix, table_name) = match schema.table().rsplit_once('.') {
        Some((database, table)) => (format!("{}.", quote(database)), table),
        None => (String::new(), schema.table()),
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n    \
             id            INTEGER   PRIMARY KEY NOT NULL,\n    \
             message_id    BLOB      NOT NULL,\n    \
             consumer      TEXT      NOT NULL,\n\
             {key_text}    \
             received_at   TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,\n    \
             processed_at  TIMESTAMP,\n    \
             claimed_until TIMESTAMP,\n    \
             attempts      INTEGER   NOT NULL DEFAULT 1\n\
         );\n\
         CREATE UNIQUE INDEX IF NOT EXISTS {index_prefix}{index} \
         ON {name} (message_id, consumer);\n\
         CREATE INDEX IF NOT EXISTS {index_prefix}{processed} \
         ON {name} (processed_at);\n",
        table = Backend::Sqlite.quote_table(schema.table()),
        index = quote(schema.constraint()),
        name = quote(table_name),
        processed = quote(&processed_at_index(table_name)),
    )
}

/// The lean design ([`OptionalColumns::lean`]): the key is the table's own b-tree, named as
/// the inbox's index so that the check finds it by the name it looks for.
fn sqlite_lean_create(schema: &InboxSchema, key_text: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n    \
             message_id    BLOB      NOT NULL,\n    \
             consumer      TEXT      NOT NULL,\n\
             {key_text}    \
             received_at   TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,\n    \
             processed_at  TIMESTAMP,\n    \
             claimed_until TIMESTAMP,\n    \
             attempts      INTEGER   NOT NULL DEFAULT 1,\n    \
             CONSTRAINT {index} PRIMARY KEY (message_id, consumer)\n\
         ) WITHOUT ROWID;\n",
        table = Backend::Sqlite.quote_table(schema.table()),
        index = Backend::Sqlite.quote(schema.constraint()),
    )
}

/// The unique index is named in the table's definition: MySQL has no
/// `CREATE INDEX IF NOT EXISTS`. Error 1062 names this index, which is how a duplicate is
/// recognised.
fn mysql_create(schema: &InboxSchema, key_text: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n    \
             id            BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,\n    \
             message_id    BINARY(16)   NOT NULL,\n    \
             consumer      VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n\
             {key_text}    \
             received_at   DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),\n    \
             processed_at  DATETIME(6)  NULL,\n    \
             claimed_until DATETIME(6)  NULL,\n    \
             attempts      INT          NOT NULL DEFAULT 1,\n    \
             UNIQUE KEY {index} (message_id, consumer),\n    \
             KEY {processed} (processed_at)\n\
         ) ENGINE = InnoDB;\n",
        table = Backend::Mysql.quote_table(schema.table()),
        index = Backend::Mysql.quote(schema.constraint()),
        processed = Backend::Mysql.quote(&processed_at_index(schema.table_name())),
    )
}

/// The PostgreSQL schema.
#[cfg(feature = "postgres")]
pub mod postgres {
    use inbox_core::InboxSchema;

    diesel::table! {
        /// The inbox table as the shipped PostgreSQL schema creates it.
        inbox (id) {
            /// Row id, in insertion order.
            id -> Int8,
            /// The message key's 16-byte stored id.
            message_id -> Uuid,
            /// The consumer name.
            consumer -> Text,
            /// When the marker was written.
            received_at -> Timestamptz,
            /// When the work committed (null while a claim is open).
            processed_at -> Nullable<Timestamptz>,
            /// Claim mode: when the claim's lease ends (null once completed or released).
            claimed_until -> Nullable<Timestamptz>,
            /// Claim mode: the deliveries that claimed this key.
            attempts -> Int4,
        }
    }
    /// `CREATE TABLE` and its indexes for `schema` (idempotent: `IF NOT EXISTS`).
    pub fn create_table_sql(schema: &InboxSchema) -> String {
        super::Backend::Postgres.create_table_sql(schema)
    }

    /// `DROP TABLE` for `schema` (drops its indexes too).
    pub fn drop_table_sql(schema: &InboxSchema) -> String {
        super::Backend::Postgres.drop_table_sql(schema)
    }
}

/// The SQLite schema.
#[cfg(feature = "sqlite")]
pub mod sqlite {
    use inbox_core::InboxSchema;

    diesel::table! {
        /// The inbox table as the shipped SQLite schema creates it.
        inbox (id) {
            /// Row id, in insertion order (the rowid).
            id -> Integer,
            /// The message key's 16-byte stored id.
            message_id -> Binary,
            /// The consumer name.
            consumer -> Text,
            /// When the marker was written.
            received_at -> Timestamp,
            /// When the work committed (null while a claim is open).
            processed_at -> Nullable<Timestamp>,
            /// Claim mode: when the claim's lease ends (null once completed or released).
            claimed_until -> Nullable<Timestamp>,
            /// Claim mode: the deliveries that claimed this key.
            attempts -> Integer,
        }
    }
    /// `CREATE TABLE` and its indexes for `schema` (idempotent: `IF NOT EXISTS`).
    pub fn create_table_sql(schema: &InboxSchema) -> String {
        super::Backend::Sqlite.create_table_sql(schema)
    }

    /// `DROP TABLE` for `schema` (drops its indexes too).
    pub fn drop_table_sql(schema: &InboxSchema) -> String {
        super::Backend::Sqlite.drop_table_sql(schema)
    }
}

/// The MySQL and MariaDB schema (InnoDB).
#[cfg(feature = "mysql")]
pub mod mysql {
    use inbox_core::InboxSchema;

    diesel::table! {
        /// The inbox table as the shipped MySQL/MariaDB schema creates it.
        inbox (id) {
            /// Row id, in insertion order.
            id -> Bigint,
            /// The message key's 16-byte stored id.
            #[max_length = 16]
            message_id -> Binary,
            /// The consumer name.
            #[max_length = 200]
            consumer -> Varchar,
            /// When the marker was written.
            received_at -> Datetime,
            /// When the work committed (null while a claim is open).
            processed_at -> Nullable<Datetime>,
            /// Claim mode: when the claim's lease ends (null once completed or released).
            claimed_until -> Nullable<Datetime>,
            /// Claim mode: the deliveries that claimed this key.
            attempts -> Integer,
        }
    }
    /// `CREATE TABLE` with its indexes for `schema` (idempotent: `IF NOT EXISTS`).
    pub fn create_table_sql(schema: &InboxSchema) -> String {
        super::Backend::Mysql.create_table_sql(schema)
    }

    /// `DROP TABLE` for `schema` (drops its indexes too).
    pub fn drop_table_sql(schema: &InboxSchema) -> String {
        super::Backend::Mysql.drop_table_sql(schema)
    }
}
