//! Throughput of an `#[idempotent]` handler against its baselines and peers, measured in one
//! run and reported as ratios (absolute figures on a shared machine are noise).
//!
//! ```text
//! cargo run --release --example bench --features inbox-examples/postgres,inbox-examples/mysql \
//!     -- [--seconds 2] [sqlite] [postgres] [mysql]
//! ```
//!
//! `--schema lean` runs SQLite on its lean table (`inbox-diesel migration generate --lean`:
//! `WITHOUT ROWID`, keyed by the pair, no index on `processed_at`), purge included; the
//! variants that need the shipped `table!` are left out.
//!
//! `--smoke` runs every section on every backend named, with tiny durations and row counts:
//! that the bench still runs, for CI — its figures mean nothing.
//!
//! `--section main` runs only each backend's main table (and diesel-async's);
//! `--section batches` only the batch form against one message per transaction;
//! `--section floor postgres` only the raw-SQL floor.
//!
//! `--section body` runs only the realistic body — a read of the worker's account, an update
//! of it and an insert into a ledger — with and without the inbox, sync and on diesel-async.
//!
//! `--section http` runs only the HTTP section (issue #43): an axum route that extracts
//! `inbox_axum::Idempotent` and runs the realistic body through it, its reply stored with the
//! key and the request's fingerprint, against the same route with axum's `Json` and a
//! transaction of its own — one server in process, 1 and 8 reqwest clients over real HTTP, a
//! fresh `Idempotency-Key` per request (`http.rs`).
//!
//! `--section stored` runs only the stored-result section: `#[idempotent]` with
//! `store_result = true` (and with a `fingerprint`) against the marker alone, and the bytes
//! per row of each.
//!
//! `--instructions [postgres] <plain|idempotent|outbox|hand-written> <n>` runs `n` messages of
//! one variant on SQLite (or on PostgreSQL, one connection), one at a time, and nothing else:
//! for `valgrind --tool=callgrind`, whose instruction count a shared machine's load does not
//! move (BENCHMARKS.md).
//!
//! PostgreSQL and MariaDB are found at `INBOX_BENCH_PG` / `INBOX_BENCH_MYSQL` (default: the
//! local servers); each run creates and drops a database of its own. SQLite runs on a
//! temporary file in WAL mode.
//!
//! Every variant does the same business write — one `UPDATE` of the worker's own account
//! row, so that workers do not queue on one row — once per message, one message per
//! transaction:
//!
//! - `plain`: the write in a diesel transaction, no inbox: the baseline;
//! - `#[idempotent]`: the library;
//! - `+ outbox`: `#[idempotent]` that also publishes one 100-byte message to the outbox;
//! - `hand-written`: what the library does, written with diesel's query builder (claim-first
//!   insert, then the write) — the difference is the library's own overhead;
//! - `duplicate`: `#[idempotent]` on keys already processed;
//! - `naive`: check for the marker, write, insert the marker, treat a unique violation as a
//!   duplicate — the handler people write first;
//! - `two transactions`: MassTransit's protocol — commit the marker in a transaction of its
//!   own, then lock it and run the write in a second one, and stamp it;
//!
//! then the batch form (`batch = …`, one transaction per batch of 10, 100 or 1000 messages)
//! against `#[idempotent]` one message at a time, the existence check before the transaction
//! (`precheck`) at 0 to 100 % redeliveries, and purge on a million completed rows; on
//! PostgreSQL and MariaDB also `plain`, `#[idempotent]` and `duplicate` on diesel-async, and
//! on PostgreSQL the raw-SQL floor: the same statements run by `pgbench` (`floor.rs`).

// `measure.rs` times the workers and reports ratios; `variants.rs` holds the handlers
// compared, one module per backend; `designs.rs` the table-design section; `http.rs` the
// HTTP section, server and clients; this file sets the databases up and runs the sections.
mod designs;
#[cfg(feature = "postgres")]
mod floor;
mod http;
mod measure;
mod variants;

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::purge::{Purge, purge};
use inbox_diesel::{InboxSchema, Uuid, idempotent};

use designs::*;

/// The outbox the `+ outbox` variant publishes to.
static OUTBOX: inbox_diesel::outbox::Outbox = inbox_diesel::outbox::Outbox::new("outbox");
use measure::*;
use variants::*;

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

diesel::table! {
    /// The realistic body's insert: one entry per message, the account's balance after it.
    ledger (id) {
        id -> BigInt,
        account_id -> Integer,
        amount -> BigInt,
        balance -> BigInt,
    }
}

diesel::allow_tables_to_appear_in_same_query!(accounts, ledger);

/// The inbox keyed by `(message_id, consumer)` itself: no surrogate `id`, so one index
/// fewer to write (PostgreSQL: the primary key is the unique index the classifier names;
/// SQLite: a `WITHOUT ROWID` table stored in that key's B-tree; MySQL, for the table-design
/// section only: InnoDB clusters the rows on that key).
fn lean_schema(backend: &str) -> String {
    let columns = match backend {
        "postgres" => {
            "message_id UUID NOT NULL, consumer TEXT COLLATE \"C\" NOT NULL, \
             received_at TIMESTAMPTZ NOT NULL DEFAULT now(), processed_at TIMESTAMPTZ, \
             claimed_until TIMESTAMPTZ, attempts INTEGER NOT NULL DEFAULT 1, \
             CONSTRAINT ux_inbox_message_consumer PRIMARY KEY (message_id, consumer)"
        }
        "mysql" => {
            "message_id BINARY(16) NOT NULL, \
             consumer VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
             received_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
             processed_at DATETIME(6) NULL, claimed_until DATETIME(6) NULL, \
             attempts INT NOT NULL DEFAULT 1, PRIMARY KEY (message_id, consumer)"
        }
        _ => {
            "message_id BLOB NOT NULL, consumer TEXT NOT NULL, \
             received_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, processed_at TIMESTAMP, \
             claimed_until TIMESTAMP, attempts INTEGER NOT NULL DEFAULT 1, \
             PRIMARY KEY (message_id, consumer)"
        }
    };
    let without_rowid = if backend == "sqlite" {
        " WITHOUT ROWID"
    } else {
        ""
    };
    format!(
        "CREATE TABLE inbox ({columns}){without_rowid}; \
         CREATE INDEX ix_inbox_processed_at ON inbox (processed_at);"
    )
}

/// The accounts the workers write, one row each, and the realistic body's ledger (a
/// generated key and an index on the account, as such tables have).
fn accounts_sql(backend: inbox_diesel::schema::Backend) -> Vec<String> {
    use inbox_diesel::schema::Backend;
    let mut statements =
        vec!["CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL)".to_owned()];
    let rows: Vec<String> = (1..=16).map(|id| format!("({id}, 0)")).collect();
    statements.push(format!(
        "INSERT INTO accounts (id, balance) VALUES {}",
        rows.join(", ")
    ));
    let id = match backend {
        Backend::Postgres => "BIGSERIAL PRIMARY KEY",
        Backend::Mysql => "BIGINT AUTO_INCREMENT PRIMARY KEY",
        _ => "INTEGER PRIMARY KEY",
    };
    statements.push(format!(
        "CREATE TABLE ledger (id {id}, account_id INTEGER NOT NULL, \
         amount BIGINT NOT NULL, balance BIGINT NOT NULL)"
    ));
    statements.push("CREATE INDEX ix_ledger_account ON ledger (account_id)".to_owned());
    statements
}

/// The SQLite database file of a run in `dir`.
fn sqlite_file(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("bench.sqlite")
}

/// A SQLite database file in `dir` with the inbox and the accounts; how to connect to it.
fn sqlite_database(dir: &std::path::Path) -> impl Fn() -> diesel::SqliteConnection + Sync {
    let url = sqlite_file(dir).display().to_string();
    let connect = move || {
        let mut conn = diesel::SqliteConnection::establish(&url).unwrap();
        conn.batch_execute(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 10000;",
        )
        .unwrap();
        conn
    };
    let mut conn = connect();
    let inbox = inbox_diesel::schema::Backend::Sqlite.create_table_with_sql(
        &InboxSchema::DEFAULT,
        inbox_diesel::schema::OptionalColumns {
            lean: LEAN.load(Ordering::Relaxed),
            ..Default::default()
        },
    );
    conn.batch_execute(&inbox).unwrap();
    conn.batch_execute(&kept_sql(inbox_diesel::schema::Backend::Sqlite))
        .unwrap();
    conn.batch_execute(&OUTBOX.create_table_sql(inbox_diesel::schema::Backend::Sqlite))
        .unwrap();
    for statement in accounts_sql(inbox_diesel::schema::Backend::Sqlite) {
        conn.batch_execute(&statement).unwrap();
    }
    connect
}

/// `--instructions [postgres] <variant> <n>`: `n` messages of `variant` on SQLite (or on
/// PostgreSQL), one at a time on one connection, and nothing else — run under
/// `valgrind --tool=callgrind`, whose instruction count does not depend on what else the
/// machine is doing (on PostgreSQL: the client's instructions, not the server's).
fn instructions(backend: &str, variant: &str, n: u64) {
    match backend {
        "sqlite" => {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let connect = sqlite_database(dir.path());
            sqlite::sequential(&mut connect(), variant, n);
        }
        #[cfg(feature = "postgres")]
        "postgres" => {
            let (url, _drop) = postgres_database();
            let mut conn = diesel::PgConnection::establish(&url).unwrap();
            postgres::sequential(&mut conn, variant, n);
        }
        other => panic!(
            "--instructions runs on sqlite or postgres (with --features inbox-examples/postgres), \
             not {other}"
        ),
    }
}

fn bench_sqlite(seconds: f64) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let connect = sqlite_database(dir.path());
    let mut conn = connect();
    let version: String = diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>(
        "sqlite_version()",
    ))
    .get_result(&mut conn)
    .unwrap();
    let label = format!("SQLite {version} (WAL, synchronous = NORMAL)");
    let stored = || {
        sqlite::stored(
            &label,
            seconds,
            &connect,
            "DELETE FROM inbox_kept",
            &|conn| {
                diesel::sql_query(
                    "SELECT CAST(sum(pgsize) AS BIGINT) AS n FROM dbstat WHERE name IN \
                 (SELECT name FROM sqlite_schema WHERE tbl_name = 'inbox_kept')",
                )
                .get_result::<Bytes>(conn)
                .unwrap()
                .n
            },
        )
    };
    if ONLY_STORED.load(Ordering::Relaxed) {
        return stored();
    }
    if ONLY_BODY.load(Ordering::Relaxed) {
        return sqlite::body(&label, seconds, &connect);
    }
    if ONLY_HTTP.load(Ordering::Relaxed) {
        return http::sqlite(&label, seconds, &sqlite_file(dir.path()));
    }
    if ONLY_BATCHES.load(Ordering::Relaxed) {
        println!("\n### {label}: batches");
        sqlite::batches(seconds, &connect, 0);
        return;
    }
    sqlite::run(&label, seconds, &connect, &|conn, rows| {
        conn.batch_execute(&format!(
                "INSERT INTO inbox (message_id, consumer, received_at, processed_at) \
                 WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < {rows}) \
                 SELECT randomblob(16), 'archive', datetime('now', '-10 days'), \
                 datetime('now', '-10 days') FROM seq"
            ))
            .unwrap();
    });
    if LEAN.load(Ordering::Relaxed) || ONLY_MAIN.load(Ordering::Relaxed) {
        return;
    }
    stored();
    sqlite::body(&label, seconds, &connect);
    http::sqlite(&label, seconds, &sqlite_file(dir.path()));
    let list = designs_of(
        inbox_diesel::schema::Backend::Sqlite,
        "no surrogate key (`WITHOUT ROWID`)",
        ("message_id    BLOB", "message_id    TEXT"),
        |_| Vec::new(),
    );
    println!("\n### {label}: table designs");
    designs(
        seconds,
        &connect,
        &list,
        marker_protocol!(
            diesel::SqliteConnection,
            immediate_transaction,
            "INSERT INTO {t} (message_id, consumer, processed_at) \
             VALUES (?, ?, CURRENT_TIMESTAMP) ON CONFLICT DO NOTHING",
            "UPDATE accounts SET balance = balance + 1 WHERE id = ?",
            diesel::sql_types::Binary,
            sqlite_id
        ),
        None,
    );
}

/// A database of its own on a server, dropped afterwards.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn server_database<C: Connection>(admin: &str, schema: &[String]) -> (String, impl Drop + use<C>) {
    struct Dropper<C: Connection>(String, String, std::marker::PhantomData<C>);
    impl<C: Connection> Drop for Dropper<C> {
        fn drop(&mut self) {
            if let Ok(mut admin) = C::establish(&self.0) {
                let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {}", self.1));
            }
        }
    }
    let name = format!("inbox_bench_{}", std::process::id());
    let mut conn = C::establish(admin).unwrap_or_else(|e| panic!("cannot reach {admin}: {e}"));
    conn.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
        .unwrap();
    conn.batch_execute(&format!("CREATE DATABASE {name}"))
        .unwrap();
    let base = admin.rsplit_once('/').expect("a URL with a database").0;
    let url = format!("{base}/{name}");
    let mut conn = C::establish(&url).unwrap();
    for statement in schema {
        conn.batch_execute(statement).unwrap();
    }
    (
        url,
        Dropper::<C>(admin.to_owned(), name, std::marker::PhantomData),
    )
}

/// The PostgreSQL database of a run (`INBOX_BENCH_PG`, or the local server), with the shipped
/// inbox, the accounts, the outbox and the stored-result table; dropped afterwards.
#[cfg(feature = "postgres")]
fn postgres_database() -> (String, impl Drop) {
    let admin = std::env::var("INBOX_BENCH_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut schema = vec![inbox_diesel::schema::postgres::create_table_sql(
        &InboxSchema::DEFAULT,
    )];
    schema.extend(accounts_sql(inbox_diesel::schema::Backend::Postgres));
    schema.push(OUTBOX.create_table_sql(inbox_diesel::schema::Backend::Postgres));
    schema.push(kept_sql(inbox_diesel::schema::Backend::Postgres));
    server_database::<diesel::PgConnection>(&admin, &schema)
}

#[cfg(feature = "postgres")]
fn bench_postgres(seconds: f64) {
    if LEAN.load(Ordering::Relaxed) {
        eprintln!("skipping `postgres`: `--schema lean` is SQLite's design (`--lean`)");
        return;
    }
    let (url, _drop) = postgres_database();
    let connect = || diesel::PgConnection::establish(&url).unwrap();
    let version: String = diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>(
        "current_setting('server_version')",
    ))
    .get_result(&mut connect())
    .unwrap();
    let stored = || {
        postgres::stored(
            &format!("PostgreSQL {version}"),
            seconds,
            &connect,
            "TRUNCATE inbox_kept",
            &|conn| {
                diesel::sql_query("SELECT pg_total_relation_size('inbox_kept') AS n")
                    .get_result::<Bytes>(conn)
                    .unwrap()
                    .n
            },
        )
    };
    if ONLY_STORED.load(Ordering::Relaxed) {
        return stored();
    }
    if ONLY_FLOOR.load(Ordering::Relaxed) {
        return floor::floor(&format!("PostgreSQL {version}"), &url, seconds);
    }
    let body = || {
        let label = format!("PostgreSQL {version}");
        postgres::body(&label, seconds, &connect);
        async_postgres::body(&format!("{label}, diesel-async"), &url, seconds);
    };
    if ONLY_BODY.load(Ordering::Relaxed) {
        return body();
    }
    let http = || http::postgres(&format!("PostgreSQL {version}"), seconds, &url);
    if ONLY_HTTP.load(Ordering::Relaxed) {
        return http();
    }
    if ONLY_BATCHES.load(Ordering::Relaxed) {
        println!("\n### PostgreSQL {version}: batches");
        postgres::batches(seconds, &connect, 0);
        return;
    }
    if !LEAN.load(Ordering::Relaxed) {
        if !ONLY_MAIN.load(Ordering::Relaxed) {
            floor::floor(&format!("PostgreSQL {version}"), &url, seconds);
        }
        async_postgres::run(&format!("PostgreSQL {version}"), &url, seconds);
    }
    postgres::run(
        &format!("PostgreSQL {version}"),
        seconds,
        &connect,
        &|conn, rows| {
            conn.batch_execute(&format!(
                "INSERT INTO inbox (message_id, consumer, received_at, processed_at) \
             SELECT gen_random_uuid(), 'archive', now() - interval '10 days', \
             now() - interval '10 days' FROM generate_series(1, {rows}); ANALYZE inbox"
            ))
            .unwrap();
        },
    );
    if LEAN.load(Ordering::Relaxed) || ONLY_MAIN.load(Ordering::Relaxed) {
        return;
    }
    stored();
    body();
    http();
    let list = designs_of(
        inbox_diesel::schema::Backend::Postgres,
        "no surrogate key (primary key on the pair)",
        ("message_id    UUID", "message_id    TEXT"),
        |shipped| {
            let fill = |name, factor: &str| {
                let with = |sql: &str| sql.replace("FF", factor);
                edited(
                    shipped,
                    name,
                    &[
                        (
                            "PRIMARY KEY,",
                            with("PRIMARY KEY WITH (fillfactor = FF),").as_str(),
                        ),
                        (
                            "consumer);",
                            with("consumer) WITH (fillfactor = FF);").as_str(),
                        ),
                        (
                            "(processed_at);",
                            with("(processed_at) WITH (fillfactor = FF);").as_str(),
                        ),
                    ],
                )
            };
            vec![
                edited(
                    shipped,
                    "consumer in a linguistic collation (ICU)",
                    &[("COLLATE \"C\"", "COLLATE \"und-x-icu\"")],
                ),
                fill("indexes at fillfactor 100", "100"),
                fill("indexes at fillfactor 70", "70"),
            ]
        },
    );
    println!("\n### PostgreSQL {version}: table designs");
    designs(
        seconds,
        &connect,
        &list,
        marker_protocol!(
            diesel::PgConnection,
            transaction,
            "INSERT INTO {t} (message_id, consumer, processed_at) \
             VALUES ($1, $2, now()) ON CONFLICT DO NOTHING",
            "UPDATE accounts SET balance = balance + 1 WHERE id = $1",
            diesel::sql_types::Uuid,
            std::convert::identity
        ),
        Some(&|conn, table| {
            diesel::sql_query(format!(
                "SELECT (pg_total_relation_size('{table}') / \
                 (SELECT count(*) FROM {table}))::BIGINT AS n"
            ))
            .get_result::<Bytes>(conn)
            .unwrap()
            .n
        }),
    );
}

#[cfg(feature = "mysql")]
fn bench_mysql(seconds: f64) {
    if LEAN.load(Ordering::Relaxed) {
        eprintln!("skipping `mysql`: `--schema lean` is SQLite's design (`--lean`)");
        return;
    }
    let admin = std::env::var("INBOX_BENCH_MYSQL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let mut schema = vec![inbox_diesel::schema::mysql::create_table_sql(
        &InboxSchema::DEFAULT,
    )];
    schema.extend(accounts_sql(inbox_diesel::schema::Backend::Mysql));
    schema.push(OUTBOX.create_table_sql(inbox_diesel::schema::Backend::Mysql));
    schema.push(kept_sql(inbox_diesel::schema::Backend::Mysql));
    let (url, _drop) = server_database::<diesel::MysqlConnection>(&admin, &schema);
    let connect = || diesel::MysqlConnection::establish(&url).unwrap();
    let version: String = diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>("VERSION()"))
        .get_result(&mut connect())
        .unwrap();
    let stored = || {
        mysql::stored(
            &format!("MariaDB/MySQL {version}"),
            seconds,
            &connect,
            "TRUNCATE TABLE inbox_kept",
            &|conn| {
                // InnoDB's sizes are in pages and refreshed by ANALYZE.
                conn.batch_execute("ANALYZE TABLE inbox_kept").unwrap();
                diesel::sql_query(
                    "SELECT CAST(data_length + index_length AS SIGNED) AS n \
                 FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name = 'inbox_kept'",
                )
                .get_result::<Bytes>(conn)
                .unwrap()
                .n
            },
        )
    };
    if ONLY_STORED.load(Ordering::Relaxed) {
        return stored();
    }
    let body = || {
        let label = format!("MariaDB/MySQL {version}");
        mysql::body(&label, seconds, &connect);
        async_mysql::body(&format!("{label}, diesel-async"), &url, seconds);
    };
    if ONLY_BODY.load(Ordering::Relaxed) {
        return body();
    }
    let http = || http::mysql(&format!("MariaDB/MySQL {version}"), seconds, &url);
    if ONLY_HTTP.load(Ordering::Relaxed) {
        return http();
    }
    if ONLY_BATCHES.load(Ordering::Relaxed) {
        println!("\n### MariaDB/MySQL {version}: batches");
        mysql::batches(seconds, &connect, 0);
        return;
    }
    async_mysql::run(&format!("MariaDB/MySQL {version}"), &url, seconds);
    mysql::run(
        &format!("MariaDB/MySQL {version}"),
        seconds,
        &connect,
        &|conn, rows| {
            // side × side rows from a digits table: no sequence engine needed.
            let side = (f64::from(rows).sqrt()) as u32;
            assert_eq!(side * side, rows, "the MySQL archive is a square of rows");
            conn.batch_execute("CREATE TEMPORARY TABLE k (i INT NOT NULL)")
                .unwrap();
            conn.batch_execute(&format!(
                "INSERT INTO k WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s \
             WHERE i < {side}) SELECT i FROM s"
            ))
            .unwrap();
            conn.batch_execute(
                "INSERT INTO inbox (message_id, consumer, received_at, processed_at) \
             SELECT UNHEX(MD5(CONCAT(a.i, '-', b.i))), 'archive', \
             NOW(6) - INTERVAL 10 DAY, NOW(6) - INTERVAL 10 DAY FROM k a CROSS JOIN k b",
            )
            .unwrap();
        },
    );
    if ONLY_MAIN.load(Ordering::Relaxed) {
        return;
    }
    stored();
    body();
    http();
    let list = designs_of(
        inbox_diesel::schema::Backend::Mysql,
        "no surrogate key (clustered on the pair)",
        (
            "BINARY(16)",
            "CHAR(36) CHARACTER SET ascii COLLATE ascii_bin",
        ),
        |shipped| {
            vec![edited(
                shipped,
                "consumer in a linguistic collation",
                &[("utf8mb4_bin", "utf8mb4_unicode_ci")],
            )]
        },
    );
    println!("\n### MariaDB/MySQL {version}: table designs");
    designs(
        seconds,
        &connect,
        &list,
        marker_protocol!(
            diesel::MysqlConnection,
            transaction,
            "INSERT INTO {t} (message_id, consumer, processed_at) VALUES (?, ?, NOW(6))",
            "UPDATE accounts SET balance = balance + 1 WHERE id = ?",
            diesel::sql_types::Binary,
            sqlite_id
        ),
        Some(&|conn, table| {
            conn.batch_execute(&format!("ANALYZE TABLE {table}"))
                .unwrap();
            diesel::sql_query(format!(
                "SELECT CAST((data_length + index_length) / (SELECT count(*) FROM {table}) \
                 AS SIGNED) AS n FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name = '{table}'"
            ))
            .get_result::<Bytes>(conn)
            .unwrap()
            .n
        }),
    );
}

fn main() {
    let mut seconds = 2.0;
    let mut backends = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--seconds takes a number")
            }
            "--instructions" => {
                let mut variant = args.next().expect("--instructions takes a variant");
                let backend = match variant.as_str() {
                    "sqlite" | "postgres" => std::mem::replace(
                        &mut variant,
                        args.next().expect("--instructions takes a variant"),
                    ),
                    _ => "sqlite".to_owned(),
                };
                let n = args.next().and_then(|n| n.parse().ok());
                instructions(
                    &backend,
                    &variant,
                    n.expect("--instructions takes a number of messages"),
                );
                return;
            }
            "--smoke" => {
                SMOKE.store(true, Ordering::Relaxed);
                seconds = 0.05;
            }
            "--section" => match args.next().as_deref() {
                Some("stored") => ONLY_STORED.store(true, Ordering::Relaxed),
                Some("batches") => ONLY_BATCHES.store(true, Ordering::Relaxed),
                Some("floor") => ONLY_FLOOR.store(true, Ordering::Relaxed),
                Some("main") => ONLY_MAIN.store(true, Ordering::Relaxed),
                Some("body") => ONLY_BODY.store(true, Ordering::Relaxed),
                Some("http") => ONLY_HTTP.store(true, Ordering::Relaxed),
                other => panic!(
                    "--section takes `main`, `stored`, `batches`, `body`, `http` or `floor`, \
                     not {other:?}"
                ),
            },
            "--schema" => match args.next().as_deref() {
                Some("lean") => LEAN.store(true, Ordering::Relaxed),
                Some("shipped") => {}
                other => panic!("--schema is `shipped` or `lean`, not {other:?}"),
            },
            backend => backends.push(backend.to_owned()),
        }
    }
    if backends.is_empty() {
        backends = vec!["sqlite".into(), "postgres".into(), "mysql".into()];
    }
    println!(
        "# inbox benchmark: {seconds} s per cell; ratio to `plain` at the same concurrency \
         (messages/s in parentheses); {} CPUs; {} schema",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if LEAN.load(Ordering::Relaxed) {
            "lean"
        } else {
            "shipped"
        }
    );
    for backend in backends {
        match backend.as_str() {
            "sqlite" => bench_sqlite(seconds),
            #[cfg(feature = "postgres")]
            "postgres" => bench_postgres(seconds),
            #[cfg(feature = "mysql")]
            "mysql" => bench_mysql(seconds),
            other => eprintln!(
                "skipping `{other}`: not a backend, or built without its feature \
                 (--features inbox-examples/{other})"
            ),
        }
    }
}
