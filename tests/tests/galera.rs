//! A two-node MariaDB Galera cluster of the test's own: a message is answered `Processed` only
//! when its transaction committed, while another node's commits abort transactions on this
//! one.
//!
//! Galera aborts a local transaction when a write set from another node conflicts with it,
//! and a `COMMIT` sent in one string with another statement may answer success for a
//! transaction so aborted (the README, "A `COMMIT` alone"): the message is acknowledged and
//! lost. Here writers on node 1 update, as fast as they can, the rows every body on node 0
//! updates; each message is delivered again until it is answered, as a broker would; then
//! every message answered `Processed` must have its effect and its marker.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::{InboxSchema, Outcome, idempotent};
use inbox_tests::private::PrivateGalera;

/// Messages per handler. On the code this guards against, 1 of 200, 4 of 200 and 4 of 300
/// messages answered `Processed` had rolled back under a lighter load that only a loaded
/// machine made strong enough, and 2 of 300 under this one.
const MESSAGES: u64 = 300;
/// Deliveries of one message under the writers' full load; after these, they pause until
/// it is answered.
const PATIENCE: usize = 50;
/// Deliveries of one message before the test gives up on it.
const ATTEMPTS: usize = 2_000;

diesel::table! {
    effects (id) {
        id -> BigInt,
        message -> BigInt,
    }
}

diesel::table! {
    hot (id) {
        id -> Integer,
        n -> BigInt,
    }
}

/// `retries = 0`: the test delivers a failed message again itself, at once, as a broker
/// would — without the runtime's backoff between retries.
///
/// The body: its effect, one of two rows the other node's writers update, and a pause of 1–6 ms
/// in which their commits abort this transaction.
#[idempotent(consumer = "galera", key = *message, retries = 0)]
fn apply(conn: &mut MysqlConnection, message: &u64) -> Result<(), inbox_diesel::Error> {
    diesel::insert_into(effects::table)
        .values(effects::message.eq(*message as i64))
        .execute(conn)?;
    diesel::update(hot::table.find((*message % 2) as i32))
        .set(hot::n.eq(hot::n + 1))
        .execute(conn)?;
    std::thread::sleep(Duration::from_micros(fastrand::u64(1000..=6000)));
    Ok(())
}

#[idempotent(consumer = "galera-async", key = *message, retries = 0)]
async fn apply_async(
    conn: &mut diesel_async::AsyncMysqlConnection,
    message: &u64,
) -> Result<(), inbox_diesel::Error> {
    let effect = diesel::insert_into(effects::table).values(effects::message.eq(*message as i64));
    diesel_async::RunQueryDsl::execute(effect, conn).await?;
    let touch = diesel::update(hot::table.find((*message % 2) as i32)).set(hot::n.eq(hot::n + 1));
    diesel_async::RunQueryDsl::execute(touch, conn).await?;
    tokio::time::sleep(Duration::from_micros(fastrand::u64(1000..=6000))).await;
    Ok(())
}

/// Writers on `url` updating both hot rows until `stop`, waiting while `pause`; returns
/// their commits once each has connected and committed its first update.
fn writers(
    url: String,
    stop: Arc<AtomicBool>,
    pause: Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<u64>> {
    const WRITERS: usize = 4;
    let started = Arc::new(std::sync::Barrier::new(WRITERS + 1));
    let running = (0..WRITERS)
        .map(|w| {
            let (url, stop, pause) = (url.clone(), stop.clone(), pause.clone());
            let started = started.clone();
            std::thread::spawn(move || {
                let mut conn = MysqlConnection::establish(&url).expect("a writer's connection");
                let sql = format!("UPDATE hot SET w = w + 1 WHERE id = {}", w % 2);
                conn.batch_execute(&sql).expect("a writer's first update");
                started.wait();
                let mut written = 1;
                while !stop.load(Ordering::Relaxed) {
                    if pause.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    if conn.batch_execute(&sql).is_ok() {
                        written += 1;
                    }
                }
                written
            })
        })
        .collect();
    // The consumer starts under the writers' full load, not while they connect.
    started.wait();
    running
}

/// Delivers each message until it is answered (`deliver` returns `Some(processed)`), with
/// the other node's writers running; returns the messages answered `Processed`.
fn deliver_all(cluster: &PrivateGalera, mut deliver: impl FnMut(u64) -> Option<bool>) -> Vec<u64> {
    let started = std::time::Instant::now();
    let (stop, pause) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let running = writers(cluster.url(1), stop.clone(), pause.clone());
    let mut processed = Vec::new();
    let mut failed = 0;
    for message in 0..MESSAGES {
        let answered = (0..ATTEMPTS).find_map(|attempt| {
            // A message the writers keep aborting gets a quiet moment, so that each run
            // ends; the answers that matter come under their full load.
            pause.store(attempt >= PATIENCE, Ordering::Relaxed);
            let answer = deliver(message);
            failed += u64::from(answer.is_none());
            answer
        });
        pause.store(false, Ordering::Relaxed);
        match answered {
            Some(true) => processed.push(message),
            Some(false) => {}
            None => panic!("message {message} not answered in {ATTEMPTS} deliveries"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let written: u64 = running.into_iter().map(|w| w.join().unwrap()).sum();
    eprintln!(
        "{} messages in {:?}: {failed} deliveries failed, the other node's writers committed \
         {written}",
        MESSAGES,
        started.elapsed()
    );
    assert!(
        failed > MESSAGES,
        "the other node's {written} commits aborted only {failed} deliveries: the test \
         did not provoke what it guards against"
    );
    processed
}

/// Every message answered `Processed` by `consumer` has one effect and its marker.
fn assert_committed(conn: &mut MysqlConnection, consumer: &str, processed: &[u64], first: u64) {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        message: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        effects: i64,
    }
    let rows: Vec<Row> = diesel::sql_query(format!(
        "SELECT message, count(*) AS effects FROM effects WHERE message >= {first} GROUP BY message"
    ))
    .load(conn)
    .unwrap();
    let markers: i64 = diesel::sql_query(format!(
        "SELECT count(*) AS n FROM inbox WHERE consumer = '{consumer}'"
    ))
    .get_result::<Count>(conn)
    .unwrap()
    .n;
    let lost: Vec<u64> = processed
        .iter()
        .filter(|m| !rows.iter().any(|r| r.message == (**m + first) as i64))
        .copied()
        .collect();
    let doubled: Vec<i64> = rows
        .iter()
        .filter(|r| r.effects > 1)
        .map(|r| r.message)
        .collect();
    assert!(
        lost.is_empty() && doubled.is_empty(),
        "{consumer}: {} of {} messages answered Processed have no effect ({lost:?}); \
         doubled: {doubled:?}",
        lost.len(),
        processed.len()
    );
    assert_eq!(
        processed.len() as u64,
        MESSAGES,
        "{consumer}: every message processed once"
    );
    assert_eq!(
        markers, MESSAGES as i64,
        "{consumer}: one marker per message"
    );
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// Sync and async consumers on node 0 (the MariaDB idle bound on, as by default), one after
/// the other, against the same writers on node 1.
#[test]
fn processed_only_when_committed_while_another_node_aborts_transactions() {
    let cluster = PrivateGalera::start();
    let mut conn = MysqlConnection::establish(&cluster.url(0)).unwrap();
    conn.batch_execute(&inbox_diesel::schema::mysql::create_table_sql(
        &InboxSchema::DEFAULT,
    ))
    .unwrap();
    conn.batch_execute(
        "CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, message BIGINT NOT NULL); \
         CREATE TABLE hot (id INTEGER PRIMARY KEY, n BIGINT NOT NULL, w BIGINT NOT NULL); \
         INSERT INTO hot VALUES (0, 0, 0), (1, 0, 0)",
    )
    .unwrap();

    let mut consumer = MysqlConnection::establish(&cluster.url(0)).unwrap();
    let processed = deliver_all(&cluster, |message| match apply(&mut consumer, &message) {
        Ok(outcome) => Some(matches!(outcome, Outcome::Processed(()))),
        Err(_) => None,
    });
    assert_committed(&mut conn, "galera", &processed, 0);

    // The async consumer's messages follow the sync one's.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = cluster.url(0);
    let mut consumer = runtime.block_on(async {
        use diesel_async::AsyncConnection;
        diesel_async::AsyncMysqlConnection::establish(&url)
            .await
            .unwrap()
    });
    let processed = deliver_all(&cluster, |message| {
        match runtime.block_on(apply_async(&mut consumer, &(message + MESSAGES))) {
            Ok(outcome) => Some(matches!(outcome, Outcome::Processed(()))),
            Err(_) => None,
        }
    });
    assert_committed(&mut conn, "galera-async", &processed, MESSAGES);
}
