//! The inbox table's DDL on each backend: `CREATE TABLE` with its indexes, the optional
//! columns added to a table, and their types ([`schema`](crate::schema) re-exports these).

use inbox_core::InboxSchema;

use crate::dialect::Backend;

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
        let namespace = inbox_core::MessageKey::NAMESPACE.simple();
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
             id            INTEGER   PRIMARY KEY NOT NULL,\n\
         {columns}\n\
         );\n\
         CREATE UNIQUE INDEX IF NOT EXISTS {index_prefix}{index} \
         ON {name} (message_id, consumer);\n\
         CREATE INDEX IF NOT EXISTS {index_prefix}{processed} \
         ON {name} (processed_at);\n",
        table = Backend::Sqlite.quote_table(schema.table()),
        columns = sqlite_columns(key_text),
        index = quote(schema.constraint()),
        name = quote(table_name),
        processed = quote(&processed_at_index(table_name)),
    )
}

/// The lean design ([`OptionalColumns::lean`]): the key is the table's own b-tree, named as
/// the inbox's index so that the check finds it by the name it looks for.
fn sqlite_lean_create(schema: &InboxSchema, key_text: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n\
         {columns},\n    \
             CONSTRAINT {index} PRIMARY KEY (message_id, consumer)\n\
         ) WITHOUT ROWID;\n",
        table = Backend::Sqlite.quote_table(schema.table()),
        columns = sqlite_columns(key_text),
        index = Backend::Sqlite.quote(schema.constraint()),
    )
}

/// The columns of both SQLite designs (the shipped one's `id` aside), `optional` the optional
/// columns' lines, each line indented, the last without its comma.
fn sqlite_columns(optional: &str) -> String {
    format!(
        "    message_id    BLOB      NOT NULL,\n    \
             consumer      TEXT      NOT NULL,\n\
         {optional}    \
             received_at   TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,\n    \
             processed_at  TIMESTAMP,\n    \
             claimed_until TIMESTAMP,\n    \
             attempts      INTEGER   NOT NULL DEFAULT 1"
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

#[cfg(test)]
mod tests {
    use inbox_core::InboxSchema;

    use super::{Backend, OptionalColumns};

    #[test]
    fn sqlite_designs_ddl() {
        let schema = InboxSchema::new("aux.inbox", "ux_inbox").unwrap();
        let ddl = |lean| {
            let columns = OptionalColumns {
                key_text: true,
                lean,
                ..OptionalColumns::default()
            };
            Backend::Sqlite.create_table_with_sql(&schema, columns)
        };
        let shipped = ddl(false);
        assert_eq!(
            shipped,
            "CREATE TABLE IF NOT EXISTS \"aux\".\"inbox\" (\n\
             \x20   id            INTEGER   PRIMARY KEY NOT NULL,\n\
             \x20   message_id    BLOB      NOT NULL,\n\
             \x20   consumer      TEXT      NOT NULL,\n\
             \x20   key_text      TEXT,\n\
             \x20   received_at   TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,\n\
             \x20   processed_at  TIMESTAMP,\n\
             \x20   claimed_until TIMESTAMP,\n\
             \x20   attempts      INTEGER   NOT NULL DEFAULT 1\n\
             );\n\
             CREATE UNIQUE INDEX IF NOT EXISTS \"aux\".\"ux_inbox\" ON \"inbox\" (message_id, consumer);\n\
             CREATE INDEX IF NOT EXISTS \"aux\".\"ix_inbox_processed_at\" ON \"inbox\" (processed_at);\n"
        );
        // The lean design: the same columns but `id`, keyed by the pair in the table itself.
        let columns = shipped
            .split_once("NOT NULL,\n")
            .and_then(|(_, rest)| rest.split_once("\n);"))
            .unwrap()
            .0;
        assert_eq!(
            ddl(true),
            format!(
                "CREATE TABLE IF NOT EXISTS \"aux\".\"inbox\" (\n{columns},\n    \
                 CONSTRAINT \"ux_inbox\" PRIMARY KEY (message_id, consumer)\n) WITHOUT ROWID;\n"
            )
        );
    }
}
