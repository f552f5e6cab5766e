//! The outbox table's SQL on each backend: its DDL, the append of a message, the purge of
//! sent rows, and the pieces of the relay's statements that differ between servers.

use crate::dialect::Backend;

impl Backend {
    /// Whether an append can wake a relay in the same statement (PostgreSQL's `NOTIFY`).
    pub(crate) fn notifies(self) -> bool {
        self == Backend::Postgres
    }

    /// The append of one message to `table` (quoted): five binds — id, destination, ordering
    /// key, headers, payload — and, with `notify`, the channel a sixth.
    pub(crate) fn outbox_insert_sql(self, table: &str, notify: bool) -> String {
        match self {
            // The notification in the same statement: no round trip of its own.
            Backend::Postgres if notify => format!(
                "WITH appended AS (INSERT INTO {table} (id, destination, ordering_key, headers, \
                 payload) VALUES (CAST($1 AS uuid), $2, $3, $4, $5) RETURNING seq) \
                 SELECT pg_notify($6, '') FROM appended"
            ),
            Backend::Postgres => format!(
                "INSERT INTO {table} (id, destination, ordering_key, headers, payload) \
                 VALUES (CAST($1 AS uuid), $2, $3, $4, $5)"
            ),
            Backend::Mysql => format!(
                "INSERT INTO {table} (id, destination, ordering_key, headers, payload, created_at) \
                 VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6))"
            ),
            Backend::Sqlite => format!(
                "INSERT INTO {table} (id, destination, ordering_key, headers, payload) \
                 VALUES (?, ?, ?, ?, ?)"
            ),
        }
    }

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
                "CREATE INDEX {pending} ON {table} (seq) WHERE sent_at IS NULL;\n\
                 CREATE INDEX {unsent} ON {table} (destination, ordering_key, seq) WHERE sent_at IS NULL;\n\
                 CREATE INDEX {sent} ON {table} (sent_at) WHERE sent_at IS NOT NULL;\n",
                pending = index("pending"),
                unsent = index("unsent"),
                sent = index("sent_at"),
            )
        };
        match self {
            Backend::Postgres => format!(
                "CREATE TABLE {table} (\n    \
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
                "CREATE TABLE {table} (\n    \
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
                "CREATE TABLE {table} (\n    \
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
                 CREATE UNIQUE INDEX {ux} ON {table} (id);\n{partial}",
                ux = index("id"),
                partial = partial(),
            ),
        }
    }

    /// One batch of the purge of rows sent before a cutoff: the cutoff bound as the (negative)
    /// age in milliseconds, `lease_until` the backend's "now plus" around it.
    pub(crate) fn outbox_purge_sql(
        self,
        table: &str,
        (before, after): (&str, &str),
        batch: u32,
    ) -> String {
        let cutoff = format!("{before}{p}{after}", p = self.placeholder(1));
        match self {
            Backend::Mysql => format!(
                "DELETE FROM {table} WHERE sent_at < {cutoff} ORDER BY sent_at LIMIT {batch}"
            ),
            Backend::Postgres | Backend::Sqlite => format!(
                "DELETE FROM {table} WHERE seq IN (SELECT seq FROM {table} \
                 WHERE sent_at < {cutoff} ORDER BY sent_at LIMIT {batch})"
            ),
        }
    }

    /// The relay's lock on the candidates it reads before claiming them, so that relays side
    /// by side take different ones without waiting: `FOR UPDATE SKIP LOCKED` (of the alias
    /// `o` on PostgreSQL); nothing on SQLite, which has one writer.
    #[cfg(feature = "async")]
    pub(crate) fn skip_locked(self) -> &'static str {
        match self {
            Backend::Postgres => " FOR UPDATE OF o SKIP LOCKED",
            Backend::Mysql => " FOR UPDATE SKIP LOCKED",
            Backend::Sqlite => "",
        }
    }

    /// An outbox id column read as text (PostgreSQL stores a `UUID`).
    #[cfg(feature = "async")]
    pub(crate) fn outbox_id_text(self, column: &str) -> String {
        match self {
            Backend::Postgres => format!("CAST({column} AS text)"),
            Backend::Mysql | Backend::Sqlite => column.to_owned(),
        }
    }

    /// Whether an `UPDATE` may read its own table in a subquery (MySQL and MariaDB refuse
    /// it): then the relay claims in one `UPDATE … RETURNING`, else in a transaction of
    /// reads and an update by `seq`.
    #[cfg(feature = "async")]
    pub(crate) fn updates_from_own_subquery(self) -> bool {
        self != Backend::Mysql
    }

    /// Whether every writer waits for one database lock, even a claim that finds nothing
    /// (SQLite): a relay then reads before it claims.
    #[cfg(feature = "async")]
    pub(crate) fn single_writer(self) -> bool {
        self == Backend::Sqlite
    }

    /// "Now plus the bound milliseconds" for a claim's lease where it is taken row by row:
    /// PostgreSQL's `clock_timestamp()`, not the statement's start, so that a claim taking
    /// seconds does not hand out rows whose lease has already run; `lease_until` elsewhere.
    #[cfg(feature = "async")]
    pub(crate) fn lease_per_row(
        self,
        lease_until: (&'static str, &'static str),
    ) -> (&'static str, &'static str) {
        match self {
            Backend::Postgres => ("clock_timestamp() + ", " * INTERVAL '1 millisecond'"),
            Backend::Mysql | Backend::Sqlite => lease_until,
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
