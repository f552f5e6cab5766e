//! The variants, one module per backend: `plain` (the baseline), `#[idempotent]` and its
//! batch and precheck forms, `duplicate`, and the protocols the library is compared with —
//! the same protocol written by hand, the naive check-then-insert, and MassTransit's two
//! transactions. On PostgreSQL and MariaDB also the diesel-async ones.

use super::*;

/// The variants, for one backend: `$conn` its connection, `$inbox` the shipped `table!`,
/// `$id` the message id as that table binds it, `$ts` its timestamp type, `$claim` the
/// hand-written claim (`true` when inserted), `$lock` the second transaction's locking
/// read of the marker.
macro_rules! backend {
    ($name:ident, $conn:ty, $inbox:path, $ts:ty, $id:expr, $begin:ident, $claim:expr, $lock:expr) => {
        pub(crate) mod $name {
            use super::*;
            use $inbox as inbox;

            type Conn = $conn;

            fn write(conn: &mut Conn, worker: usize) -> QueryResult<()> {
                diesel::update(accounts::table.find(worker as i32 + 1))
                    .set(accounts::balance.eq(accounts::balance + 1))
                    .execute(conn)?;
                Ok(())
            }

            /// The realistic body: the worker's balance read, its account updated, a ledger
            /// entry inserted.
            fn transfer(conn: &mut Conn, worker: usize) -> QueryResult<()> {
                let account = worker as i32 + 1;
                let balance: i64 = accounts::table
                    .find(account)
                    .select(accounts::balance)
                    .first(conn)?;
                diesel::update(accounts::table.find(account))
                    .set(accounts::balance.eq(balance + 1))
                    .execute(conn)?;
                diesel::insert_into(ledger::table)
                    .values((
                        ledger::account_id.eq(account),
                        ledger::amount.eq(1),
                        ledger::balance.eq(balance + 1),
                    ))
                    .execute(conn)?;
                Ok(())
            }

            #[idempotent(consumer = "bench", key = *id)]
            fn transferring(conn: &mut Conn, id: &Uuid, worker: usize) -> QueryResult<()> {
                transfer(conn, worker)
            }

            /// The realistic body with and without the inbox: interleaved rounds at each
            /// concurrency, the median of each.
            pub fn body(label: &str, seconds: f64, connect: &(dyn Fn() -> Conn + Sync)) {
                let mut run = 7_000;
                let mut rates = Vec::new();
                // Each round connects anew: one message on each connection before the timing
                // starts, so that neither variant's first timed message prepares its
                // statements, and the handler's startup check has run (on a key of run 6 999).
                let warmed = AtomicU64::new(0);
                let plain = || {
                    let mut conn = connect();
                    conn.$begin(|c| transfer(c, 0)).unwrap();
                    conn
                };
                let checked = || {
                    let mut conn = connect();
                    let id = key(6_999, 0, warmed.fetch_add(1, Ordering::Relaxed));
                    assert!(transferring(&mut conn, &id, 0).unwrap().is_processed());
                    conn
                };
                for clients in CONCURRENCY {
                    let mut rounds = [[0.0; ROUNDS]; 2];
                    for round in 0..ROUNDS {
                        for (slot, cell) in rounds.iter_mut().enumerate() {
                            run += 1;
                            let connect: &(dyn Fn() -> Conn + Sync) = match slot {
                                0 => &plain,
                                _ => &checked,
                            };
                            cell[round] = measure(clients, seconds / ROUNDS as f64, connect, &|c, w, n| {
                                match slot {
                                    0 => c.$begin(|c| transfer(c, w)).unwrap(),
                                    _ => assert!(transferring(c, &key(run, w, n), w).unwrap().is_processed()),
                                }
                                1
                            });
                        }
                    }
                    rates.push(rounds.map(median));
                }
                body_report(label, "clients", &rates);
            }

            fn now() -> diesel::expression::SqlLiteral<diesel::sql_types::Nullable<$ts>> {
                diesel::dsl::sql("CURRENT_TIMESTAMP")
            }

            #[idempotent(consumer = "bench", key = *id)]
            fn handler(conn: &mut Conn, id: &Uuid, worker: usize) -> QueryResult<()> {
                write(conn, worker)
            }

            /// `handler` that also publishes one message of 100 bytes to the outbox.
            #[idempotent(consumer = "bench", key = *id)]
            fn publishing(conn: &mut Conn, id: &Uuid, worker: usize) -> QueryResult<()> {
                write(conn, worker)?;
                OUTBOX.publish(
                    conn,
                    inbox_diesel::outbox::Message::new("bench.credited", [7u8; 100])
                        .key(worker.to_string()),
                )?;
                Ok(())
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

            /// The stored-result section's handlers, on `inbox_kept` (the table with the
            /// optional `result` and `fingerprint` columns): the same write, its marker
            /// alone, with a receipt stored, and with the receipt and the request's digest.
            #[idempotent(consumer = "bench", key = *id, table = "inbox_kept", constraint = "ux_inbox_kept_message_consumer")]
            fn kept_plain(conn: &mut Conn, id: &Uuid, worker: usize) -> QueryResult<()> {
                write(conn, worker)
            }

            #[idempotent(consumer = "bench", key = *id, table = "inbox_kept", constraint = "ux_inbox_kept_message_consumer", store_result = true)]
            fn kept_stored(conn: &mut Conn, id: &Uuid, worker: usize) -> QueryResult<Receipt> {
                write(conn, worker)?;
                Ok(Receipt::of(id, worker))
            }

            #[idempotent(consumer = "bench", key = *id, table = "inbox_kept", constraint = "ux_inbox_kept_message_consumer", store_result = true, fingerprint = request)]
            fn kept_fingerprinted(
                conn: &mut Conn,
                id: &Uuid,
                request: &[u8],
                worker: usize,
            ) -> QueryResult<Receipt> {
                write(conn, worker)?;
                Ok(Receipt::of(id, worker))
            }

            /// What storing a result costs: throughput against the marker alone at 1 and 4
            /// clients, and the table's bytes per row (`size` reads the table's size) after
            /// `kept_rows()` rows of each, written into a table emptied by `clear`.
            pub fn stored(
                label: &str,
                seconds: f64,
                connect: &(dyn Fn() -> Conn + Sync),
                clear: &str,
                size: &dyn Fn(&mut Conn) -> i64,
            ) {
                println!("\n### {label}: stored results");
                println!(
                    "\n| clients | marker only | + stored result | + stored result and fingerprint |\n|---|---:|---:|---:|"
                );
                let request = [7u8; 200];
                let mut run = 5_000;
                for clients in [1, 4] {
                    // Interleaved rounds, the median of each: a machine whose speed drifts
                    // during the section moves the three alike.
                    let mut rounds = [[0.0; ROUNDS]; 3];
                    for round in 0..ROUNDS {
                        for (slot, rates) in rounds.iter_mut().enumerate() {
                            run += 1;
                            rates[round] = measure(clients, seconds / ROUNDS as f64, connect, &|c, w, n| {
                                let id = key(run, w, n);
                                let processed = match slot {
                                    0 => kept_plain(c, &id, w).unwrap().is_processed(),
                                    1 => kept_stored(c, &id, w).unwrap().is_processed(),
                                    _ => kept_fingerprinted(c, &id, &request, w).unwrap().is_processed(),
                                };
                                assert!(processed);
                                1
                            });
                        }
                    }
                    let rates = rounds.map(median);
                    println!(
                        "| {clients} | 1.00 ({:.0}/s) | {:.2} ({:.0}/s) | {:.2} ({:.0}/s) |",
                        rates[0],
                        rates[1] / rates[0],
                        rates[1],
                        rates[2] / rates[0],
                        rates[2]
                    );
                }
                let mut conn = connect();
                let mut per_row = [0; 3];
                for (slot, bytes) in per_row.iter_mut().enumerate() {
                    run += 1;
                    // Storage and all: a `DELETE` leaves PostgreSQL's dead rows behind.
                    conn.batch_execute(clear).unwrap();
                    for n in 0..kept_rows() {
                        let id = key(run, 0, n);
                        let _ = match slot {
                            0 => kept_plain(&mut conn, &id, 0).map(|_| ()),
                            1 => kept_stored(&mut conn, &id, 0).map(|_| ()),
                            _ => kept_fingerprinted(&mut conn, &id, &request, 0).map(|_| ()),
                        }
                        .unwrap();
                    }
                    *bytes = size(&mut conn) / kept_rows() as i64;
                }
                println!(
                    "\nbytes per row ({} rows, indexes included; the receipt is {} bytes of JSON): \
                     marker only {}, + stored result {}, + stored result and fingerprint {}",
                    kept_rows(),
                    serde_json::to_string(&Receipt::of(&key(0, 0, 0), 0)).unwrap().len(),
                    per_row[0],
                    per_row[1],
                    per_row[2]
                );
            }

            /// `n` messages of `variant` one after the other on `conn`, for `--instructions`.
            #[allow(dead_code)]
            pub fn sequential(conn: &mut Conn, variant: &str, n: u64) {
                for m in 0..n {
                    let id = key(9_000, 0, m);
                    match variant {
                        "plain" => conn.$begin(|c| write(c, 0)).unwrap(),
                        "idempotent" => assert!(handler(conn, &id, 0).unwrap().is_processed()),
                        "outbox" => assert!(publishing(conn, &id, 0).unwrap().is_processed()),
                        "hand-written" => hand_written(conn, id, 0).unwrap(),
                        other => panic!(
                            "--instructions takes plain, idempotent, outbox or hand-written, not {other}"
                        ),
                    }
                }
            }

            /// The batch form against one message per transaction, at 1 and 4 clients; `run`
            /// numbers the keys' runs, and the next free number is returned.
            pub fn batches(seconds: f64, connect: &(dyn Fn() -> Conn + Sync), mut run: u64) -> u64 {
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
                run
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
                                "+ outbox" => Box::new(move |c, w, n| {
                                    let outcome = publishing(c, &key(run, w, n), w).unwrap();
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
                                        for n in 0..duplicate_keys() {
                                            let outcome = handler(&mut conn, &key(run, w, n), w);
                                            assert!(outcome.unwrap().is_processed());
                                        }
                                    }
                                    Box::new(move |c, w, n| {
                                        let outcome =
                                            handler(c, &key(run, w, n % duplicate_keys()), w)
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
                if ONLY_MAIN.load(Ordering::Relaxed) {
                    return;
                }

                run = batches(seconds, connect, run);

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
                        for n in 0..duplicate_keys() {
                            assert!(handler(&mut conn, &key(run, w, n), w).unwrap().is_processed());
                        }
                    }
                    let pick = move |w: usize, n: u64, fresh_run: u64| match n % 10 < tenths {
                        true => key(run, w, n % duplicate_keys()),
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

                let rows = archive_rows();
                let mut conn = connect();
                conn.batch_execute("DELETE FROM inbox").unwrap();
                archive(&mut conn, rows);
                let began = Instant::now();
                let report = purge(
                    &mut conn,
                    &InboxSchema::DEFAULT,
                    &Purge::older_than(Duration::from_secs(86_400)),
                )
                .unwrap();
                let took = began.elapsed().as_secs_f64();
                assert_eq!(report.removed, u64::from(rows));
                println!(
                    "\npurge of {rows} completed rows: {took:.1} s, {:.0} rows/s, {} batches of {}",
                    f64::from(rows) / took,
                    report.batches,
                    Purge::DEFAULT_BATCH_SIZE
                );
            }
        }
    };
}

pub(crate) fn sqlite_id(id: Uuid) -> Vec<u8> {
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
        pub(crate) mod $name {
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

            /// The realistic body, as the sync bench's `transfer`.
            async fn transfer(conn: &mut Conn, worker: usize) -> QueryResult<()> {
                let account = worker as i32 + 1;
                let balance: i64 = accounts::table
                    .find(account)
                    .select(accounts::balance)
                    .first(conn)
                    .await?;
                diesel::update(accounts::table.find(account))
                    .set(accounts::balance.eq(balance + 1))
                    .execute(conn)
                    .await?;
                diesel::insert_into(ledger::table)
                    .values((
                        ledger::account_id.eq(account),
                        ledger::amount.eq(1),
                        ledger::balance.eq(balance + 1),
                    ))
                    .execute(conn)
                    .await?;
                Ok(())
            }

            #[idempotent(consumer = "bench", key = *id)]
            async fn transferring(conn: &mut Conn, id: &Uuid, worker: usize) -> QueryResult<()> {
                transfer(conn, worker).await
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
                    // The body's statements prepared, and the handler's startup check run,
                    // before the timing starts.
                    match variant {
                        "body plain" => conn
                            .transaction(async |c| transfer(c, worker).await)
                            .await
                            .unwrap(),
                        "body #[idempotent]" => {
                            let id = key(run, worker, u64::MAX);
                            let outcome = transferring(&mut conn, &id, worker).await;
                            assert!(outcome.unwrap().is_processed());
                        }
                        _ => {}
                    }
                    if variant == "duplicate" {
                        for n in 0..duplicate_keys() {
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
                                "body plain" => conn
                                    .transaction(async |c| transfer(c, worker).await)
                                    .await
                                    .unwrap(),
                                "body #[idempotent]" => {
                                    let id = key(run, worker, n);
                                    let outcome = transferring(&mut conn, &id, worker).await;
                                    assert!(outcome.unwrap().is_processed());
                                }
                                _ => {
                                    let id = key(run, worker, n % duplicate_keys());
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

            /// The realistic body with and without the inbox, tasks as in [`run`]:
            /// interleaved rounds at each concurrency, the median of each.
            pub fn body(label: &str, url: &str, seconds: f64) {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let mut run = 8_000;
                let mut rates = Vec::new();
                for clients in CONCURRENCY {
                    let mut rounds = [[0.0; ROUNDS]; 2];
                    for round in 0..ROUNDS {
                        for (slot, variant) in
                            ["body plain", "body #[idempotent]"].into_iter().enumerate()
                        {
                            run += 1;
                            rounds[slot][round] = runtime.block_on(measure(
                                url,
                                clients,
                                seconds / ROUNDS as f64,
                                variant,
                                run,
                            ));
                        }
                    }
                    rates.push(rounds.map(median));
                }
                body_report(label, "tasks", &rates);
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
