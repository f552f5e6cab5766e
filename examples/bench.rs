//! Throughput of an `#[idempotent]` handler against its baselines and peers, measured in one
//! run and reported as ratios (absolute figures on a shared machine are noise).
//!
//! ```text
//! cargo run --release --example bench --features inbox-examples/postgres,inbox-examples/mysql \
//!     -- [--seconds 2] [sqlite] [postgres] [mysql]
//! ```
//!
//! `--schema lean` runs the inbox without its surrogate key on SQLite and PostgreSQL (the
//! variants that need the shipped `table!` and purge are left out), to compare the two.
//!
//! `--instructions <plain|idempotent|hand-written> <n>` runs `n` messages of one variant on
//! SQLite, one at a time, and nothing else: for `valgrind --tool=callgrind`, whose
//! instruction count a shared machine's load does not move (BENCHMARKS.md).
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
//! PostgreSQL and MariaDB also `plain`, `#[idempotent]` and `duplicate` on diesel-async.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::purge::{Purge, purge};
use inbox_diesel::{InboxSchema, Uuid, idempotent};

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

const CONSUMER: &str = "bench";
const CONCURRENCY: [usize; 3] = [1, 4, 16];
const VARIANTS: [&str; 6] = [
    "plain",
    "#[idempotent]",
    "hand-written",
    "duplicate",
    "naive",
    "two transactions",
];
/// `--schema lean`: the inbox without its surrogate key (see `lean_schema`).
static LEAN: AtomicBool = AtomicBool::new(false);

/// The variants that run on the lean schema: the others use the shipped `table!`, which
/// has the surrogate key.
const LEAN_VARIANTS: [&str; 3] = ["plain", "#[idempotent]", "duplicate"];

/// The variants of this run.
fn variants() -> &'static [&'static str] {
    match LEAN.load(Ordering::Relaxed) {
        true => &LEAN_VARIANTS,
        false => &VARIANTS,
    }
}

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

/// Keys each worker processes before the duplicate variant runs over them again.
const DUPLICATE_KEYS: u64 = 500;

/// The key of message `n` of `worker` in run `run`: never seen before by the other variants.
fn key(run: u64, worker: usize, n: u64) -> Uuid {
    Uuid::from_u128((u128::from(run) << 96) | ((worker as u128) << 64) | u128::from(n))
}

/// A measured cell: messages per second.
struct Cell {
    variant: &'static str,
    clients: usize,
    per_second: f64,
}

/// `workers` threads, each with its own connection, run `message` (which returns how many
/// messages it handled) for `seconds` after a common start; returns the messages per second.
fn measure<C: Send>(
    workers: usize,
    seconds: f64,
    connect: &(dyn Fn() -> C + Sync),
    message: &(dyn Fn(&mut C, usize, u64) -> u64 + Sync),
) -> f64 {
    let start = Barrier::new(workers + 1);
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let elapsed = std::thread::scope(|scope| {
        for worker in 0..workers {
            let (start, stop, done) = (&start, &stop, &done);
            scope.spawn(move || {
                let mut conn = connect();
                start.wait();
                let (mut n, mut messages) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    messages += message(&mut conn, worker, n);
                    n += 1;
                }
                done.fetch_add(messages, Ordering::Relaxed);
            });
        }
        start.wait();
        let began = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        began.elapsed()
    });
    done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64()
}

/// The messages per second of `variant` at `clients`, NaN when it was not measured.
fn rate(cells: &[Cell], variant: &str, clients: usize) -> f64 {
    cells
        .iter()
        .find(|c| c.variant == variant && c.clients == clients)
        .map_or(f64::NAN, |c| c.per_second)
}

fn report(backend: &str, cells: &[Cell]) {
    println!("\n### {backend}\n");
    print!("| variant |");
    for clients in CONCURRENCY {
        print!(" {clients} client{} |", if clients == 1 { "" } else { "s" });
    }
    println!("\n|---|{}", "---:|".repeat(CONCURRENCY.len()));
    for variant in variants() {
        print!("| {variant} |");
        for clients in CONCURRENCY {
            let (value, plain) = (rate(cells, variant, clients), rate(cells, "plain", clients));
            print!(" {:.2} ({:.0}/s) |", value / plain, value);
        }
        println!();
    }
    let ratio = |a: &str, b: &str| {
        CONCURRENCY
            .iter()
            .map(|&clients| format!("{:.2}", rate(cells, a, clients) / rate(cells, b, clients)))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    println!();
    for (line, a, b) in [
        (
            "library overhead, #[idempotent] / hand-written",
            "#[idempotent]",
            "hand-written",
        ),
        (
            "duplicate path / processing path",
            "duplicate",
            "#[idempotent]",
        ),
        (
            "#[idempotent] / two transactions",
            "#[idempotent]",
            "two transactions",
        ),
    ] {
        if variants().contains(&a) && variants().contains(&b) {
            println!("{line} (1 / 4 / 16 clients): {}", ratio(a, b));
        }
    }
}

/// The variants, for one backend: `$conn` its connection, `$inbox` the shipped `table!`,
/// `$id` the message id as that table binds it, `$ts` its timestamp type, `$claim` the
/// hand-written claim (`true` when inserted), `$lock` the second transaction's locking
/// read of the marker.
macro_rules! backend {
    ($name:ident, $conn:ty, $inbox:path, $ts:ty, $id:expr, $begin:ident, $claim:expr, $lock:expr) => {
        mod $name {
            use super::*;
            use $inbox as inbox;

            type Conn = $conn;

            fn write(conn: &mut Conn, worker: usize) -> QueryResult<()> {
                diesel::update(accounts::table.find(worker as i32 + 1))
                    .set(accounts::balance.eq(accounts::balance + 1))
                    .execute(conn)?;
                Ok(())
            }

            fn now() -> diesel::expression::SqlLiteral<diesel::sql_types::Nullable<$ts>> {
                diesel::dsl::sql("CURRENT_TIMESTAMP")
            }

            #[idempotent(consumer = "bench", key = *id)]
            fn handler(conn: &mut Conn, id: &Uuid, worker: usize) -> QueryResult<()> {
                write(conn, worker)
            }

            /// The batch form: the same write once per new message, one transaction per batch.
            #[idempotent(consumer = "bench", batch = ids, key = |id| *id)]
            fn batch_handler(conn: &mut Conn, ids: &[Uuid], worker: usize) -> QueryResult<usize> {
                for _ in ids {
                    write(conn, worker)?;
                }
                Ok(ids.len())
            }

            /// The fast path under test: an autocommitted existence check before the handler,
            /// which skips the transaction for a message already processed.
            fn prechecked(conn: &mut Conn, id: Uuid, worker: usize) -> QueryResult<()> {
                let seen: bool = diesel::select(diesel::dsl::exists(
                    inbox::table
                        .filter(inbox::message_id.eq($id(id)))
                        .filter(inbox::consumer.eq(CONSUMER))
                        .select(inbox::consumer),
                ))
                .get_result(conn)?;
                if !seen {
                    let _ = handler(conn, &id, worker)?;
                }
                Ok(())
            }

            /// The batch form with a set-based body: one `UPDATE` for all the new messages.
            #[idempotent(consumer = "bench", batch = ids, key = |id| *id)]
            fn batch_handler_set_based(
                conn: &mut Conn,
                ids: &[Uuid],
                worker: usize,
            ) -> QueryResult<usize> {
                diesel::update(accounts::table.find(worker as i32 + 1))
                    .set(accounts::balance.eq(accounts::balance + ids.len() as i64))
                    .execute(conn)?;
                Ok(ids.len())
            }

            fn hand_written(conn: &mut Conn, id: Uuid, worker: usize) -> QueryResult<()> {
                conn.$begin(|c| {
                    let claim: fn(&mut Conn, Uuid) -> QueryResult<bool> = $claim;
                    if claim(c, id)? {
                        write(c, worker)?;
                    }
                    Ok(())
                })
            }

            fn naive(conn: &mut Conn, id: Uuid, worker: usize) -> QueryResult<()> {
                let result = conn.$begin(|c| {
                    let seen: bool = diesel::select(diesel::dsl::exists(
                        inbox::table
                            .filter(inbox::message_id.eq($id(id)))
                            .filter(inbox::consumer.eq(CONSUMER)),
                    ))
                    .get_result(c)?;
                    if seen {
                        return Ok(());
                    }
                    write(c, worker)?;
                    diesel::insert_into(inbox::table)
                        .values((
                            inbox::message_id.eq($id(id)),
                            inbox::consumer.eq(CONSUMER),
                            inbox::processed_at.eq(now()),
                        ))
                        .execute(c)?;
                    Ok(())
                });
                match result {
                    Err(diesel::result::Error::DatabaseError(
                        diesel::result::DatabaseErrorKind::UniqueViolation,
                        _,
                    )) => Ok(()),
                    other => other,
                }
            }

            fn two_transactions(conn: &mut Conn, id: Uuid, worker: usize) -> QueryResult<()> {
                let inserted = diesel::insert_into(inbox::table)
                    .values((inbox::message_id.eq($id(id)), inbox::consumer.eq(CONSUMER)))
                    .execute(conn);
                match inserted {
                    Ok(_) => {}
                    Err(diesel::result::Error::DatabaseError(
                        diesel::result::DatabaseErrorKind::UniqueViolation,
                        _,
                    )) => return Ok(()),
                    Err(e) => return Err(e),
                }
                conn.$begin(|c| {
                    let lock: fn(&mut Conn, Uuid) -> QueryResult<bool> = $lock;
                    if lock(c, id)? {
                        write(c, worker)?;
                        diesel::update(
                            inbox::table
                                .filter(inbox::message_id.eq($id(id)))
                                .filter(inbox::consumer.eq(CONSUMER)),
                        )
                        .set(inbox::processed_at.eq(now()))
                        .execute(c)?;
                    }
                    Ok(())
                })
            }

            /// `n` messages of `variant` one after the other on `conn`, for `--instructions`.
            #[allow(dead_code)]
            pub fn sequential(conn: &mut Conn, variant: &str, n: u64) {
                for m in 0..n {
                    let id = key(9_000, 0, m);
                    match variant {
                        "plain" => conn.$begin(|c| write(c, 0)).unwrap(),
                        "idempotent" => assert!(handler(conn, &id, 0).unwrap().is_processed()),
                        "hand-written" => hand_written(conn, id, 0).unwrap(),
                        other => panic!(
                            "--instructions takes plain, idempotent or hand-written, not {other}"
                        ),
                    }
                }
            }

            /// The table of ratios, and purge on a large inbox.
            pub fn run(
                label: &str,
                seconds: f64,
                connect: &(dyn Fn() -> Conn + Sync),
                archive: &dyn Fn(&mut Conn, u32),
            ) {
                let mut cells = Vec::new();
                let mut run = 0;
                for clients in CONCURRENCY {
                    for &variant in variants() {
                        run += 1;
                        let message: Box<dyn Fn(&mut Conn, usize, u64) -> u64 + Sync> =
                            match variant {
                                "plain" => Box::new(|c, w, _| {
                                    c.$begin(|c| write(c, w)).unwrap();
                                    1
                                }),
                                "#[idempotent]" => Box::new(move |c, w, n| {
                                    let outcome = handler(c, &key(run, w, n), w).unwrap();
                                    assert!(outcome.is_processed());
                                    1
                                }),
                                "hand-written" => Box::new(move |c, w, n| {
                                    hand_written(c, key(run, w, n), w).unwrap();
                                    1
                                }),
                                "duplicate" => {
                                    // Processed once, then delivered again and again.
                                    let mut conn = connect();
                                    for w in 0..clients {
                                        for n in 0..DUPLICATE_KEYS {
                                            let outcome = handler(&mut conn, &key(run, w, n), w);
                                            assert!(outcome.unwrap().is_processed());
                                        }
                                    }
                                    Box::new(move |c, w, n| {
                                        let outcome =
                                            handler(c, &key(run, w, n % DUPLICATE_KEYS), w)
                                                .unwrap();
                                        assert!(outcome.is_duplicate());
                                        1
                                    })
                                }
                                "naive" => Box::new(move |c, w, n| {
                                    naive(c, key(run, w, n), w).unwrap();
                                    1
                                }),
                                "two transactions" => Box::new(move |c, w, n| {
                                    two_transactions(c, key(run, w, n), w).unwrap();
                                    1
                                }),
                                _ => unreachable!(),
                            };
                        let per_second = measure(clients, seconds, connect, &*message);
                        cells.push(Cell {
                            variant,
                            clients,
                            per_second,
                        });
                    }
                }
                report(label, &cells);

                // The batch form against one message per transaction, at 1 and 4 clients.
                println!("\n| batch size | 1 client | 4 clients |\n|---|---:|---:|");
                let mut per_message = [0.0; 2];
                for (slot, clients) in [1, 4].into_iter().enumerate() {
                    run += 1;
                    per_message[slot] = measure(clients, seconds, connect, &|c, w, n| {
                        assert!(handler(c, &key(run, w, n), w).unwrap().is_processed());
                        1
                    });
                }
                println!(
                    "| 1 (#[idempotent]) | 1.00 ({:.0}/s) | 1.00 ({:.0}/s) |",
                    per_message[0], per_message[1]
                );
                for (body, set_based) in [("", false), (", set-based body", true)] {
                    for size in [10u64, 100, 1000] {
                        print!("| {size}{body} |");
                        for (slot, clients) in [1, 4].into_iter().enumerate() {
                            run += 1;
                            let per_second = measure(clients, seconds, connect, &|c, w, n| {
                                let ids: Vec<Uuid> =
                                    (n * size..(n + 1) * size).map(|m| key(run, w, m)).collect();
                                let outcome = match set_based {
                                    true => batch_handler_set_based(c, &ids, w),
                                    false => batch_handler(c, &ids, w),
                                };
                                assert_eq!(outcome.unwrap().processed.len() as u64, size);
                                size
                            });
                            print!(" {:.1} ({per_second:.0}/s) |", per_second / per_message[slot]);
                        }
                        println!();
                    }
                }

                // The fast path: worth its extra round trip for new messages only when enough
                // deliveries are duplicates. 4 clients; message n is a redelivery of an
                // already processed key when n % 10 < tenths.
                println!(
                    "\n| duplicates | #[idempotent] | existence check first | ratio |\n|---|---:|---:|---:|"
                );
                for tenths in [0u64, 2, 5, 8, 10] {
                    run += 1;
                    let mut conn = connect();
                    for w in 0..4 {
                        for n in 0..DUPLICATE_KEYS {
                            assert!(handler(&mut conn, &key(run, w, n), w).unwrap().is_processed());
                        }
                    }
                    let pick = move |w: usize, n: u64, fresh_run: u64| match n % 10 < tenths {
                        true => key(run, w, n % DUPLICATE_KEYS),
                        false => key(fresh_run, w, n),
                    };
                    let (plain_run, checked_run) = (run + 1, run + 2);
                    run += 2;
                    let direct = measure(4, seconds, connect, &|c, w, n| {
                        let _ = handler(c, &pick(w, n, plain_run), w).unwrap();
                        1
                    });
                    let checked = measure(4, seconds, connect, &|c, w, n| {
                        prechecked(c, pick(w, n, checked_run), w).unwrap();
                        1
                    });
                    println!(
                        "| {} % | {direct:.0}/s | {checked:.0}/s | {:.2} |",
                        tenths * 10,
                        checked / direct
                    );
                }

                if LEAN.load(Ordering::Relaxed) {
                    // Purge picks its batches by the surrogate key.
                    return;
                }
                const ROWS: u32 = 1_000_000;
                let mut conn = connect();
                conn.batch_execute("DELETE FROM inbox").unwrap();
                archive(&mut conn, ROWS);
                let began = Instant::now();
                let report = purge(
                    &mut conn,
                    &InboxSchema::DEFAULT,
                    &Purge::older_than(Duration::from_secs(86_400)),
                )
                .unwrap();
                let took = began.elapsed().as_secs_f64();
                assert_eq!(report.removed, u64::from(ROWS));
                println!(
                    "\npurge of {ROWS} completed rows: {took:.1} s, {:.0} rows/s, {} batches of {}",
                    f64::from(ROWS) / took,
                    report.batches,
                    Purge::DEFAULT_BATCH_SIZE
                );
            }
        }
    };
}

fn sqlite_id(id: Uuid) -> Vec<u8> {
    id.as_bytes().to_vec()
}

backend!(
    sqlite,
    diesel::SqliteConnection,
    inbox_diesel::schema::sqlite::inbox,
    diesel::sql_types::Timestamp,
    sqlite_id,
    immediate_transaction,
    |c, id| {
        diesel::insert_into(inbox::table)
            .values((
                inbox::message_id.eq(sqlite_id(id)),
                inbox::consumer.eq(CONSUMER),
                inbox::processed_at.eq(now()),
            ))
            .on_conflict((inbox::message_id, inbox::consumer))
            .do_nothing()
            .execute(c)
            .map(|n| n > 0)
    },
    |c, id| {
        // SQLite has no FOR UPDATE: BEGIN IMMEDIATE already holds the write lock.
        inbox::table
            .filter(inbox::message_id.eq(sqlite_id(id)))
            .filter(inbox::consumer.eq(CONSUMER))
            .filter(inbox::processed_at.is_null())
            .select(inbox::id)
            .first::<i32>(c)
            .optional()
            .map(|row| row.is_some())
    }
);

#[cfg(feature = "postgres")]
backend!(
    postgres,
    diesel::PgConnection,
    inbox_diesel::schema::postgres::inbox,
    diesel::sql_types::Timestamptz,
    std::convert::identity,
    transaction,
    |c, id| {
        diesel::insert_into(inbox::table)
            .values((
                inbox::message_id.eq(id),
                inbox::consumer.eq(CONSUMER),
                inbox::processed_at.eq(now()),
            ))
            .on_conflict((inbox::message_id, inbox::consumer))
            .do_nothing()
            .execute(c)
            .map(|n| n > 0)
    },
    |c, id| {
        inbox::table
            .filter(inbox::message_id.eq(id))
            .filter(inbox::consumer.eq(CONSUMER))
            .filter(inbox::processed_at.is_null())
            .select(inbox::id)
            .for_update()
            .first::<i64>(c)
            .optional()
            .map(|row| row.is_some())
    }
);

#[cfg(feature = "mysql")]
backend!(
    mysql,
    diesel::MysqlConnection,
    inbox_diesel::schema::mysql::inbox,
    diesel::sql_types::Datetime,
    sqlite_id,
    transaction,
    |c, id| {
        let inserted = diesel::insert_into(inbox::table)
            .values((
                inbox::message_id.eq(sqlite_id(id)),
                inbox::consumer.eq(CONSUMER),
                inbox::processed_at.eq(now()),
            ))
            .execute(c);
        match inserted {
            Ok(_) => Ok(true),
            Err(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::UniqueViolation,
                _,
            )) => Ok(false),
            Err(e) => Err(e),
        }
    },
    |c, id| {
        inbox::table
            .filter(inbox::message_id.eq(sqlite_id(id)))
            .filter(inbox::consumer.eq(CONSUMER))
            .filter(inbox::processed_at.is_null())
            .select(inbox::id)
            .for_update()
            .first::<i64>(c)
            .optional()
            .map(|row| row.is_some())
    }
);

/// The same comparison on diesel-async: `plain`, `#[idempotent]` and `duplicate`, tasks on a
/// multi-threaded tokio runtime, each with its own connection.
#[cfg(any(feature = "postgres", feature = "mysql"))]
macro_rules! async_backend {
    ($name:ident, $conn:ty) => {
        mod $name {
            use std::sync::Arc;

            use diesel::{ExpressionMethods, QueryDsl, QueryResult};
            use diesel_async::{AsyncConnection, RunQueryDsl};

            use super::*;

            type Conn = $conn;

            async fn write(conn: &mut Conn, worker: usize) -> QueryResult<()> {
                diesel::update(accounts::table.find(worker as i32 + 1))
                    .set(accounts::balance.eq(accounts::balance + 1))
                    .execute(conn)
                    .await?;
                Ok(())
            }

            #[idempotent(consumer = "bench", key = *id)]
            async fn handler(conn: &mut Conn, id: &Uuid, worker: usize) -> QueryResult<()> {
                write(conn, worker).await
            }

            /// `tasks` tasks run `variant` for `seconds`; messages per second.
            async fn measure(
                url: &str,
                tasks: usize,
                seconds: f64,
                variant: &'static str,
                run: u64,
            ) -> f64 {
                let start = Arc::new(tokio::sync::Barrier::new(tasks + 1));
                let stop = Arc::new(AtomicBool::new(false));
                let mut handles = Vec::new();
                for worker in 0..tasks {
                    let mut conn = Conn::establish(url).await.unwrap();
                    if variant == "duplicate" {
                        for n in 0..DUPLICATE_KEYS {
                            let outcome = handler(&mut conn, &key(run, worker, n), worker).await;
                            assert!(outcome.unwrap().is_processed());
                        }
                    }
                    let (start, stop) = (start.clone(), stop.clone());
                    handles.push(tokio::spawn(async move {
                        start.wait().await;
                        let mut n = 0;
                        while !AtomicBool::load(&stop, Ordering::Relaxed) {
                            match variant {
                                "plain" => conn
                                    .transaction(async |c| write(c, worker).await)
                                    .await
                                    .unwrap(),
                                "#[idempotent]" => {
                                    let id = key(run, worker, n);
                                    let outcome = handler(&mut conn, &id, worker).await;
                                    assert!(outcome.unwrap().is_processed());
                                }
                                _ => {
                                    let id = key(run, worker, n % DUPLICATE_KEYS);
                                    let outcome = handler(&mut conn, &id, worker).await;
                                    assert!(outcome.unwrap().is_duplicate());
                                }
                            }
                            n += 1;
                        }
                        n
                    }));
                }
                start.wait().await;
                let began = Instant::now();
                tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
                stop.store(true, Ordering::Relaxed);
                let mut done = 0;
                for handle in handles {
                    done += handle.await.unwrap();
                }
                done as f64 / began.elapsed().as_secs_f64()
            }

            pub fn run(label: &str, url: &str, seconds: f64) {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let mut cells = Vec::new();
                let mut run = 1_000;
                for clients in CONCURRENCY {
                    for variant in ["plain", "#[idempotent]", "duplicate"] {
                        run += 1;
                        let per_second =
                            runtime.block_on(measure(url, clients, seconds, variant, run));
                        cells.push(Cell {
                            variant,
                            clients,
                            per_second,
                        });
                    }
                }
                println!("\n### {label}, diesel-async\n");
                println!("| variant | 1 task | 4 tasks | 16 tasks |\n|---|---:|---:|---:|");
                for variant in ["plain", "#[idempotent]", "duplicate"] {
                    print!("| {variant} |");
                    for clients in CONCURRENCY {
                        let value = rate(&cells, variant, clients);
                        print!(
                            " {:.2} ({value:.0}/s) |",
                            value / rate(&cells, "plain", clients)
                        );
                    }
                    println!();
                }
            }
        }
    };
}

#[cfg(feature = "postgres")]
async_backend!(async_postgres, diesel_async::AsyncPgConnection);
#[cfg(feature = "mysql")]
async_backend!(async_mysql, diesel_async::AsyncMysqlConnection);

/// A design of the inbox table, for the table-design section: `ddl` creates it under the
/// name `{t}`, and `text_key` says whether the message id is stored as 36 characters of
/// text instead of 16 bytes.
struct Design {
    name: &'static str,
    ddl: String,
    text_key: bool,
}

impl Design {
    fn new(name: &'static str, ddl: &str) -> Self {
        Design {
            name,
            ddl: ddl.to_owned(),
            text_key: false,
        }
    }

    fn text_key(self) -> Self {
        Design {
            text_key: true,
            ..self
        }
    }

    /// The shipped table of `backend` under the name `{t}`.
    fn shipped(backend: inbox_diesel::schema::Backend) -> Self {
        let schema = InboxSchema::new("design", "ux_design").expect("plain identifiers");
        Design::new(
            "shipped",
            &backend.create_table_sql(&schema).replace("design", "{t}"),
        )
    }
}

/// One message of the table-design section: the connection, the design's table and whether
/// its key is text (none: the baseline without a marker), the key, the worker.
type Marker<C> = dyn Fn(&mut C, Option<(&str, bool)>, Uuid, usize) -> QueryResult<()> + Sync;

/// The bytes a design's table and its indexes take per row, where the server says.
type TableSize<C> = dyn Fn(&mut C, &str) -> i64;

/// The table-design section: the same marker protocol, written in SQL, on each design's
/// own table, against the same transaction without a marker. `mark` runs one message in
/// one transaction: the marker insert into the table it is given (none: the baseline),
/// then the business write.
fn designs<C: SimpleConnection + Send>(
    seconds: f64,
    connect: &(dyn Fn() -> C + Sync),
    designs: &[Design],
    mark: &Marker<C>,
    size: Option<&TableSize<C>>,
) {
    let mut conn = connect();
    let mut tables = Vec::new();
    for (n, design) in designs.iter().enumerate() {
        let table = format!("design_{n}");
        conn.batch_execute(&design.ddl.replace("{t}", &table))
            .unwrap_or_else(|e| panic!("{}: {e}", design.name));
        tables.push(table);
    }
    drop(conn);
    let mut rows = vec![Vec::new(); designs.len()];
    let mut baseline = Vec::new();
    for (round, clients) in CONCURRENCY.into_iter().enumerate() {
        baseline.push(measure(clients, seconds, connect, &|c, w, n| {
            mark(c, None, key(0, w, n), w).unwrap();
            1
        }));
        for (slot, design) in designs.iter().enumerate() {
            let table = tables[slot].as_str();
            let run = 2_000 + (round * designs.len() + slot) as u64;
            rows[slot].push(measure(clients, seconds, connect, &|c, w, n| {
                mark(c, Some((table, design.text_key)), key(run, w, n), w).unwrap();
                1
            }));
        }
    }
    let (size_head, size_rule) = match size {
        Some(_) => (" bytes per row (table and indexes) |", "---:|"),
        None => ("", ""),
    };
    println!(
        "\n| table design | 1 client | 4 clients | 16 clients |{size_head}\n|---|---:|---:|---:|{size_rule}"
    );
    print!("| no marker |");
    for per_second in &baseline {
        print!(" 1.00 ({per_second:.0}/s) |");
    }
    println!("{}", if size.is_some() { " |" } else { "" });
    let mut conn = connect();
    for ((design, row), table) in designs.iter().zip(&rows).zip(&tables) {
        print!("| {} |", design.name);
        for (per_second, plain) in row.iter().zip(&baseline) {
            print!(" {:.2} ({per_second:.0}/s) |", per_second / plain);
        }
        match size {
            Some(size) => println!(" {} |", size(&mut conn, table)),
            None => println!(),
        }
    }
}

#[derive(QueryableByName)]
struct Bytes {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// The designs measured on `backend`: the shipped table's message id as text (`key_type`: its
/// type as shipped and as text), the backend's `extra` designs, the shipped table without its
/// `processed_at` index, the table without its surrogate key (`lean`) with and without that
/// index, and the shipped table.
fn designs_of(
    backend: inbox_diesel::schema::Backend,
    lean: &'static str,
    key_type: (&str, &str),
    extra: impl FnOnce(&Design) -> Vec<Design>,
) -> Vec<Design> {
    let shipped = Design::shipped(backend);
    let lean = Design::new(
        lean,
        &lean_schema(&backend.to_string()).replace("inbox", "{t}"),
    );
    let purge_index = match backend {
        inbox_diesel::schema::Backend::Mysql => ",\n    KEY ix_{t}_processed_at (processed_at)",
        _ => "CREATE INDEX IF NOT EXISTS ix_{t}_processed_at ON {t} (processed_at);\n",
    };
    let mut list = vec![edited(&shipped, "message_id as text", &[key_type]).text_key()];
    list.extend(extra(&shipped));
    list.push(edited(
        &shipped,
        "no `processed_at` index",
        &[(purge_index, "")],
    ));
    list.push(edited(
        &lean,
        "no surrogate key, no `processed_at` index",
        &[(
            "CREATE INDEX ix_{t}_processed_at ON {t} (processed_at);",
            "",
        )],
    ));
    list.extend([lean, shipped]);
    list
}

/// `design` with `from` replaced by `to` in its SQL, under another name; `from` must occur.
fn edited(design: &Design, name: &'static str, edits: &[(&str, &str)]) -> Design {
    let mut ddl = design.ddl.clone();
    for (from, to) in edits {
        assert!(ddl.contains(from), "{name}: `{from}` is not in\n{ddl}");
        ddl = ddl.replace(from, to);
    }
    Design {
        name,
        ddl,
        text_key: design.text_key,
    }
}

/// One message in one transaction for the table-design section: the marker insert into
/// `$table` (with the key bound as `$key` or as text), then the business write.
macro_rules! marker_protocol {
    ($conn:ty, $begin:ident, $insert:literal, $update:literal, $key:ty, $bytes:expr) => {
        &|c: &mut $conn, table: Option<(&str, bool)>, id: Uuid, worker: usize| {
            use diesel::sql_types::{Integer, Text};
            c.$begin(|c| {
                if let Some((table, text_key)) = table {
                    let insert = diesel::sql_query(format!($insert, t = table));
                    let inserted = match text_key {
                        true => insert
                            .bind::<Text, _>(id.to_string())
                            .bind::<Text, _>(CONSUMER)
                            .execute(c)?,
                        false => insert
                            .bind::<$key, _>($bytes(id))
                            .bind::<Text, _>(CONSUMER)
                            .execute(c)?,
                    };
                    assert_eq!(inserted, 1, "every key is new");
                }
                diesel::sql_query($update)
                    .bind::<Integer, _>(worker as i32 + 1)
                    .execute(c)?;
                Ok(())
            })
        }
    };
}

/// The accounts the workers write, one row each.
fn accounts_sql() -> Vec<String> {
    let mut statements =
        vec!["CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL)".to_owned()];
    let rows: Vec<String> = (1..=16).map(|id| format!("({id}, 0)")).collect();
    statements.push(format!(
        "INSERT INTO accounts (id, balance) VALUES {}",
        rows.join(", ")
    ));
    statements
}

/// A SQLite database file in `dir` with the inbox and the accounts; how to connect to it.
fn sqlite_database(dir: &std::path::Path) -> impl Fn() -> diesel::SqliteConnection + Sync {
    let url = dir.join("bench.sqlite").display().to_string();
    let connect = move || {
        let mut conn = diesel::SqliteConnection::establish(&url).unwrap();
        conn.batch_execute(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 10000;",
        )
        .unwrap();
        conn
    };
    let mut conn = connect();
    let inbox = match LEAN.load(Ordering::Relaxed) {
        true => lean_schema("sqlite"),
        false => inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT),
    };
    conn.batch_execute(&inbox).unwrap();
    for statement in accounts_sql() {
        conn.batch_execute(&statement).unwrap();
    }
    connect
}

/// `--instructions <variant> <n>`: `n` messages of `variant` on SQLite, one at a time on one
/// connection, and nothing else — run under `valgrind --tool=callgrind`, whose instruction
/// count does not depend on what else the machine is doing.
fn instructions(variant: &str, n: u64) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let connect = sqlite_database(dir.path());
    sqlite::sequential(&mut connect(), variant, n);
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
    sqlite::run(&label, seconds, &connect, &|conn, rows| {
        conn.batch_execute(&format!(
                "INSERT INTO inbox (message_id, consumer, received_at, processed_at) \
                 WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < {rows}) \
                 SELECT randomblob(16), 'archive', datetime('now', '-10 days'), \
                 datetime('now', '-10 days') FROM seq"
            ))
            .unwrap();
    });
    if LEAN.load(Ordering::Relaxed) {
        return;
    }
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
fn server_database<C: Connection>(admin: &str, schema: &[String]) -> (String, impl Drop) {
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

#[cfg(feature = "postgres")]
fn bench_postgres(seconds: f64) {
    let admin = std::env::var("INBOX_BENCH_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut schema = vec![match LEAN.load(Ordering::Relaxed) {
        true => lean_schema("postgres"),
        false => inbox_diesel::schema::postgres::create_table_sql(&InboxSchema::DEFAULT),
    }];
    schema.extend(accounts_sql());
    let (url, _drop) = server_database::<diesel::PgConnection>(&admin, &schema);
    let connect = || diesel::PgConnection::establish(&url).unwrap();
    let version: String = diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>(
        "current_setting('server_version')",
    ))
    .get_result(&mut connect())
    .unwrap();
    if !LEAN.load(Ordering::Relaxed) {
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
    if LEAN.load(Ordering::Relaxed) {
        return;
    }
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
    let admin = std::env::var("INBOX_BENCH_MYSQL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let mut schema = vec![inbox_diesel::schema::mysql::create_table_sql(
        &InboxSchema::DEFAULT,
    )];
    schema.extend(accounts_sql());
    let (url, _drop) = server_database::<diesel::MysqlConnection>(&admin, &schema);
    let connect = || diesel::MysqlConnection::establish(&url).unwrap();
    let version: String = diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>("VERSION()"))
        .get_result(&mut connect())
        .unwrap();
    async_mysql::run(&format!("MariaDB/MySQL {version}"), &url, seconds);
    mysql::run(
        &format!("MariaDB/MySQL {version}"),
        seconds,
        &connect,
        &|conn, rows| {
            // 1000 × 1000 rows from a 1000-row digits table: no sequence engine needed.
            conn.batch_execute("CREATE TEMPORARY TABLE k (i INT NOT NULL)")
                .unwrap();
            conn.batch_execute(
                "INSERT INTO k WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s \
             WHERE i < 1000) SELECT i FROM s",
            )
            .unwrap();
            assert_eq!(rows, 1_000_000, "the MySQL archive is 1000 × 1000 rows");
            conn.batch_execute(
                "INSERT INTO inbox (message_id, consumer, received_at, processed_at) \
             SELECT UNHEX(MD5(CONCAT(a.i, '-', b.i))), 'archive', \
             NOW(6) - INTERVAL 10 DAY, NOW(6) - INTERVAL 10 DAY FROM k a CROSS JOIN k b",
            )
            .unwrap();
        },
    );
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
                let variant = args.next().expect("--instructions takes a variant");
                let n = args.next().and_then(|n| n.parse().ok());
                instructions(
                    &variant,
                    n.expect("--instructions takes a number of messages"),
                );
                return;
            }
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
