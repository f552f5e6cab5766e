//! The outbox table's DDL on each backend, for the migration generator and the command
//! line, which write it for backends that are not compiled in. The append, the purge and
//! the relay's pieces that differ between servers are each backend's
//! [`Dialect`](super::Dialect)'s.

use crate::dialect::Backend;

impl Backend {
    /// The statement creating the outbox table `table_name` (one or two identifiers) and its
    /// indexes.
    pub(crate) fn outbox_create_sql(self, table_name: &str) -> String {
        let table = self.quote_table(table_name);
        let name = table_name.rsplit('.').next().unwrap_or(table_name);
        let index = |suffix: &str| self.quote(&index_name(name, suffix));
        // PostgreSQL and SQLite: the relay's indexes, on the unsent rows and the sent ones
        // apart (MySQL and MariaDB have no partial index: theirs are in the table).
        let partial = || {
            format!(
                "CREATE INDEX IF NOT EXISTS {pending} ON {table} (seq) WHERE sent_at IS NULL;\n\
                 CREATE INDEX IF NOT EXISTS {unsent} ON {table} (destination, ordering_key, seq) WHERE sent_at IS NULL;\n\
                 CREATE INDEX IF NOT EXISTS {sent} ON {table} (sent_at) WHERE sent_at IS NOT NULL;\n",
                pending = index("pending"),
                unsent = index("unsent"),
                sent = index("sent_at"),
            )
        };
        match self {
            Backend::Postgres => format!(
                "CREATE TABLE IF NOT EXISTS {table} (\n    \
                 seq           BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,\n    \
                 id            UUID        NOT NULL,\n    \
                 destination   TEXT        NOT NULL,\n    \
                 ordering_key  TEXT        NOT NULL DEFAULT '',\n    \
                 headers       TEXT        NOT NULL DEFAULT '{{}}',\n    \
                 payload       BYTEA       NOT NULL,\n    \
                 created_at    TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,\n    \
                 claimed_until TIMESTAMPTZ,\n    \
                 claimed_by    TEXT,\n    \
                 attempts      INTEGER     NOT NULL DEFAULT 0,\n    \
                 last_error    TEXT,\n    \
                 sent_at       TIMESTAMPTZ,\n    \
                 parked_at     TIMESTAMPTZ,\n    \
                 CONSTRAINT {ux} UNIQUE (id)\n);\n{partial}",
                ux = index("id"),
                partial = partial(),
            ),
            Backend::Mysql => format!(
                "CREATE TABLE IF NOT EXISTS {table} (\n    \
                 seq           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,\n    \
                 id            CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,\n    \
                 destination   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n    \
                 ordering_key  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',\n    \
                 headers       MEDIUMTEXT   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n    \
                 payload       LONGBLOB     NOT NULL,\n    \
                 created_at    DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),\n    \
                 claimed_until DATETIME(6)  NULL,\n    \
                 claimed_by    CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NULL,\n    \
                 attempts      INT          NOT NULL DEFAULT 0,\n    \
                 last_error    TEXT         NULL,\n    \
                 sent_at       DATETIME(6)  NULL,\n    \
                 parked_at     DATETIME(6)  NULL,\n    \
                 UNIQUE KEY {ux} (id),\n    \
                 KEY {unsent} (destination, ordering_key, sent_at, seq),\n    \
                 KEY {sent} (sent_at, seq)\n\
                 ) ENGINE = InnoDB;\n",
                ux = index("id"),
                unsent = index("unsent"),
                sent = index("sent_at"),
            ),
            Backend::Sqlite => format!(
                "CREATE TABLE IF NOT EXISTS {table} (\n    \
                 seq           INTEGER   PRIMARY KEY NOT NULL,\n    \
                 id            TEXT      NOT NULL,\n    \
                 destination   TEXT      NOT NULL,\n    \
                 ordering_key  TEXT      NOT NULL DEFAULT '',\n    \
                 headers       TEXT      NOT NULL DEFAULT '{{}}',\n    \
                 payload       BLOB      NOT NULL,\n    \
                 created_at    TIMESTAMP NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),\n    \
                 claimed_until TIMESTAMP,\n    \
                 claimed_by    TEXT,\n    \
                 attempts      INTEGER   NOT NULL DEFAULT 0,\n    \
                 last_error    TEXT,\n    \
                 sent_at       TIMESTAMP,\n    \
                 parked_at     TIMESTAMP\n\
                 );\n\
                 CREATE UNIQUE INDEX IF NOT EXISTS {ux} ON {table} (id);\n{partial}",
                ux = index("id"),
                partial = partial(),
            ),
        }
    }
}

/// `ux_{table}_id`, `ix_{table}_unsent`, …: within 63 bytes, as every backend takes.
fn index_name(table: &str, suffix: &str) -> String {
    let prefix = if suffix == "id" { "ux" } else { "ix" };
    let room = 63 - prefix.len() - suffix.len() - 2;
    let table: String = table.chars().take(room).collect();
    format!("{prefix}_{table}_{suffix}")
}
