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
pub fn verify<C: crate::backends::HandlerConnection>(
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
pub fn verify_for<C: crate::backends::HandlerConnection>(
    conn: &mut C,
    schema: &InboxSchema,
    needs: Needs,
) -> Result<(), SchemaError> {
    struct Verify<'s>(&'s InboxSchema, Needs);
    impl crate::backends::OnBackend for Verify<'_> {
        type Output = Result<(), SchemaError>;
        fn run<C: crate::backends::InboxConnection>(self, conn: &mut C) -> Self::Output {
            let layout = verify_layout(conn, self.0, self.1.claim)?;
            has_what_is_needed(self.0, layout, self.1)?;
            use crate::io::Session;
            let io = &mut crate::io::Blocking(conn);
            if self.1.claim {
                crate::io::complete_now(C::Backend::refuse_autocommit_off(io, self.0))?;
            }
            crate::io::complete_now(C::Backend::refuse_statement_pooling(io, self.0))
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
pub(crate) fn verify_layout<C: crate::backends::InboxConnection>(
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
pub async fn verify_async<C: crate::backends::AsyncInboxConnection>(
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
pub async fn verify_for_async<C: crate::backends::AsyncInboxConnection>(
    conn: &mut C,
    schema: &InboxSchema,
    needs: Needs,
) -> Result<(), SchemaError> {
    let layout = verify_layout_async(conn, schema, needs.claim).await?;
    has_what_is_needed(schema, layout, needs)?;
    use crate::io::Session;
    let io = &mut crate::io::Awaiting(conn);
    if needs.claim {
        C::Backend::refuse_autocommit_off(io, schema).await?;
    }
    C::Backend::refuse_statement_pooling(io, schema).await
}

/// [`verify_async`], saying which optional columns the table has.
#[cfg(feature = "async")]
pub(crate) async fn verify_layout_async<C: crate::backends::AsyncInboxConnection>(
    conn: &mut C,
    schema: &InboxSchema,
    claim: bool,
) -> Result<crate::dialect::layout::Layout, SchemaError> {
    crate::schema::check::check_table(&mut crate::io::Awaiting(conn), schema, claim).await
}

pub use crate::dialect::{Backend, UnknownBackend};

pub use crate::dialect::ddl::{OptionalColumns, processed_at_index};

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
