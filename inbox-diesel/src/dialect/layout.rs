//! What the startup check found that changes the SQL: the table's optional columns, the
//! server's flavour, the session's mark.

use std::cell::RefCell;
use std::rc::Rc;

use inbox_core::MessageKey;

/// What the startup check found beyond what every table has: the optional columns the
/// runtime writes, and the server's flavour where the SQL differs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Layout {
    /// The table has `key_text`: each marker stores its key's text there.
    pub(crate) key_text: bool,
    /// The table has `result`: a handler with `store_result` keeps its value there.
    pub(crate) result: bool,
    /// The table has `fingerprint`: a handler with `fingerprint = …` keeps it there.
    pub(crate) fingerprint: bool,
    /// A MariaDB server (the MySQL backend): it bounds idle transactions
    /// (`idle_transaction_timeout`), which MySQL cannot.
    pub(crate) mariadb: bool,
    /// MySQL and MariaDB: the session variable the check set on the server session it ran
    /// on ([`SessionMark`]).
    pub(crate) session_mark: Option<SessionMark>,
    /// PostgreSQL and SQLite: the database and table the check read, which each marker
    /// insert requires of the session it runs on ([`DatabaseMark`]).
    pub(crate) database_mark: Option<DatabaseMark>,
    /// PostgreSQL and SQLite, for a table named without its schema: the table the check
    /// found (`public.inbox`, `main.inbox`), which the handler's statements then name — a
    /// temporary table of the name created on the session later, or a `search_path` changed
    /// under it, does not take the markers; on PostgreSQL the marker's insert is refused there
    /// ([`DatabaseMark`]: the name means another table now), and the session checked again.
    /// (On MySQL and MariaDB the [`SessionMark`] names
    /// the database the check ran in: after `USE other` the marker's insert, which names the
    /// table unqualified, is refused until the other database's table is checked.)
    pub(crate) pinned: Option<&'static str>,
    /// MySQL and MariaDB: the server's `max_allowed_packet`, in bytes, as the check read it
    /// (`0` elsewhere: no limit the runtime's statements come near). A statement or its
    /// parameters larger than that makes the server drop the connection.
    pub(crate) max_packet: u64,
    /// PostgreSQL: the session's messages were in another language, and the check set them
    /// to English (the role may): each handler transaction sets them again for itself
    /// (`SET LOCAL lc_messages`), which a `RESET ALL` since the check would otherwise undo.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) english: bool,
}

impl Layout {
    /// What each marker insert requires of the session: the check's mark on it (MySQL,
    /// MariaDB), or the database and table the check read (PostgreSQL, SQLite).
    pub(crate) fn mark(self) -> Option<Mark> {
        self.session_mark
            .map(Mark::Session)
            .or(self.database_mark.map(Mark::Database))
    }

    /// Bytes left in a packet beside what a statement or its parameters are counted at: the
    /// packet's header, a prepared statement's id and flags, the parameters' types and
    /// length prefixes.
    const PACKET_SLACK: u64 = 1024;

    /// Whether `bytes` of SQL text, or of a statement's parameters, fit in one packet of the
    /// server's.
    #[cfg(feature = "mysql")]
    pub(crate) fn fits(self, bytes: usize) -> bool {
        self.max_packet == 0 || (bytes as u64).saturating_add(Self::PACKET_SLACK) <= self.max_packet
    }

    /// How many bytes of one value fit in a statement whose other parts take `around`:
    /// unbounded where the server reads no packet limit.
    pub(crate) fn room(self, around: usize) -> usize {
        match self.max_packet {
            0 => usize::MAX,
            packet => usize::try_from(packet.saturating_sub(Self::PACKET_SLACK))
                .unwrap_or(usize::MAX)
                .saturating_sub(around),
        }
    }
}

/// MySQL and MariaDB: a session variable, `@inbox_checked_<digest>`, set by the startup
/// check on the server session it ran on to the session's database, and required by each
/// marker insert (`IF(@… = <database>, <consumer>, NULL)` into the `NOT NULL` consumer). The
/// digest is of the table, its index, the [`Layout`] the check found (`key_text`, MariaDB
/// or MySQL) and the mode checked for (claim mode's statements take more privileges), so
/// that the variable says which statements this session was checked for: a session marked
/// by a transaction-mode handler is checked again before a claim-mode handler's first claim.
///
/// On these backends the runtime remembers a check per handler, not per connection: a pool
/// hands out many sessions, and nothing on the client side stays with each. A session that
/// was never checked, or was checked for another layout, then gets the remembered one's
/// statements, and a plain `INSERT` there would not notice a table without its unique index
/// — a message would be applied twice. The server, which knows its sessions, refuses the
/// insert instead (error 1048); the runtime checks the table on that session and goes on,
/// and remembers what it found. PostgreSQL and SQLite are asked the same of the database and
/// table the check read ([`DatabaseMark`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionMark(u64);

impl SessionMark {
    #[cfg(feature = "mysql")]
    pub(crate) fn new(schema: &inbox_core::InboxSchema, layout: Layout, claim: bool) -> Self {
        let name = format!(
            "{}\0{}\0key_text={}\0mariadb={}\0claim={claim}",
            schema.table(),
            schema.constraint(),
            layout.key_text,
            layout.mariadb
        );
        let digest = uuid::Uuid::new_v5(&inbox_core::MessageKey::NAMESPACE, name.as_bytes());
        SessionMark(digest.as_u64_pair().0)
    }

    /// The variable, with its `@`.
    pub(crate) fn variable(self) -> String {
        format!("@inbox_checked_{:016x}", self.0)
    }

    /// Sets the variable on the session, to the session's default database: after the check
    /// passed there. `USE other` afterwards makes an unqualified table another table, which
    /// was never checked: the mark then no longer matches.
    pub(crate) fn set_sql(self) -> String {
        format!("SET {} = {}", self.variable(), Self::DATABASE)
    }

    /// The session's default database, never NULL (a session may have none), and without an
    /// empty string literal (which `EMPTY_STRING_IS_NULL` would make NULL).
    const DATABASE: &'static str = "IFNULL(CONCAT('+', DATABASE()), '-')";

    /// Whether the session is marked for the database it is in, compared byte by byte
    /// (database names are case-sensitive where files are).
    fn condition(self) -> String {
        format!("BINARY {} = {}", self.variable(), Self::DATABASE)
    }

    /// The session's clock is the server's: `SET timestamp = …` moves `NOW()` and
    /// `UTC_TIMESTAMP()` for the session (not `SYSDATE()`), and with them every lease and
    /// `processed_at` it writes — a claim it takes over while live, a marker the purge
    /// removes early. A minute of slack for a statement's own run. Read by the check and the
    /// purge (queries, never replicated), not in the marker's insert: a replica of
    /// statement-based replication runs the insert with the source's `NOW()` and its own
    /// `SYSDATE()`, and a lagging one would stop.
    #[cfg(feature = "mysql")]
    pub(crate) const CLOCK: &'static str = "ABS(TIMESTAMPDIFF(SECOND, NOW(), SYSDATE())) < 60";
}

/// PostgreSQL and SQLite: the database the startup check ran in and the table it read,
/// required by each marker insert (`CASE WHEN <this session's database and table are those>
/// THEN <consumer> END` into the `NOT NULL` consumer).
///
/// The runtime remembers a check by what stays with a connection on the client
/// ([`identity`](crate::runtime::checked::identity)), and a connection to another database can
/// come to stand where a checked one stood: a database per tenant, connections opened in
/// turn into one variable; a pool re-pointed after a failover. Its table was never checked,
/// and might be one the check refuses (a trigger, another unique index, a missing
/// privilege). The server knows which database a session is in: there the insert fails on
/// the `NULL` consumer (before anything is written), the runtime checks that database's
/// table and goes on with what it finds — or refuses it. A table dropped and created again
/// since the check is another table, and is checked again the same way.
///
/// PostgreSQL knows a database and a table by their oids — the database's as well as the
/// table's, as databases created from one template share their tables' oids. SQLite knows a
/// database by its file (`PRAGMA database_list`; an in-memory database has none, and is told
/// from another only by its table) and a table by its root page — which a table dropped and
/// created at once takes again: there, as for a trigger added to a live table on any
/// backend, what would do harm is detected when it does (an insert that writes nothing). A
/// few lookups in the catalog per insert, no round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseMark {
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres {
        database: u32,
        table: u32,
        /// The table as the handler names it: unqualified, it is resolved by the session's
        /// `search_path` — a session pointed at another schema since the check (a schema per
        /// tenant) finds another table there, and is checked there.
        name: &'static str,
    },
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    Sqlite {
        file: &'static str,
        root_page: i64,
        /// The table as the handler's statements name it, with its schema (`main.inbox`).
        name: &'static str,
    },
}

impl DatabaseMark {
    /// Reads PostgreSQL's `oids` fact: `<database oid> <table oid>`.
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(fact: &str, name: &'static str) -> Option<Self> {
        let (database, table) = fact.split_once(' ')?;
        Some(DatabaseMark::Postgres {
            database: database.parse().ok()?,
            table: table.parse().ok()?,
            name,
        })
    }

    /// Reads SQLite's `oids` fact: `<root page> <file>`.
    #[cfg(feature = "sqlite")]
    pub(crate) fn sqlite(fact: &str, name: &'static str) -> Option<Self> {
        let (root_page, file) = fact.split_once(' ')?;
        Some(DatabaseMark::Sqlite {
            file: intern(file),
            root_page: root_page.parse().ok()?,
            name,
        })
    }

    /// Whether the session is in the database, and its name for the table is the table, that
    /// the check read.
    fn condition(self) -> String {
        let quoted = |name: &str| {
            name.split('.')
                .map(|part| format!("\"{part}\""))
                .collect::<Vec<_>>()
                .join(".")
        };
        match self {
            DatabaseMark::Postgres {
                database,
                table,
                name,
            } => format!(
                "to_regclass('{}') = CAST({table} AS oid) AND \
                 (SELECT oid FROM pg_database WHERE datname = current_database()) = \
                 CAST({database} AS oid)",
                quoted(name)
            ),
            DatabaseMark::Sqlite {
                file,
                root_page,
                name,
            } => {
                let (schema, table) = name.split_once('.').unwrap_or(("main", name));
                format!(
                    "(SELECT file FROM pragma_database_list WHERE name = '{schema}') = '{}' \
                     AND (SELECT rootpage FROM \"{schema}\".sqlite_master WHERE type = 'table' \
                     AND name = '{table}' COLLATE NOCASE) = {root_page}",
                    file.replace('\'', "''")
                )
            }
        }
    }
}

/// What a marker insert requires of the session it runs on, wrapped around the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// MySQL and MariaDB: the check's mark on the server session.
    Session(SessionMark),
    /// PostgreSQL and SQLite: the database and table the check read.
    Database(DatabaseMark),
}

impl Mark {
    /// Whether the session is one the check ran for: an SQL condition.
    pub(crate) fn condition(self) -> Rc<str> {
        self.text(false)
    }

    /// What goes before the consumer's bind, and what after it: the consumer where the
    /// session is one the check ran for, `NULL` elsewhere.
    pub(crate) fn guard(self) -> (Rc<str>, &'static str) {
        (self.text(true), " END")
    }

    /// The condition (`guard`: the text before the consumer), written once per mark on a
    /// thread and kept: MySQL's and SQLite's marker inserts are written for every message,
    /// and writing the condition cost more than the rest of the statement's text together.
    fn text(self, guard: bool) -> Rc<str> {
        /// Marks a thread keeps the text of: the connections it runs handlers on.
        const KEPT: usize = 64;
        thread_local! {
            static TEXTS: RefCell<Vec<(Mark, bool, Rc<str>)>> = const { RefCell::new(Vec::new()) };
        }
        TEXTS.with(|texts| {
            if let Some((.., text)) = texts
                .borrow()
                .iter()
                .find(|(m, g, _)| *m == self && *g == guard)
            {
                return Rc::clone(text);
            }
            let condition = match self {
                Mark::Session(mark) => mark.condition(),
                Mark::Database(mark) => mark.condition(),
            };
            let text: Rc<str> = match guard {
                true => format!("CASE WHEN {condition} THEN ").into(),
                false => condition.into(),
            };
            let mut texts = texts.borrow_mut();
            if texts.len() == KEPT {
                texts.clear();
            }
            texts.push((self, guard, Rc::clone(&text)));
            text
        })
    }
}

/// Whether a failed statement of the claim says that this server session has not checked the
/// table: a `NOT NULL` violation (MySQL's 1048, PostgreSQL's 23502, SQLite's `NOT NULL constraint failed`, by the driver's code, in
/// whatever language the session speaks — an unchecked session has not had its messages set
/// to English), which in the marker's insert only the [`Mark`]'s `NULL` consumer can cause; or a MariaDB
/// setting refused by a MySQL server given a MariaDB server's remembered check.
pub(crate) fn unchecked_session(error: &diesel::result::Error) -> bool {
    crate::classify::with_server_error(error, |server| {
        server.kind == inbox_core::server_message::ServerErrorKind::NotNullViolation
            || server
                .message
                .contains("Unknown system variable 'idle_transaction_timeout'")
    })
    .unwrap_or(false)
}

/// What `key_text` holds for `key`: its `Display`, with NUL — which PostgreSQL's text cannot
/// hold, and which a sender can put in a text key — written as U+FFFD, so that such a key is
/// still processed. The column is for people; the stored id is the key.
pub(crate) fn key_text(key: &MessageKey) -> String {
    let text = key.to_string();
    match text.contains('\0') {
        true => text.replace('\0', "\u{fffd}"),
        false => text,
    }
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
