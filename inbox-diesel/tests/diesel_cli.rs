//! The migration as a new user applies it, through the real diesel CLI: in a fresh project,
//! `diesel setup`, `inbox-diesel migration generate`, `diesel migration run` and
//! `diesel migration redo`; then `diesel print-schema` prints exactly the `table!` this crate
//! ships, the startup check passes, and a handler runs on the table. Needs `diesel` (diesel_cli 2.3) on `PATH`, and for
//! the server backends `INBOX_TEST_PG` / `INBOX_TEST_MYSQL`.

use std::path::Path;
use std::process::Command;

use diesel::Connection;
use inbox_diesel::schema::verify;
use inbox_diesel::{InboxSchema, Uuid, idempotent};

/// The new user's steps through the diesel CLI (`new_project_applies_the_migration`), then a
/// handler run on the migrated table: the first delivery processes, the second is a
/// duplicate.
macro_rules! migration_works {
    ($conn:ty, $url:expr, $module:literal) => {{
        new_project_applies_the_migration($url, $module);
        #[idempotent(consumer = "welcome", key = *id)]
        fn welcome(conn: &mut $conn, id: &Uuid) -> diesel::QueryResult<usize> {
            diesel::RunQueryDsl::execute(diesel::sql_query("SELECT 1"), conn)
        }
        let mut conn = <$conn>::establish($url).unwrap();
        verify(&mut conn, &InboxSchema::DEFAULT).unwrap();
        let id = Uuid::from_u128(42);
        assert!(welcome(&mut conn, &id).unwrap().is_processed());
        assert!(welcome(&mut conn, &id).unwrap().is_duplicate());
    }};
}

/// Runs a command in the project with `DATABASE_URL` set; panics with its output on failure.
fn run(program: &str, project: &Path, url: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(project)
        .env("DATABASE_URL", url)
        .env_remove("MIGRATION_DIRECTORY")
        .env_remove("DIESEL_CONFIG_FILE")
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `{program}`: {e}; install it: cargo install diesel_cli --version '~2.3' --no-default-features --features postgres,mysql,sqlite-bundled")
        });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "`{program} {}` failed:\n{stdout}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A fresh project, as `cargo new` and `diesel setup` leave it, on the database at `url`.
struct Project<'u> {
    dir: tempfile::TempDir,
    url: &'u str,
}

impl<'u> Project<'u> {
    fn set_up(url: &'u str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Cargo.toml"), "[package]\nname = \"app\"\n").unwrap();
        let project = Project { dir, url };
        project.diesel(&["setup"]);
        project
    }

    /// `diesel <args>`; its output.
    fn diesel(&self, args: &[&str]) -> String {
        run("diesel", self.dir.path(), self.url, args)
    }

    /// `inbox-diesel migration generate <args>`; its output.
    fn generate(&self, args: &[&str]) -> String {
        let args = [&["migration", "generate"], args].concat();
        run(
            env!("CARGO_BIN_EXE_inbox-diesel"),
            self.dir.path(),
            self.url,
            &args,
        )
    }
}

/// The new user's steps, in a fresh project; then `diesel print-schema` prints the `table!`
/// of `schema/mod.rs`'s `module`.
fn new_project_applies_the_migration(url: &str, module: &str) {
    let project = Project::set_up(url);
    let generated = project.generate(&[]);
    assert!(generated.contains("_create_inbox/up.sql"), "{generated}");
    let ran = project.diesel(&["migration", "run"]);
    assert!(ran.contains("_create_inbox"), "{ran}");
    let redone = project.diesel(&["migration", "redo"]);
    assert!(
        redone.contains("Rolling back migration") && redone.contains("_create_inbox"),
        "{redone}"
    );
    let printed = project.diesel(&["print-schema", "--only-tables", "inbox"]);
    assert_eq!(printed_table(&printed), shipped_table(module));
}

/// The `table!` of `module` in this crate's `schema/mod.rs`, without its doc comments.
fn shipped_table(module: &str) -> Vec<String> {
    let source = include_str!("../src/schema/mod.rs");
    let start = source
        .find(&format!("pub mod {module} {{"))
        .and_then(|at| source[at..].find("diesel::table! {").map(|t| at + t))
        .expect("the module has a table!");
    let end = start + source[start..].find("\n    }\n").expect("the table! ends");
    table_lines(&source[start..end])
}

/// The lines of a `table!` that say something: no comments, no blank lines, no indentation.
fn table_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("//"))
        .map(str::to_owned)
        .collect()
}

fn printed_table(schema: &str) -> Vec<String> {
    let mut lines = table_lines(schema);
    // The closing brace of `diesel::table! {`, which `shipped_table` stops before.
    assert_eq!(lines.pop().as_deref(), Some("}"), "{schema}");
    lines
}

#[test]
fn sqlite_migration_through_the_diesel_cli() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("app.sqlite").display().to_string();
    migration_works!(diesel::SqliteConnection, &url, "sqlite");
}

/// A database of its own on the server `variable` names, dropped afterwards.
#[cfg(any(feature = "postgres", feature = "mysql"))]
struct ServerDatabase<C: Connection> {
    admin: String,
    name: String,
    url: String,
    connection: std::marker::PhantomData<C>,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<C: Connection> ServerDatabase<C> {
    fn new(variable: &str, test: &str) -> Self {
        let admin = std::env::var(variable)
            .unwrap_or_else(|_| panic!("{variable} must name the server of this test"));
        let base = admin.rsplit_once('/').expect("a URL with a database").0;
        let name = format!("inbox_cli_{test}_{}", std::process::id());
        let url = format!("{base}/{name}");
        Self {
            admin,
            name,
            url,
            connection: std::marker::PhantomData,
        }
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<C: Connection> Drop for ServerDatabase<C> {
    fn drop(&mut self) {
        if let Ok(mut admin) = C::establish(&self.admin) {
            let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {}", self.name));
        }
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_migration_through_the_diesel_cli() {
    let db = ServerDatabase::<diesel::PgConnection>::new("INBOX_TEST_PG", "pg");
    migration_works!(diesel::PgConnection, &db.url, "postgres");
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_migration_through_the_diesel_cli() {
    let db = ServerDatabase::<diesel::MysqlConnection>::new("INBOX_TEST_MYSQL", "mysql");
    migration_works!(diesel::MysqlConnection, &db.url, "mysql");
}

/// A handler that publishes to the outbox, run on the migrated tables: the message is
/// written with the first delivery, and not again with the duplicate.
macro_rules! outbox_works {
    ($conn:ty, $url:expr, $table:expr) => {{
        static OUTBOX: inbox_diesel::outbox::Outbox = inbox_diesel::outbox::Outbox::new($table);
        #[idempotent(consumer = "welcome", key = *id)]
        fn welcome(conn: &mut $conn, id: &Uuid) -> diesel::QueryResult<()> {
            OUTBOX.publish(conn, inbox_diesel::outbox::Message::new("welcomes", "hi"))?;
            Ok(())
        }
        let mut conn = <$conn>::establish($url).unwrap();
        let id = Uuid::from_u128($table.len() as u128);
        assert!(welcome(&mut conn, &id).unwrap().is_processed());
        assert!(welcome(&mut conn, &id).unwrap().is_duplicate());
        #[derive(diesel::QueryableByName)]
        struct N {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let n: N = diesel::RunQueryDsl::get_result(
            diesel::sql_query(format!("SELECT count(*) AS n FROM {}", $table)),
            &mut conn,
        )
        .unwrap();
        assert_eq!(n.n, 1);
    }};
}

/// `--with outbox` creates the outbox beside the inbox in one migration, `--add outbox` a
/// second one beside an inbox that exists; both run and revert through the diesel CLI.
fn outbox_migrations_apply(url: &str) {
    let project = Project::set_up(url);
    assert!(
        project
            .generate(&["--with", "outbox"])
            .contains("_create_inbox/up.sql")
    );
    assert!(
        project
            .generate(&["--add", "outbox", "--outbox-table", "billing_outbox"])
            .contains("_create_billing_outbox/up.sql")
    );
    let ran = project.diesel(&["migration", "run"]);
    assert!(ran.contains("_create_billing_outbox"), "{ran}");
    let redone = project.diesel(&["migration", "redo", "--all"]);
    assert!(redone.contains("Rolling back migration"), "{redone}");
    let printed = project.diesel(&["print-schema"]);
    for table in ["inbox (", "outbox (seq)", "billing_outbox (seq)"] {
        assert!(printed.contains(table), "{table} not in\n{printed}");
    }
}

/// The outbox migrations applied through the diesel CLI (`outbox_migrations_apply`), then
/// a handler publishing to each of the two outboxes they create.
macro_rules! outbox_migrations_work {
    ($conn:ty, $url:expr) => {{
        outbox_migrations_apply($url);
        outbox_works!($conn, $url, "outbox");
        outbox_works!($conn, $url, "billing_outbox");
    }};
}

#[test]
fn sqlite_outbox_migrations_through_the_diesel_cli() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("app.sqlite").display().to_string();
    outbox_migrations_work!(diesel::SqliteConnection, &url);
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_outbox_migrations_through_the_diesel_cli() {
    let db = ServerDatabase::<diesel::PgConnection>::new("INBOX_TEST_PG", "pg_outbox");
    outbox_migrations_work!(diesel::PgConnection, &db.url);
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_outbox_migrations_through_the_diesel_cli() {
    let db = ServerDatabase::<diesel::MysqlConnection>::new("INBOX_TEST_MYSQL", "mysql_outbox");
    outbox_migrations_work!(diesel::MysqlConnection, &db.url);
}
