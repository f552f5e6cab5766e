#![cfg(feature = "postgres")]
//! PgBouncer (Debian's package, 1.18: no prepared statements across server connections) in
//! front of the test server, started by the test on a port of its own: four consumers, each
//! message delivered by two of them, every failure redelivered as a pump would; asserted:
//! each message applied once, and no failure on the way.
//!
//! In transaction mode (two server connections), the sync driver with diesel's statement
//! cache off — what the README tells users to set behind such a pooler —, in transaction
//! mode and in claim mode. With the cache on (diesel's default) each client names its
//! statements `__diesel_stmt_0`, `…_1`, … on whichever server connection its statement lands
//! on, where another client's statements of the same names live: a run with it on saw
//! "prepared statement … already exists" (42P05, which a fresh connection meets again, for
//! ever) and "invalid byte sequence for encoding UTF8: 0x00" — another client's statement
//! executed with this one's parameters. The runtime turns the cache off on a connection that
//! meets 42P05 or 26000, but what ran before that cannot be undone: the cache must be off
//! from the start.
//!
//! diesel-async's driver (tokio-postgres) names every statement it prepares, cache or not,
//! and prepares in a round trip of its own: behind transaction mode its statements outside
//! a transaction land where other clients' statements of the same names live. Runs saw
//! "unexpected message from server" and a message applied twice: it is not supported there
//! (PgBouncer 1.21+ with `max_prepared_statements` keeps each client's statements; not
//! available here). In session mode (four server connections) it is tested as above.

use std::collections::BTreeMap;
use std::sync::Mutex;

use diesel::connection::{CacheSize, Connection, SimpleConnection};
use diesel::prelude::*;
use inbox_diesel::schema::Backend;
use inbox_diesel::{Action, InboxSchema, idempotent};
use inbox_tests::accounts;
use inbox_tests::postgres::PgDb;
use inbox_tests::private::PrivatePgbouncer;
use inbox_tests::server::count;

const MESSAGES: usize = 60;
const CONSUMERS: usize = 4;

#[idempotent(consumer = "pooled", key = id)]
fn credit(conn: &mut PgConnection, id: &str, account: i32) -> Result<(), inbox_diesel::Error> {
    diesel::update(accounts::table.find(account))
        .set(accounts::balance.eq(accounts::balance + 1))
        .execute(conn)?;
    let _: i64 = accounts::table
        .find(account)
        .select(accounts::balance)
        .first(conn)?;
    let _ = id;
    Ok(())
}

/// `credit`, keeping its result and the request's fingerprint with the marker: the marker
/// is written at the commit, after the key's lock and a look for it at the start — two
/// prepared statements of the runtime's on whichever server connection the transaction
/// lands on.
#[idempotent(consumer = "pooled", key = id, store_result = true, fingerprint = id)]
fn credit_kept(
    conn: &mut PgConnection,
    id: &str,
    account: i32,
) -> Result<i64, inbox_diesel::Error> {
    diesel::update(accounts::table.find(account))
        .set(accounts::balance.eq(accounts::balance + 1))
        .execute(conn)?;
    Ok(accounts::table
        .find(account)
        .select(accounts::balance)
        .first(conn)?)
}

#[idempotent(consumer = "pooled", key = id)]
async fn credit_async(
    conn: &mut diesel_async::AsyncPgConnection,
    id: &str,
    account: i32,
) -> Result<(), inbox_diesel::Error> {
    let update = diesel::update(accounts::table.find(account))
        .set(accounts::balance.eq(accounts::balance + 1));
    diesel_async::RunQueryDsl::execute(update, conn).await?;
    let read = accounts::table.find(account).select(accounts::balance);
    let _: i64 = diesel_async::RunQueryDsl::first(read, conn).await?;
    let _ = id;
    Ok(())
}

/// Failures seen, by class, with an example of each.
type Seen = Mutex<BTreeMap<String, (usize, String)>>;

fn record(seen: &Seen, error: &inbox_diesel::Error) {
    let mut seen = seen.lock().unwrap();
    let entry = seen
        .entry(format!("{}", error.class()))
        .or_insert((0, inbox_tests::error_chain(error)));
    entry.0 += 1;
}

/// The messages a consumer is given: every message by two consumers.
fn deliveries(consumer: usize) -> Vec<usize> {
    (0..MESSAGES)
        .filter(|m| m % CONSUMERS == consumer || (m + 1) % CONSUMERS == consumer)
        .collect()
}

/// Runs the consumers; the failures seen, by class, with an example each.
fn run_sync(url: &str, cache: bool, kept: bool) -> BTreeMap<String, (usize, String)> {
    let seen = Mutex::new(BTreeMap::new());
    std::thread::scope(|scope| {
        for consumer in 0..CONSUMERS {
            let seen = &seen;
            scope.spawn(move || {
                let connect = || {
                    let mut conn = PgConnection::establish(url).unwrap();
                    if !cache {
                        conn.set_prepared_statement_cache_size(CacheSize::Disabled);
                    }
                    conn
                };
                let mut conn = connect();
                for m in deliveries(consumer) {
                    let mut tries = 0;
                    loop {
                        let (id, account) = (&format!("m-{m}"), 1 + (m % 2) as i32);
                        let handled = match kept {
                            true => credit_kept(&mut conn, id, account).map(drop),
                            false => credit(&mut conn, id, account).map(drop),
                        };
                        match handled {
                            Ok(_) => break,
                            Err(e) => {
                                record(seen, &e);
                                tries += 1;
                                assert!(tries < 50, "m-{m} never processed: {e:?}");
                                match e.action() {
                                    Action::Reconnect => conn = connect(),
                                    Action::RetryLater => {}
                                    _ => panic!("m-{m}: {e:?} ({:?})", e.action()),
                                }
                            }
                        }
                    }
                }
            });
        }
    });
    seen.into_inner().unwrap()
}

fn run_async(url: &str, cache: bool) -> BTreeMap<String, (usize, String)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let seen = std::sync::Arc::new(Mutex::new(BTreeMap::new()));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for consumer in 0..CONSUMERS {
            let (url, seen) = (url.to_owned(), seen.clone());
            tasks.push(tokio::spawn(async move {
                use diesel_async::AsyncConnection;
                // diesel-async looks types up with named statements while it connects: behind
                // this pooler that fails now and then ("prepared statement … does not exist"),
                // and a pool would connect again.
                let connect = async || {
                    let mut tries = 0;
                    let mut conn = loop {
                        match diesel_async::AsyncPgConnection::establish(&url).await {
                            Ok(conn) => break conn,
                            Err(e) => {
                                tries += 1;
                                assert!(tries < 20, "no connection through the pooler: {e}");
                            }
                        }
                    };
                    if !cache {
                        conn.set_prepared_statement_cache_size(CacheSize::Disabled);
                    }
                    conn
                };
                let mut conn = connect().await;
                for m in deliveries(consumer) {
                    let mut tries = 0;
                    loop {
                        match credit_async(&mut conn, &format!("m-{m}"), 1 + (m % 2) as i32).await {
                            Ok(_) => break,
                            Err(e) => {
                                record(&seen, &e);
                                tries += 1;
                                assert!(tries < 50, "m-{m} never processed: {e:?}");
                                match e.action() {
                                    Action::Reconnect => conn = connect().await,
                                    Action::RetryLater => {}
                                    _ => panic!("m-{m}: {e:?} ({:?})", e.action()),
                                }
                            }
                        }
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
    std::sync::Arc::try_unwrap(seen)
        .unwrap()
        .into_inner()
        .unwrap()
}

#[idempotent(consumer = "pooled-claim", key = id, mode = "claim")]
fn notify(
    conn: &mut PgConnection,
    id: &str,
    sent: &Mutex<BTreeMap<String, usize>>,
) -> Result<(), inbox_diesel::Error> {
    *sent.lock().unwrap().entry(id.to_owned()).or_default() += 1;
    Ok(())
}

/// Claim mode: every message delivered by two consumers, a delivery finding it in flight
/// delivered again. The failures seen, by class; the side effects, by message.
#[allow(clippy::type_complexity)]
fn run_claim(url: &str) -> (BTreeMap<String, (usize, String)>, BTreeMap<String, usize>) {
    let seen = Mutex::new(BTreeMap::new());
    let sent = Mutex::new(BTreeMap::new());
    std::thread::scope(|scope| {
        for consumer in 0..CONSUMERS {
            let (seen, sent) = (&seen, &sent);
            scope.spawn(move || {
                let connect = || {
                    let mut conn = PgConnection::establish(url).unwrap();
                    conn.set_prepared_statement_cache_size(CacheSize::Disabled);
                    conn
                };
                let mut conn = connect();
                for m in deliveries(consumer) {
                    let mut tries = 0;
                    loop {
                        tries += 1;
                        assert!(tries < 200, "m-{m} never settled");
                        match notify(&mut conn, &format!("m-{m}"), sent) {
                            Ok(outcome) if outcome.is_in_flight() => {
                                std::thread::sleep(std::time::Duration::from_millis(10));
                            }
                            Ok(_) => break,
                            Err(e) => {
                                record(seen, &e);
                                match e.action() {
                                    Action::Reconnect => conn = connect(),
                                    Action::RetryLater => {}
                                    // `EffectNotRecorded` among them: a stamp that failed.
                                    _ => panic!("m-{m}: {e:?} ({:?})", e.action()),
                                }
                            }
                        }
                    }
                }
            });
        }
    });
    (seen.into_inner().unwrap(), sent.into_inner().unwrap())
}

fn applied_once(db: &PgDb, name: &str) {
    let mut conn = db.connect();
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox"),
        MESSAGES as i64
    );
    assert_eq!(
        count(&mut conn, "SELECT SUM(balance)::int8 AS n FROM accounts"),
        MESSAGES as i64,
        "{name}: each message applied once"
    );
}

#[test]
fn behind_pgbouncer() {
    let upstream = url::Url::parse(&PgDb::server_url()).unwrap();
    let (host, port) = (
        upstream.host_str().unwrap_or("127.0.0.1"),
        upstream.port().unwrap_or(5432),
    );
    let transactions =
        PrivatePgbouncer::start(host, port, &[upstream.username()], "transaction", 2);
    let sessions = PrivatePgbouncer::start(
        host,
        port,
        &[upstream.username()],
        "session",
        CONSUMERS as u32,
    );
    for (name, bouncer, driver) in [
        ("transaction mode, sync", &transactions, "sync"),
        ("transaction mode, sync, result kept", &transactions, "kept"),
        ("session mode, async", &sessions, "async"),
    ] {
        let db = PgDb::new(&format!("bouncer_{driver}"));
        if driver == "kept" {
            let (backend, schema) = (Backend::Postgres, InboxSchema::DEFAULT);
            let columns = [
                backend.add_result_sql(&schema),
                backend.add_fingerprint_sql(&schema),
            ];
            db.connect().batch_execute(&columns.join("; ")).unwrap();
        }
        let url = bouncer.url(upstream.username(), db.name());
        let seen = match driver {
            "sync" => run_sync(&url, false, false),
            "kept" => run_sync(&url, false, true),
            _ => run_async(&url, true),
        };
        assert!(seen.is_empty(), "{name}: failures: {seen:#?}");
        applied_once(&db, name);
        if driver == "kept" {
            let kept = "SELECT count(*) AS n FROM inbox \
                        WHERE result IS NOT NULL AND fingerprint IS NOT NULL";
            assert_eq!(count(&mut db.connect(), kept), MESSAGES as i64, "{name}");
        }
    }
    // Claim mode, whose statements each commit on their own, outside any transaction.
    let db = PgDb::new("bouncer_claim");
    let (seen, sent) = run_claim(&transactions.url(upstream.username(), db.name()));
    assert!(seen.is_empty(), "claim mode: failures: {seen:#?}");
    assert_eq!(sent.len(), MESSAGES, "{sent:?}");
    assert!(sent.values().all(|&n| n == 1), "{sent:?}");
    assert_eq!(
        count(
            &mut db.connect(),
            "SELECT count(*) AS n FROM inbox WHERE processed_at IS NOT NULL"
        ),
        MESSAGES as i64
    );
}

/// PgBouncer in statement mode allows no transaction of more than one statement: it closes
/// the client's connection at the first (`FATAL: transaction blocks not allowed in statement
/// pooling mode`, which neither driver hands on), on every connection, for every delivery.
/// A handler meets a lost connection, which a pump retries until the broker's delivery
/// limit dead-letters the message (an operator's trial: 6 of 200 dead-lettered in four
/// minutes, none applied); the startup check, `verify`, refuses it by name, sync and async.
/// Behind transaction and session mode it passes.
#[test]
fn statement_mode_is_refused_by_the_startup_check() {
    let upstream = url::Url::parse(&PgDb::server_url()).unwrap();
    let (host, port) = (
        upstream.host_str().unwrap_or("127.0.0.1"),
        upstream.port().unwrap_or(5432),
    );
    let user = upstream.username();
    let schema = inbox_diesel::InboxSchema::DEFAULT;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (mode, refused) in [
        ("statement", true),
        ("transaction", false),
        ("session", false),
    ] {
        let bouncer = PrivatePgbouncer::start(host, port, &[user], mode, 2);
        let db = PgDb::new(&format!("bouncer_{mode}_verify"));
        let url = bouncer.url(user, db.name());
        let mut conn = PgConnection::establish(&url).unwrap();
        let verified = inbox_diesel::schema::verify(&mut conn, &schema);
        let verified_async = rt.block_on(async {
            use diesel_async::AsyncConnection;
            let mut conn = diesel_async::AsyncPgConnection::establish(&url)
                .await
                .unwrap();
            inbox_diesel::schema::verify_async(&mut conn, &schema).await
        });
        for (driver, verified) in [("sync", verified), ("async", verified_async)] {
            match (verified, refused) {
                (Err(e), true) => {
                    assert!(
                        e.to_string().contains("pool_mode = statement"),
                        "{driver}: {e:?}"
                    )
                }
                (Ok(()), false) => {}
                (other, _) => panic!("{mode} mode, {driver}: {other:?}"),
            }
        }
        if refused {
            // What a handler meets there: a lost connection, nothing applied.
            let error = credit(&mut PgConnection::establish(&url).unwrap(), "s-1", 1).unwrap_err();
            assert_eq!(error.action(), Action::Reconnect, "{error}");
            assert_eq!(
                count(&mut db.connect(), "SELECT count(*) AS n FROM inbox"),
                0
            );
        }
    }
}
