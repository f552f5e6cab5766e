//! `inbox-diesel migration generate`: writes the inbox table's migration into a diesel
//! project's migrations directory, as `diesel migration generate` would lay it out.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use inbox_diesel::InboxSchema;
use inbox_diesel::migration::InboxMigration;
use inbox_diesel::schema::Backend;

const USAGE: &str = "\
usage: inbox-diesel migration generate [OPTIONS]

Writes <migrations>/<version>_create_<table>/{up.sql,down.sql} for the inbox table, in the
layout of `diesel migration generate`; apply it with `diesel migration run`.

options:
  --backend postgres|mysql|sqlite   the SQL dialect (default: from --database-url, then
                                    DATABASE_URL in the environment or in .env)
  --database-url URL                read the backend from this URL
  --migration-dir DIR               where to write (default: MIGRATION_DIRECTORY, then
                                    diesel.toml's [migrations_directory] dir, then the
                                    nearest `migrations` directory)
  --table NAME                      the table, optionally qualified (default: inbox)
  --constraint NAME                 its unique index (default: ux_inbox_message_consumer)
  --with key_text,result,fingerprint,outbox
                                    the optional parts: `key_text` keeps each marker's key
                                    as text, for operators; `result` keeps the value of a
                                    handler with `store_result`, as JSON; `fingerprint`
                                    the request digest of a handler with `fingerprint = …`;
                                    `outbox` creates
                                    the outbox table beside the inbox, in the same
                                    migration (claim mode's columns are always included;
                                    `claim` is accepted and changes nothing)
  --lean                            SQLite: a WITHOUT ROWID table keyed by (message_id,
                                    consumer), without `id` and the index on
                                    processed_at: fewer pages written per commit; the
                                    purge then reads the table once per run
  --add key_text|result|fingerprint|outbox
                                    a migration adding the part to an existing inbox
                                    instead (add_<part>_to_<table>, create_<outbox>;
                                    down.sql drops what up.sql added)
  --outbox-table NAME               the outbox table, optionally qualified (default:
                                    outbox, in the inbox table's schema or database)
  -h, --help                        this text
";

/// A failure and its exit code: 2 for bad input, 1 for a failure to write.
struct Failure(u8, String);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, message)) => {
            eprintln!("inbox-diesel: {message}");
            if code == 2 {
                eprintln!("run `inbox-diesel --help` for the options");
            }
            ExitCode::from(code)
        }
    }
}

#[derive(Default)]
struct Options {
    backend: Option<String>,
    database_url: Option<String>,
    migration_dir: Option<PathBuf>,
    table: Option<String>,
    constraint: Option<String>,
    with: Vec<String>,
    add: Vec<String>,
    outbox_table: Option<String>,
    lean: bool,
}

fn usage(message: impl Into<String>) -> Failure {
    Failure(2, message.into())
}

fn run(args: &[String]) -> Result<(), Failure> {
    if args.iter().any(|a| a == "-h" || a == "--help") || args.is_empty() {
        print!("{USAGE}");
        return Ok(());
    }
    match args {
        [migration, generate, rest @ ..] if migration == "migration" && generate == "generate" => {
            generate_migration(parse(rest)?)
        }
        _ => Err(usage(format!(
            "unknown command `{}`: the command is `inbox-diesel migration generate`",
            args.join(" ")
        ))),
    }
}

fn parse(args: &[String]) -> Result<Options, Failure> {
    let mut options = Options::default();
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let (name, inline) = match flag.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (flag.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next().cloned())
                .ok_or_else(|| usage(format!("`{name}` needs a value")))
        };
        match name {
            "--backend" => options.backend = Some(value()?),
            "--database-url" => options.database_url = Some(value()?),
            "--migration-dir" => options.migration_dir = Some(PathBuf::from(value()?)),
            "--table" => options.table = Some(value()?),
            "--constraint" => options.constraint = Some(value()?),
            "--outbox-table" => options.outbox_table = Some(value()?),
            "--lean" if inline.is_none() => options.lean = true,
            "--with" => options
                .with
                .extend(value()?.split(',').map(|s| s.trim().to_owned())),
            "--add" => options
                .add
                .extend(value()?.split(',').map(|s| s.trim().to_owned())),
            _ => return Err(usage(format!("unknown option `{name}`"))),
        }
    }
    Ok(options)
}

fn generate_migration(options: Options) -> Result<(), Failure> {
    for (flag, parts) in [("--with", &options.with), ("--add", &options.add)] {
        for part in parts {
            let known = matches!(
                part.as_str(),
                "key_text" | "result" | "fingerprint" | "outbox"
            ) || (flag == "--with" && part == "claim");
            if !known {
                return Err(usage(format!(
                    "unknown part `{part}` in {flag}: the optional parts are `key_text`, \
                     `result`, `fingerprint` and `outbox` (claim mode's columns are always in \
                     the table)"
                )));
            }
        }
    }
    let key_text = options.with.iter().any(|part| part == "key_text");
    let result = options.with.iter().any(|part| part == "result");
    let fingerprint = options.with.iter().any(|part| part == "fingerprint");
    let with_outbox = options.with.iter().any(|part| part == "outbox");
    let add = !options.add.is_empty();
    if add && !options.with.is_empty() {
        return Err(usage(
            "--with and --add do not go together: --with is for a migration creating the \
             table, --add for one adding to a table that exists",
        ));
    }
    if options.add.len() > 1 {
        return Err(usage("--add takes one part: one migration per change"));
    }
    // Beside the inbox: in its schema (PostgreSQL) or database (MySQL, MariaDB) when its
    // name is qualified.
    let beside_the_inbox = match options.table.as_deref().and_then(|t| t.rsplit_once('.')) {
        Some((qualifier, _)) => format!("{qualifier}.outbox"),
        None => "outbox".to_owned(),
    };
    let outbox_table = options.outbox_table.as_deref().unwrap_or(&beside_the_inbox);
    InboxSchema::validate_table(outbox_table).map_err(|e| {
        usage(format!(
            "--outbox-table `{outbox_table}` is not a table name: {e}"
        ))
    })?;
    let outbox_table: &'static str = Box::leak(outbox_table.to_owned().into_boxed_str());
    let schema = schema(&options)?;
    let backend = backend(&options)?;
    if options.lean && (backend != Backend::Sqlite || add) {
        return Err(usage(match add {
            true => "--lean is a design of the table, for the migration creating it, not --add",
            false => {
                "--lean is SQLite's design: PostgreSQL, MySQL and MariaDB keep the shipped table"
            }
        }));
    }
    let dir = migrations_dir(&options)?;
    let migration = match options.add.first().map(String::as_str) {
        Some("outbox") => InboxMigration::add_outbox(backend, schema, outbox_table),
        Some("result") => InboxMigration::add_result(backend, schema),
        Some("fingerprint") => InboxMigration::add_fingerprint(backend, schema),
        Some(_) => InboxMigration::add_key_text(backend, schema),
        None => {
            let mut migration = InboxMigration::new(backend, schema);
            if key_text {
                migration = migration.with_key_text();
            }
            if result {
                migration = migration.with_result();
            }
            if fingerprint {
                migration = migration.with_fingerprint();
            }
            if options.lean {
                migration = migration.lean();
            }
            if with_outbox {
                migration.with_outbox(outbox_table)
            } else {
                migration
            }
        }
    };
    let written = migration
        .write_to(&dir)
        .map_err(|e| Failure(1, e.to_string()))?;
    let cwd = std::env::current_dir().unwrap_or_default();
    for file in [&written.up, &written.down] {
        println!(
            "Creating {}",
            file.strip_prefix(&cwd).unwrap_or(file).display()
        );
    }
    println!(
        "{backend} migration for table {}; apply it with `diesel migration run`",
        schema.table()
    );
    Ok(())
}

/// The table and index names, checked as the runtime checks them. The names live for the
/// rest of this short process.
fn schema(options: &Options) -> Result<InboxSchema, Failure> {
    let table = options
        .table
        .as_deref()
        .unwrap_or(InboxSchema::DEFAULT_TABLE);
    let constraint = options
        .constraint
        .as_deref()
        .unwrap_or(InboxSchema::DEFAULT_CONSTRAINT);
    InboxSchema::validate_table(table)
        .map_err(|e| usage(format!("--table `{table}` is not a table name: {e}")))?;
    InboxSchema::validate_identifier(constraint).map_err(|e| {
        usage(format!(
            "--constraint `{constraint}` is not an index name: {e}"
        ))
    })?;
    let leak = |s: &str| -> &'static str { Box::leak(s.to_owned().into_boxed_str()) };
    InboxSchema::new(leak(table), leak(constraint)).map_err(|e| usage(e.to_string()))
}

fn backend(options: &Options) -> Result<Backend, Failure> {
    if let Some(name) = &options.backend {
        return name.parse().map_err(|e| usage(format!("{e}")));
    }
    let url = options
        .database_url
        .clone()
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .or_else(dotenv_database_url);
    match url {
        Some(url) => Ok(Backend::from_database_url(&url)),
        None => Err(usage(
            "cannot tell the backend: pass --backend postgres|mysql|sqlite, or set DATABASE_URL \
             (in the environment or in .env) as for the diesel CLI",
        )),
    }
}

/// `DATABASE_URL` from the nearest `.env`, as the diesel CLI reads it.
fn dotenv_database_url() -> Option<String> {
    let cwd = std::env::current_dir().ok()?;
    let file = cwd
        .ancestors()
        .map(|d| d.join(".env"))
        .find(|f| f.is_file())?;
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|line| {
        let line = line.trim().strip_prefix("export ").unwrap_or(line.trim());
        let value = line
            .strip_prefix("DATABASE_URL")?
            .trim_start()
            .strip_prefix('=')?;
        Some(
            value
                .trim()
                .trim_matches(|c| c == '"' || c == '\'')
                .to_owned(),
        )
    })
}

/// The migrations directory, found as the diesel CLI finds it.
fn migrations_dir(options: &Options) -> Result<PathBuf, Failure> {
    if let Some(dir) = &options.migration_dir {
        return Ok(dir.clone());
    }
    if let Some(dir) = std::env::var_os("MIGRATION_DIRECTORY") {
        return Ok(PathBuf::from(dir));
    }
    let cwd = std::env::current_dir().map_err(|e| Failure(1, e.to_string()))?;
    let config = std::env::var_os("DIESEL_CONFIG_FILE")
        .map(PathBuf::from)
        .or_else(|| project_root(&cwd).map(|root| root.join("diesel.toml")));
    if let Some(config) = config.filter(|c| c.is_file())
        && let Some(dir) = configured_dir(&config)?
    {
        let base = config.parent().unwrap_or(Path::new("."));
        return Ok(base.join(dir));
    }
    cwd.ancestors()
        .map(|d| d.join("migrations"))
        .find(|d| d.is_dir())
        .ok_or_else(|| {
            usage(
                "no migrations directory found here or above: pass --migration-dir, or run \
                 `diesel setup` first",
            )
        })
}

/// The nearest directory holding a `Cargo.toml`: where the diesel CLI looks for
/// `diesel.toml`.
fn project_root(cwd: &Path) -> Option<PathBuf> {
    cwd.ancestors()
        .find(|d| d.join("Cargo.toml").is_file())
        .map(Path::to_path_buf)
}

/// `dir` under `[migrations_directory]` in a `diesel.toml`.
fn configured_dir(config: &Path) -> Result<Option<String>, Failure> {
    let text = std::fs::read_to_string(config)
        .map_err(|e| Failure(1, format!("{}: {e}", config.display())))?;
    let mut in_section = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_section = line == "[migrations_directory]";
        } else if in_section
            && let Some(value) = line.strip_prefix("dir")
            && let Some(value) = value.trim_start().strip_prefix('=')
        {
            let value = value.split('#').next().unwrap_or_default().trim();
            return Ok(Some(value.trim_matches('"').to_owned()));
        }
    }
    Ok(None)
}
