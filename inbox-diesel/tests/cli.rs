//! `inbox-diesel migration generate`, run as a user runs it, in a scratch project.

use std::path::Path;
use std::process::{Command, Output};

fn inbox_diesel(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inbox-diesel"))
        .args(args)
        .current_dir(dir)
        .env_remove("DATABASE_URL")
        .env_remove("MIGRATION_DIRECTORY")
        .env_remove("DIESEL_CONFIG_FILE")
        .output()
        .expect("the binary runs")
}

/// `inbox-diesel migration generate <args>` in `dir`.
fn generate(dir: &Path, args: &[&str]) -> Output {
    inbox_diesel(dir, &[&["migration", "generate"], args].concat())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts that the run succeeded.
fn succeeds(out: &Output) {
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Asserts that the run exited with `code`, saying `says`.
fn fails(out: &Output, code: i32, says: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert!(stderr.contains(says), "{stderr}");
}

/// The `file` of the one migration under `dir` whose name ends with `suffix`.
fn read_migration(dir: &Path, suffix: &str, file: &str) -> String {
    let written = migrations(dir);
    let name = written.iter().find(|n| n.ends_with(suffix)).unwrap();
    std::fs::read_to_string(dir.join(name).join(file)).unwrap()
}

/// A project as `cargo new` and `diesel setup` leave it.
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("Cargo.toml"), "[package]\nname = \"app\"\n").unwrap();
    std::fs::create_dir(dir.path().join("migrations")).unwrap();
    dir
}

/// The migration directories under `migrations`.
fn migrations(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn generates_into_the_nearest_migrations_directory() {
    let project = project();
    let out = generate(project.path(), &["--backend", "sqlite"]);
    succeeds(&out);
    let written = migrations(&project.path().join("migrations"));
    assert_eq!(written.len(), 1);
    let name = &written[0];
    assert!(name.ends_with("-0000_create_inbox"), "{name}");
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!("Creating migrations/{name}/up.sql")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("Creating migrations/{name}/down.sql")),
        "{stdout}"
    );
    let up = std::fs::read_to_string(project.path().join("migrations").join(name).join("up.sql"));
    assert!(up.unwrap().contains("BLOB"));
}

#[test]
fn reads_the_backend_from_database_url_and_dot_env() {
    let (project, other, beside) = (project(), project(), project());
    let out = Command::new(env!("CARGO_BIN_EXE_inbox-diesel"))
        .args(["migration", "generate", "--table", "billing.inbox"])
        .current_dir(project.path())
        .env("DATABASE_URL", "postgres://localhost/app")
        .env_remove("MIGRATION_DIRECTORY")
        .env_remove("DIESEL_CONFIG_FILE")
        .output()
        .unwrap();
    succeeds(&out);
    let up = read_migration(
        &project.path().join("migrations"),
        "_create_billing_inbox",
        "up.sql",
    );
    assert!(up.contains("UUID"));

    // The outbox goes beside a qualified inbox, in its schema, unless named.
    succeeds(&generate(
        beside.path(),
        &[
            "--backend",
            "postgres",
            "--table",
            "billing.inbox",
            "--with",
            "outbox",
        ],
    ));
    let up = read_migration(&beside.path().join("migrations"), "", "up.sql");
    assert!(
        up.contains(r#"CREATE TABLE IF NOT EXISTS "billing"."outbox""#),
        "{up}"
    );

    std::fs::write(
        other.path().join(".env"),
        "DATABASE_URL=mysql://root@localhost/app\n",
    )
    .unwrap();
    succeeds(&generate(other.path(), &[]));
    let up = read_migration(&other.path().join("migrations"), "", "up.sql");
    assert!(up.contains("ENGINE = InnoDB"));
}

#[test]
fn reads_the_directory_from_diesel_toml() {
    let project = project();
    std::fs::write(
        project.path().join("diesel.toml"),
        "[print_schema]\nfile = \"src/schema.rs\"\n\n[migrations_directory]\ndir = \"db/migrations\"\n",
    )
    .unwrap();
    std::fs::create_dir_all(project.path().join("db/migrations")).unwrap();
    let src = project.path().join("src");
    std::fs::create_dir(&src).unwrap();
    succeeds(&generate(&src, &["--backend", "mysql"]));
    assert_eq!(migrations(&project.path().join("db/migrations")).len(), 1);
    assert!(migrations(&project.path().join("migrations")).is_empty());
}

/// Bad input: a clear message, exit code 2, nothing written.
#[test]
fn bad_input_is_refused_and_writes_nothing() {
    let project = project();
    let cases: [(&[&str], &str); 8] = [
        (&["--backend", "oracle"], "unknown backend `oracle`"),
        (
            &["--backend", "sqlite", "--table", "inbox; drop"],
            "--table `inbox; drop` is not a table name",
        ),
        (
            &["--backend", "sqlite", "--constraint", "1x"],
            "--constraint `1x` is not an index name",
        ),
        (
            &["--backend", "sqlite", "--with", "checksum"],
            "unknown part `checksum`",
        ),
        (
            &["--backend", "sqlite", "--add", "claim"],
            "unknown part `claim` in --add",
        ),
        (
            &[
                "--backend",
                "sqlite",
                "--with",
                "key_text",
                "--add",
                "key_text",
            ],
            "--with and --add do not go together",
        ),
        (&["--backend"], "`--backend` needs a value"),
        (&[], "cannot tell the backend"),
    ];
    for (args, expected) in cases {
        fails(&generate(project.path(), args), 2, expected);
    }
    let out = inbox_diesel(project.path(), &["migrate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(migrations(&project.path().join("migrations")).is_empty());
}

/// `--with key_text` creates the table with the column; `--add key_text` writes a second
/// migration adding it to a table that exists, and dropping it on revert.
#[test]
fn key_text_with_the_table_or_added_to_it() {
    let project = project();
    let add_key_text = ["--backend", "mysql", "--add", "key_text"];
    succeeds(&generate(
        project.path(),
        &["--backend", "mysql", "--with", "key_text"],
    ));
    succeeds(&generate(project.path(), &add_key_text));
    let dir = project.path().join("migrations");
    let written = migrations(&dir);
    assert_eq!(written.len(), 2, "{written:?}");
    let read = |suffix: &str, file: &str| read_migration(&dir, suffix, file);
    let create = read("_create_inbox", "up.sql");
    assert!(
        create.contains("key_text      MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,"),
        "{create}"
    );
    assert!(read("_add_key_text_to_inbox", "up.sql").contains(
        "ALTER TABLE `inbox` ADD COLUMN key_text MEDIUMTEXT CHARACTER SET utf8mb4 \
                 COLLATE utf8mb4_bin;"
    ));
    assert!(
        read("_add_key_text_to_inbox", "down.sql")
            .contains("ALTER TABLE `inbox` DROP COLUMN key_text;")
    );
    // Never twice.
    let out = generate(project.path(), &add_key_text);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(migrations(&dir).len(), 2);
}

/// `--with result,fingerprint` creates the table with both columns, whose SQL runs; `--add
/// result` and `--add fingerprint` write migrations adding each to a table that exists.
#[test]
fn result_and_fingerprint_with_the_table_or_added_to_it() {
    use diesel::connection::SimpleConnection;
    use diesel::{Connection, SqliteConnection};
    let project = project();
    for args in [
        ["--with", "result,fingerprint"],
        ["--add", "result"],
        ["--add", "fingerprint"],
    ] {
        succeeds(&generate(
            project.path(),
            &[&["--backend", "sqlite"][..], &args].concat(),
        ));
    }
    let dir = project.path().join("migrations");
    let written = migrations(&dir);
    assert_eq!(written.len(), 3, "{written:?}");
    let read = |suffix: &str, file: &str| read_migration(&dir, suffix, file);
    let create = read("_create_inbox", "up.sql");
    assert!(create.contains("result        TEXT,"), "{create}");
    assert!(create.contains("fingerprint   BLOB,"), "{create}");
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    conn.batch_execute(&create).unwrap();
    conn.batch_execute("SELECT result, fingerprint FROM inbox")
        .unwrap();
    assert!(
        read("_add_result_to_inbox", "up.sql")
            .contains("ALTER TABLE \"inbox\" ADD COLUMN result TEXT;")
    );
    assert!(
        read("_add_fingerprint_to_inbox", "down.sql")
            .contains("ALTER TABLE \"inbox\" DROP COLUMN fingerprint;")
    );
}

/// `--lean` (SQLite): the table keyed by the pair, which the startup check accepts and the
/// runtime writes to; refused for the other backends and with `--add`, writing nothing.
#[test]
fn lean_is_sqlites_design_and_refused_elsewhere() {
    use diesel::connection::SimpleConnection;
    use diesel::{Connection, SqliteConnection};
    let project = project();
    let dir = project.path().join("migrations");
    for refused in [
        &["--backend", "postgres", "--lean"][..],
        &["--backend", "mysql", "--lean"],
        &["--backend", "sqlite", "--lean", "--add", "result"],
        &["--backend", "sqlite", "--lean=yes"],
    ] {
        fails(&generate(project.path(), refused), 2, "--lean");
        assert!(migrations(&dir).is_empty(), "{refused:?}");
    }
    succeeds(&generate(
        project.path(),
        &["--backend", "sqlite", "--lean", "--with", "key_text"],
    ));
    let written = migrations(&dir);
    assert_eq!(written.len(), 1, "{written:?}");
    let up = std::fs::read_to_string(dir.join(&written[0]).join("up.sql")).unwrap();
    assert!(up.contains(") WITHOUT ROWID;"), "{up}");
    assert!(!up.contains(" id "), "{up}");
    assert!(
        !up.contains("processed_at)"),
        "no index on processed_at: {up}"
    );
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    conn.batch_execute(&up).unwrap();
    let layout = inbox_diesel::schema::verify(&mut conn, &inbox_diesel::InboxSchema::DEFAULT);
    assert!(layout.is_ok(), "{layout:?}");
    let down = std::fs::read_to_string(dir.join(&written[0]).join("down.sql")).unwrap();
    conn.batch_execute(&down).unwrap();
}

/// Failures to write: exit code 1, nothing written, nothing overwritten.
#[test]
fn unwritable_or_existing_migrations_are_refused() {
    let project = project();
    let missing = project.path().join("nowhere");
    let sqlite_into = |dir: &str| {
        generate(
            project.path(),
            &["--backend", "sqlite", "--migration-dir", dir],
        )
    };
    fails(&sqlite_into(missing.to_str().unwrap()), 1, "does not exist");
    assert!(!missing.exists());

    // Not even root may create a directory under /proc.
    fails(&sqlite_into("/proc/self"), 1, "nothing written");

    succeeds(&generate(project.path(), &["--backend", "sqlite"]));
    let before = migrations(&project.path().join("migrations"));
    let up = project
        .path()
        .join("migrations")
        .join(&before[0])
        .join("up.sql");
    let original = std::fs::read_to_string(&up).unwrap();
    fails(
        &generate(project.path(), &["--backend", "postgres"]),
        1,
        "exists already",
    );
    assert_eq!(migrations(&project.path().join("migrations")), before);
    assert_eq!(std::fs::read_to_string(&up).unwrap(), original);
}
