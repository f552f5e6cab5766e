//! The inbox table as a diesel migration: its SQL, and the migration directory the
//! `inbox-diesel migration generate` command writes.
//!
//! The directory has exactly the layout `diesel migration generate` of diesel 2.3 writes —
//! `<migrations>/<YYYY-MM-DD-HHMMSS-NNNN>_create_inbox/{up.sql,down.sql}` — so
//! `diesel migration run`, `revert` and `redo` treat it like any migration of the project.
//!
//! ```
//! use inbox_diesel::InboxSchema;
//! use inbox_diesel::migration::InboxMigration;
//! use inbox_diesel::schema::Backend;
//!
//! let dir = tempfile::tempdir()?;
//! let migration = InboxMigration::new(Backend::Postgres, InboxSchema::DEFAULT);
//! let written = migration.write_to(dir.path())?;
//! assert!(written.directory.file_name().unwrap().to_str().unwrap().ends_with("_create_inbox"));
//! assert!(std::fs::read_to_string(&written.up)?.contains("ux_inbox_message_consumer"));
//! // Never a second one for the same table.
//! assert!(migration.write_to(dir.path()).is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Embedded, for `MigrationHarness`
//!
//! An [`InboxMigration`] is also a diesel `MigrationSource` of one migration, for services
//! that run their migrations from code with `diesel_migrations`:
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use diesel::prelude::*;
//! use diesel_migrations::MigrationHarness;
//! use inbox_diesel::InboxSchema;
//! use inbox_diesel::migration::InboxMigration;
//! use inbox_diesel::schema::{self, Backend};
//!
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! conn.run_pending_migrations(InboxMigration::new(Backend::Sqlite, InboxSchema::DEFAULT))?;
//! schema::verify(&mut conn, &InboxSchema::DEFAULT)?;
//! # }
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! ```
//!
//! It is recorded in `__diesel_schema_migrations` under version [`EMBEDDED_VERSION`], which
//! sorts before every timestamped version. Reverting goes by the newest applied version, and
//! a migration source knows only its own migrations: `revert_last_migration` with your own
//! source keeps reverting your migrations and stops with `UnknownMigrationVersion` when only
//! the inbox's is left; revert that one with `revert_last_migration(InboxMigration::new(…))`.
//! The backend given must be the connection's.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use inbox_core::InboxSchema;

/// The backend a migration is written for (as [`crate::schema::Backend`]), beside
/// [`InboxMigration`] so that one import brings both.
pub use crate::schema::Backend;
use crate::schema::OptionalColumns;

/// The migration creating one inbox table on one backend — or adding its optional
/// `key_text` column to one that exists ([`InboxMigration::add_key_text`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboxMigration {
    backend: Backend,
    schema: InboxSchema,
    change: Change,
}

/// What a migration does to the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// Creates it, with `key_text` or without, and an outbox table beside it or not.
    Create {
        columns: OptionalColumns,
        outbox: Option<&'static str>,
    },
    /// Adds `key_text` to it.
    AddKeyText,
    /// Adds `result` to it.
    AddResult,
    /// Adds `fingerprint` to it.
    AddFingerprint,
    /// Creates an outbox table beside it.
    AddOutbox(&'static str),
}

/// The files [`InboxMigration::write_to`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenMigration {
    /// `<migrations>/<version>_create_<table>`.
    pub directory: PathBuf,
    /// Its `up.sql`.
    pub up: PathBuf,
    /// Its `down.sql`.
    pub down: PathBuf,
}

/// Why no migration was written. Whatever the variant, nothing was left behind.
#[derive(Debug)]
#[non_exhaustive]
pub enum MigrationError {
    /// The migrations directory does not exist or is not a directory.
    NoMigrationsDirectory(PathBuf),
    /// A migration of the same name (creating this table, or adding its `key_text`) exists
    /// already; it is never overwritten.
    AlreadyExists(PathBuf),
    /// Reading the directory or writing a file failed.
    Io {
        /// The path being read or written.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

impl fmt::Display for MigrationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MigrationError::NoMigrationsDirectory(dir) => write!(
                f,
                "the migrations directory {} does not exist (create it, or run `diesel setup`)",
                dir.display()
            ),
            MigrationError::AlreadyExists(dir) => write!(
                f,
                "a migration of this name exists already: {} (nothing written)",
                dir.display()
            ),
            MigrationError::Io { path, .. } => {
                write!(f, "cannot write {} (nothing written)", path.display())
            }
        }
    }
}

impl std::error::Error for MigrationError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MigrationError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The version the embedded migration is recorded under: before any timestamped version,
/// so that reverting a project's own migrations never reaches it first.
pub const EMBEDDED_VERSION: &str = "00000000000001";

/// The version of the embedded [`InboxMigration::add_key_text`]: after the table's, before
/// any timestamped version.
pub const EMBEDDED_KEY_TEXT_VERSION: &str = "00000000000002";

/// The version of the embedded [`InboxMigration::add_outbox`]: after the table's and its
/// `key_text`, before any timestamped version.
pub const EMBEDDED_OUTBOX_VERSION: &str = "00000000000003";

/// The version of the embedded [`InboxMigration::add_result`]: after the table's, its
/// `key_text` and the outbox, before any timestamped version.
pub const EMBEDDED_RESULT_VERSION: &str = "00000000000004";

/// The version of the embedded [`InboxMigration::add_fingerprint`]: after the table's and
/// its other additions, before any timestamped version.
pub const EMBEDDED_FINGERPRINT_VERSION: &str = "00000000000005";

impl<DB: diesel::backend::Backend> diesel::migration::MigrationSource<DB> for InboxMigration {
    fn migrations(
        &self,
    ) -> diesel::migration::Result<Vec<Box<dyn diesel::migration::Migration<DB>>>> {
        let version = match self.change {
            Change::Create { .. } => EMBEDDED_VERSION,
            Change::AddKeyText => EMBEDDED_KEY_TEXT_VERSION,
            Change::AddOutbox(_) => EMBEDDED_OUTBOX_VERSION,
            Change::AddResult => EMBEDDED_RESULT_VERSION,
            Change::AddFingerprint => EMBEDDED_FINGERPRINT_VERSION,
        };
        Ok(vec![Box::new(Embedded {
            version,
            name: format!("{version}_{}", self.name()),
            up: self.up(),
            down: self.down(),
        })])
    }
}

/// The embedded migration: the SQL of the generated files, without their comments.
struct Embedded {
    version: &'static str,
    name: String,
    up: String,
    down: String,
}

impl<DB: diesel::backend::Backend> diesel::migration::Migration<DB> for Embedded {
    fn run(
        &self,
        conn: &mut dyn diesel::connection::BoxableConnection<DB>,
    ) -> diesel::migration::Result<()> {
        conn.batch_execute(&self.up)?;
        Ok(())
    }

    fn revert(
        &self,
        conn: &mut dyn diesel::connection::BoxableConnection<DB>,
    ) -> diesel::migration::Result<()> {
        conn.batch_execute(&self.down)?;
        Ok(())
    }

    fn metadata(&self) -> &dyn diesel::migration::MigrationMetadata {
        self
    }

    fn name(&self) -> &dyn diesel::migration::MigrationName {
        self
    }
}

impl diesel::migration::MigrationMetadata for Embedded {}

impl diesel::migration::MigrationName for Embedded {
    fn version(&self) -> diesel::migration::MigrationVersion<'_> {
        self.version.into()
    }
}

impl fmt::Display for Embedded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// The first line of each file, as `diesel migration generate` writes it.
const UP_HEADER: &str = "-- Your SQL goes here\n";
const DOWN_HEADER: &str = "-- This file should undo anything in `up.sql`\n";

impl InboxMigration {
    /// The migration of `schema`'s table (and its index names) on `backend`.
    pub fn new(backend: Backend, schema: InboxSchema) -> Self {
        Self {
            backend,
            schema,
            change: Change::Create {
                columns: OptionalColumns::default(),
                outbox: None,
            },
        }
    }

    /// The migration creating the table, with `with` applied to its optional columns (a
    /// migration of another change becomes one creating the table).
    fn creating(self, with: impl FnOnce(&mut OptionalColumns)) -> Self {
        let (mut columns, outbox) = match self.change {
            Change::Create { columns, outbox } => (columns, outbox),
            _ => (OptionalColumns::default(), None),
        };
        with(&mut columns);
        Self {
            change: Change::Create { columns, outbox },
            ..self
        }
    }

    /// The table with the optional `key_text` column, where the runtime keeps each marker's
    /// key as text for operators (`--with key_text`; see
    /// [`Backend::add_key_text_sql`](crate::schema::Backend::add_key_text_sql)).
    pub fn with_key_text(self) -> Self {
        self.creating(|columns| columns.key_text = true)
    }

    /// The table with the optional `result` column, where a handler with `store_result`
    /// keeps its value (`--with result`; see
    /// [`Backend::add_result_sql`](crate::schema::Backend::add_result_sql)).
    ///
    /// ```
    /// use inbox_diesel::InboxSchema;
    /// use inbox_diesel::migration::InboxMigration;
    /// use inbox_diesel::schema::Backend;
    ///
    /// let migration = InboxMigration::new(Backend::Mysql, InboxSchema::DEFAULT).with_result();
    /// assert!(migration.up_sql().contains("result        JSON"));
    /// ```
    pub fn with_result(self) -> Self {
        self.creating(|columns| columns.result = true)
    }

    /// The table with the optional `fingerprint` column, where a handler with
    /// `fingerprint = …` keeps its request's digest (`--with fingerprint`; see
    /// [`Backend::add_fingerprint_sql`](crate::schema::Backend::add_fingerprint_sql)).
    pub fn with_fingerprint(self) -> Self {
        self.creating(|columns| columns.fingerprint = true)
    }

    /// SQLite: the lean design ([`OptionalColumns::lean`](crate::schema::OptionalColumns::lean),
    /// `--lean`), a `WITHOUT ROWID` table keyed by `(message_id, consumer)` with no `id` and no
    /// index on `processed_at`. The other backends keep the shipped design.
    ///
    /// ```
    /// use inbox_diesel::InboxSchema;
    /// use inbox_diesel::migration::InboxMigration;
    /// use inbox_diesel::schema::Backend;
    ///
    /// let migration = InboxMigration::new(Backend::Sqlite, InboxSchema::DEFAULT).lean();
    /// assert!(migration.up_sql().contains(") WITHOUT ROWID;"));
    /// ```
    pub fn lean(self) -> Self {
        self.creating(|columns| columns.lean = true)
    }

    /// The inbox table and, in the same migration, an outbox table named `table`
    /// ([`outbox`](crate::outbox); `--with outbox`).
    ///
    /// ```
    /// use inbox_diesel::InboxSchema;
    /// use inbox_diesel::migration::InboxMigration;
    /// use inbox_diesel::schema::Backend;
    ///
    /// let migration = InboxMigration::new(Backend::Postgres, InboxSchema::DEFAULT).with_outbox("outbox");
    /// assert!(migration.up_sql().contains("CREATE TABLE IF NOT EXISTS \"outbox\""));
    /// assert!(migration.down_sql().contains("DROP TABLE \"outbox\""));
    /// ```
    ///
    /// # Panics
    /// When `table` is not a table name (as [`Outbox::new`](crate::outbox::Outbox::new)).
    pub fn with_outbox(self, table: &'static str) -> Self {
        let _ = crate::outbox::Outbox::new(table);
        let migration = self.creating(|_| {});
        let Change::Create { columns, .. } = migration.change else {
            unreachable!("`creating` makes a migration creating the table")
        };
        Self {
            change: Change::Create {
                columns,
                outbox: Some(table),
            },
            ..migration
        }
    }

    /// The migration creating an outbox table named `table` beside `schema`'s existing inbox
    /// on `backend`, named `create_<table>` (`--add outbox`).
    ///
    /// # Panics
    /// When `table` is not a table name (as [`Outbox::new`](crate::outbox::Outbox::new)).
    pub fn add_outbox(backend: Backend, schema: InboxSchema, table: &'static str) -> Self {
        let _ = crate::outbox::Outbox::new(table);
        Self {
            backend,
            schema,
            change: Change::AddOutbox(table),
        }
    }

    /// The migration adding `key_text` to `schema`'s existing table on `backend`, named
    /// `add_key_text_to_<table>`; its `down.sql` drops the column again.
    ///
    /// ```
    /// use inbox_diesel::InboxSchema;
    /// use inbox_diesel::migration::InboxMigration;
    /// use inbox_diesel::schema::Backend;
    ///
    /// let migration = InboxMigration::add_key_text(Backend::Mysql, InboxSchema::DEFAULT);
    /// assert_eq!(migration.name(), "add_key_text_to_inbox");
    /// assert!(migration.up_sql().contains("ADD COLUMN key_text MEDIUMTEXT"));
    /// assert!(migration.down_sql().contains("DROP COLUMN key_text"));
    /// ```
    pub fn add_key_text(backend: Backend, schema: InboxSchema) -> Self {
        Self {
            backend,
            schema,
            change: Change::AddKeyText,
        }
    }

    /// The migration adding `result` to `schema`'s existing table on `backend`, named
    /// `add_result_to_<table>`; its `down.sql` drops the column again.
    pub fn add_result(backend: Backend, schema: InboxSchema) -> Self {
        Self {
            backend,
            schema,
            change: Change::AddResult,
        }
    }

    /// The migration adding `fingerprint` to `schema`'s existing table on `backend`, named
    /// `add_fingerprint_to_<table>`; its `down.sql` drops the column again.
    pub fn add_fingerprint(backend: Backend, schema: InboxSchema) -> Self {
        Self {
            backend,
            schema,
            change: Change::AddFingerprint,
        }
    }

    /// The migration's name: `create_<table>` (`create_billing_inbox` for `billing.inbox`),
    /// `add_key_text_to_<table>` or `add_result_to_<table>`.
    pub fn name(&self) -> String {
        let table = self.schema.table().replace('.', "_");
        match self.change {
            Change::Create { .. } => format!("create_{table}"),
            Change::AddKeyText => format!("add_key_text_to_{table}"),
            Change::AddResult => format!("add_result_to_{table}"),
            Change::AddFingerprint => format!("add_fingerprint_to_{table}"),
            Change::AddOutbox(outbox) => format!("create_{}", outbox.replace('.', "_")),
        }
    }

    /// The contents of `up.sql`.
    pub fn up_sql(&self) -> String {
        format!("{UP_HEADER}{}", self.up())
    }

    /// The contents of `down.sql`.
    pub fn down_sql(&self) -> String {
        format!("{DOWN_HEADER}{}", self.down())
    }

    fn up(&self) -> String {
        let (backend, schema) = (self.backend, &self.schema);
        let outbox = |table| crate::outbox::Outbox::new(table).create_table_sql(backend);
        match self.change {
            Change::Create {
                columns,
                outbox: with,
            } => {
                let mut sql = backend.create_table_with_sql(schema, columns);
                if let Some(table) = with {
                    sql.push('\n');
                    sql.push_str(&outbox(table));
                }
                sql
            }
            Change::AddKeyText => backend.add_key_text_sql(schema),
            Change::AddResult => backend.add_result_sql(schema),
            Change::AddFingerprint => backend.add_fingerprint_sql(schema),
            Change::AddOutbox(table) => outbox(table),
        }
    }

    fn down(&self) -> String {
        let drop_outbox =
            |table: &str| format!("DROP TABLE {};\n", self.backend.quote_table(table));
        match self.change {
            Change::Create { outbox, .. } => {
                let mut sql = outbox.map(drop_outbox).unwrap_or_default();
                sql.push_str(&self.backend.drop_table_sql(&self.schema));
                sql
            }
            Change::AddKeyText => self.backend.drop_key_text_sql(&self.schema),
            Change::AddResult => self.backend.drop_result_sql(&self.schema),
            Change::AddFingerprint => self.backend.drop_fingerprint_sql(&self.schema),
            Change::AddOutbox(table) => drop_outbox(table),
        }
    }

    /// Writes `<migrations_dir>/<version>_<name>/{up.sql,down.sql}`, the version being the
    /// current UTC time in diesel's format plus a 4-digit subversion that keeps it unique.
    ///
    /// # Errors
    /// When `migrations_dir` is missing, when a migration of the same name exists there (it
    /// is never overwritten), or when writing fails — in which case the new directory is
    /// removed again.
    pub fn write_to(&self, migrations_dir: &Path) -> Result<WrittenMigration, MigrationError> {
        if !migrations_dir.is_dir() {
            return Err(MigrationError::NoMigrationsDirectory(
                migrations_dir.to_path_buf(),
            ));
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| MigrationError::Io { path, source }
        };
        let existing: Vec<String> = std::fs::read_dir(migrations_dir)
            .map_err(io(migrations_dir))?
            .filter_map(Result::ok)
            .filter(|entry| entry.path().is_dir())
            .filter_map(|entry| entry.file_name().into_string().ok())
            .collect();
        let suffix = format!("_{}", self.name());
        if let Some(found) = existing.iter().find(|name| name.ends_with(&suffix)) {
            return Err(MigrationError::AlreadyExists(migrations_dir.join(found)));
        }
        let timestamp = utc_timestamp(SystemTime::now());
        let version = (0..=u16::MAX)
            .map(|sub| format!("{timestamp}-{sub:04x}"))
            .find(|version| {
                !existing
                    .iter()
                    .any(|name| name.starts_with(version.as_str()))
            })
            .ok_or_else(|| MigrationError::AlreadyExists(migrations_dir.join(&timestamp)))?;
        let directory = migrations_dir.join(format!("{version}_{}", self.name()));
        std::fs::create_dir(&directory).map_err(io(&directory))?;
        let written = WrittenMigration {
            up: directory.join("up.sql"),
            down: directory.join("down.sql"),
            directory,
        };
        let write = |path: &Path, contents: String| {
            std::fs::File::create_new(path)
                .and_then(|mut file| file.write_all(contents.as_bytes()))
                .map_err(io(path))
        };
        let result =
            write(&written.up, self.up_sql()).and_then(|()| write(&written.down, self.down_sql()));
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&written.directory);
            return Err(e);
        }
        Ok(written)
    }
}

/// `YYYY-MM-DD-HHMMSS` in UTC: the version format of `diesel migration generate`.
fn utc_timestamp(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}-{:02}{:02}{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn timestamps_are_utc_in_diesels_format() {
        assert_eq!(utc_timestamp(UNIX_EPOCH), "1970-01-01-000000");
        // 2024-02-29T23:59:59Z, a leap day.
        let leap = UNIX_EPOCH + Duration::from_secs(1_709_251_199);
        assert_eq!(utc_timestamp(leap), "2024-02-29-235959");
        let later = UNIX_EPOCH + Duration::from_secs(1_795_996_800);
        assert_eq!(utc_timestamp(later), "2026-11-30-000000");
    }

    #[test]
    fn names_follow_the_table() {
        let billing = InboxSchema::new("billing.inbox", "ux_billing").unwrap();
        assert_eq!(
            InboxMigration::new(Backend::Mysql, billing).name(),
            "create_billing_inbox"
        );
    }

    #[test]
    fn writes_up_and_down_and_never_twice() {
        let dir = tempfile::tempdir().unwrap();
        let migration = InboxMigration::new(Backend::Sqlite, InboxSchema::DEFAULT);
        let written = migration.write_to(dir.path()).unwrap();
        let name = written.directory.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            name.len(),
            "YYYY-MM-DD-HHMMSS-0000_create_inbox".len(),
            "{name}"
        );
        assert!(name.ends_with("-0000_create_inbox"), "{name}");
        let up = std::fs::read_to_string(&written.up).unwrap();
        assert!(up.starts_with(UP_HEADER) && up.contains("CREATE TABLE IF NOT EXISTS \"inbox\""));
        let down = std::fs::read_to_string(&written.down).unwrap();
        assert!(down.starts_with(DOWN_HEADER) && down.contains("DROP TABLE IF EXISTS \"inbox\""));
        let again = migration.write_to(dir.path());
        assert!(
            matches!(again, Err(MigrationError::AlreadyExists(_))),
            "{again:?}"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// Run, checked, reverted through `MigrationHarness`, beside a project's own migration.
    #[cfg(feature = "sqlite")]
    #[test]
    fn embedded_migration_runs_and_reverts() {
        use diesel::migration::MigrationSource;
        use diesel::{Connection, SqliteConnection};
        use diesel_migrations::MigrationHarness;

        let mut conn = SqliteConnection::establish(":memory:").unwrap();
        let inbox = InboxMigration::new(Backend::Sqlite, InboxSchema::DEFAULT);
        let names: Vec<String> = MigrationSource::<diesel::sqlite::Sqlite>::migrations(&inbox)
            .unwrap()
            .iter()
            .map(|m| m.name().to_string())
            .collect();
        assert_eq!(names, ["00000000000001_create_inbox"]);
        let applied = conn.run_pending_migrations(inbox).unwrap();
        assert_eq!(applied.len(), 1);
        crate::schema::verify(&mut conn, &InboxSchema::DEFAULT).unwrap();
        // Applied once: the second run has nothing to do.
        assert!(conn.run_pending_migrations(inbox).unwrap().is_empty());
        conn.revert_last_migration(inbox).unwrap();
        assert!(crate::schema::verify(&mut conn, &InboxSchema::DEFAULT).is_err());
    }

    /// The table created with `key_text`, and the column added to a table created without
    /// it, then reverted: each leaves a table the startup check accepts.
    #[cfg(feature = "sqlite")]
    #[test]
    fn key_text_migrations_run_and_revert() {
        use diesel::connection::SimpleConnection;
        use diesel::{Connection, SqliteConnection};
        use diesel_migrations::MigrationHarness;

        let has_key_text =
            |conn: &mut SqliteConnection| conn.batch_execute("SELECT key_text FROM inbox").is_ok();
        let mut conn = SqliteConnection::establish(":memory:").unwrap();
        let with = InboxMigration::new(Backend::Sqlite, InboxSchema::DEFAULT).with_key_text();
        assert_eq!(with.name(), "create_inbox");
        conn.run_pending_migrations(with).unwrap();
        crate::schema::verify(&mut conn, &InboxSchema::DEFAULT).unwrap();
        assert!(has_key_text(&mut conn));

        let mut conn = SqliteConnection::establish(":memory:").unwrap();
        let table = InboxMigration::new(Backend::Sqlite, InboxSchema::DEFAULT);
        let add = InboxMigration::add_key_text(Backend::Sqlite, InboxSchema::DEFAULT);
        conn.run_pending_migrations(table).unwrap();
        assert!(!has_key_text(&mut conn));
        let applied = conn.run_pending_migrations(add).unwrap();
        assert_eq!(applied.len(), 1);
        assert!(has_key_text(&mut conn));
        crate::schema::verify(&mut conn, &InboxSchema::DEFAULT).unwrap();
        conn.revert_last_migration(add).unwrap();
        assert!(!has_key_text(&mut conn));
        crate::schema::verify(&mut conn, &InboxSchema::DEFAULT).unwrap();
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("migrations");
        let result =
            InboxMigration::new(Backend::Postgres, InboxSchema::DEFAULT).write_to(&missing);
        assert!(matches!(
            result,
            Err(MigrationError::NoMigrationsDirectory(_))
        ));
        assert!(!missing.exists());
    }
}
