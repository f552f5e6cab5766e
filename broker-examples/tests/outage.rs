//! A pump whose database turned read-only — a pool pointed at a standby after a failover,
//! here a PostgreSQL database set `default_transaction_read_only` — for a few seconds, on
//! RabbitMQ and on NATS JetStream. Every delivery then needs a new connection
//! (`Retry { reconnect: true }`); before the pumps paused for it, each took delivery after
//! delivery into the same refusal, hundreds in two seconds. With the pause a handful run
//! (those in hand when it began, then one per doubling pause), and once the database takes
//! writes again every message is applied once.
//!
//! Needs PostgreSQL (`INBOX_TEST_PG`), RabbitMQ (`INBOX_TEST_AMQP`) and NATS with JetStream
//! (`INBOX_TEST_NATS`); a server that cannot be reached fails the test.
#![cfg(feature = "postgres")]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use inbox_diesel::{Action, ErrorClass, MessageKey, Outcome, Redelivery, idempotent};

const MESSAGES: u32 = 60;
/// How long the database refuses writes.
const READ_ONLY_FOR: Duration = Duration::from_secs(4);
/// Handler runs the read-only spell may see at most: those in hand when it began (16), and
/// one per pause after (200 ms doubling to 1 s: about 6 in 4 s). Without the pause, hundreds.
const AT_MOST: u32 = 40;
/// The broker's bound on deliveries of a message (`x-delivery-limit`, `max_deliver`): the
/// deliveries waiting at the pump's gate must not use it up. Before they waited in hand,
/// each was handed back at every turn of the pause, and messages that never ran were
/// dead-lettered (RabbitMQ) or dropped (JetStream).
const DELIVERY_LIMIT: u32 = 5;

fn env(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|value| !value.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// A database of the test's own on the server `INBOX_TEST_PG` names.
struct Db {
    admin: String,
    url: String,
    name: String,
}

impl Db {
    fn new(test: &str) -> Self {
        let admin = env(
            "INBOX_TEST_PG",
            "postgres://postgres@127.0.0.1:5432/postgres",
        );
        let name = format!("inbox_outage_{test}_{}", std::process::id());
        let mut conn = PgConnection::establish(&admin).unwrap_or_else(|e| {
            panic!("PostgreSQL is not reachable at {admin} (INBOX_TEST_PG): {e}")
        });
        conn.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .unwrap();
        conn.batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let (base, _) = admin.rsplit_once('/').unwrap();
        let url = format!("{base}/{name}");
        let mut conn = PgConnection::establish(&url).unwrap();
        conn.batch_execute(&inbox_diesel::schema::postgres::create_table_sql(
            &inbox_diesel::InboxSchema::DEFAULT,
        ))
        .unwrap();
        conn.batch_execute("CREATE TABLE effects (message TEXT NOT NULL)")
            .unwrap();
        Self { admin, url, name }
    }

    /// New sessions of the database refuse writes, as a standby's do.
    fn read_only(&self, on: bool) {
        let setting = match on {
            true => "SET default_transaction_read_only = on",
            false => "RESET default_transaction_read_only",
        };
        PgConnection::establish(&self.admin)
            .unwrap()
            .batch_execute(&format!("ALTER DATABASE {} {setting}", self.name))
            .unwrap();
    }

    fn effects(&self) -> Vec<i64> {
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        diesel::RunQueryDsl::load::<Row>(
            diesel::sql_query("SELECT count(*) AS n FROM effects GROUP BY message"),
            &mut PgConnection::establish(&self.url).unwrap(),
        )
        .unwrap()
        .into_iter()
        .map(|row| row.n)
        .collect()
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Ok(mut conn) = PgConnection::establish(&self.admin) {
            let _ = conn.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

#[idempotent(consumer = "outage", key = key)]
async fn apply(
    conn: &mut AsyncPgConnection,
    key: &MessageKey,
    body: &str,
) -> Result<(), inbox_diesel::Error> {
    diesel::sql_query("INSERT INTO effects (message) VALUES ($1)")
        .bind::<diesel::sql_types::Text, _>(body)
        .execute(conn)
        .await?;
    Ok(())
}

/// The handler as a pump calls it: a new connection each time (as a pool gives one after
/// dropping the last), each failure counted — every one of class `failing`, what the test
/// provokes.
async fn handle(
    url: &str,
    key: MessageKey,
    body: String,
    failing: ErrorClass,
    failed: &AtomicU32,
) -> Result<Outcome<()>, Action> {
    let mut conn = AsyncPgConnection::establish(url)
        .await
        .map_err(|_| Action::Reconnect)?;
    let answer = apply(&mut conn, &key, &body).await;
    if let Err(e) = &answer {
        assert_eq!(e.class(), failing, "{e:?}");
        failed.fetch_add(1, Ordering::SeqCst);
    }
    answer.map_err(|e| e.action())
}

/// The read-only spell, then writes again; the run ends once every message has its effect,
/// or after a minute (a message the broker gave up on never comes).
async fn spell(db: &Db) {
    tokio::time::sleep(READ_ONLY_FOR).await;
    db.read_only(false);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while db.effects().len() < MESSAGES as usize && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn pause() -> Redelivery {
    Redelivery::exponential(Duration::from_millis(200), Duration::from_secs(1))
}

fn quick() -> Redelivery {
    Redelivery::exponential(Duration::from_millis(50), Duration::from_millis(200))
}

/// A quorum queue of the test's own, bounded at [`DELIVERY_LIMIT`] deliveries, with
/// [`MESSAGES`] messages in it: the connection (kept open), its channel and the queue's name.
async fn quorum_queue(test: &str) -> (lapin::Connection, lapin::Channel, String) {
    use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
    use lapin::types::FieldTable;
    use lapin::{BasicProperties, ConnectionProperties};

    let url = env("INBOX_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2f");
    let connection = lapin::Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ is not reachable at {url} (INBOX_TEST_AMQP): {e}"));
    let channel = connection.create_channel().await.unwrap();
    let queue = format!("inbox-{test}-{}", std::process::id());
    let _ = channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        lapin::types::AMQPValue::LongString("quorum".into()),
    );
    arguments.insert(
        "x-delivery-limit".into(),
        lapin::types::AMQPValue::LongInt(DELIVERY_LIMIT as i32),
    );
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await
        .unwrap();
    for n in 0..MESSAGES {
        let id = format!("m{n}");
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                id.as_bytes(),
                BasicProperties::default().with_message_id(id.as_str().into()),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    (connection, channel, queue)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rabbitmq_pump_pauses_for_a_read_only_database() {
    use lapin::options::QueueDeleteOptions;

    let db = Db::new("rabbitmq");
    let (_connection, channel, queue) = quorum_queue("outage").await;
    db.read_only(true);
    let pump = inbox_lapin::Pump::new()
        .prefetch(16)
        .redelivery(quick())
        .outage(pause());
    let consumer = pump.subscribe(&channel, &queue, "outage").await.unwrap();
    let refused = AtomicU32::new(0);
    let report = pump
        .run(&channel, consumer, spell(&db), |delivery| {
            let key = inbox_lapin::key(&delivery).unwrap();
            let body = String::from_utf8_lossy(&delivery.data).into_owned();
            handle(&db.url, key, body, ErrorClass::ReadOnly, &refused)
        })
        .await
        .unwrap();
    let _ = channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let refused = AtomicU32::load(&refused, Ordering::SeqCst);
    assert!(
        (1..=AT_MOST).contains(&refused),
        "{refused} handlers ran into the read-only database; {report:?}"
    );
    assert_eq!(report.acked, u64::from(MESSAGES), "{report:?}");
    let effects = db.effects();
    assert_eq!(effects.len(), MESSAGES as usize);
    assert!(effects.iter().all(|&n| n == 1), "{effects:?}");
}

/// What the lock fails a delivery with, once its retries are used up.
const LOCK_TIMEOUT: ErrorClass =
    ErrorClass::Transient(inbox_diesel::TransientKind::LockWaitTimeout);

/// How long a migration holds its lock on the inbox in [`a_rabbitmq_pump_holds_its_deliveries_through_a_table_lock`].
const LOCKED_FOR: Duration = Duration::from_secs(4);

/// A migration's lock on the whole inbox — `SHARE`, as a `CREATE INDEX` without
/// `CONCURRENTLY` takes — held for four seconds, past the database's `lock_timeout` of
/// 100 ms: every delivery's marker fails its four attempts and is settled `Retry`. Three of
/// those in a row close the pump's gate as a lost database does: the deliveries wait in hand
/// instead of going back to the queue, whose `x-delivery-limit` of 5 would dead-letter them
/// unapplied (an operator's trial: 10 of 31 dead-lettered in a 45 s lock). When the lock
/// goes, every message is applied once, none dead-lettered.
#[tokio::test(flavor = "multi_thread")]
async fn a_rabbitmq_pump_holds_its_deliveries_through_a_table_lock() {
    use lapin::options::QueueDeleteOptions;

    let db = Db::new("locked");
    PgConnection::establish(&db.admin)
        .unwrap()
        .batch_execute(&format!(
            "ALTER DATABASE {} SET lock_timeout = '100ms'",
            db.name
        ))
        .unwrap();
    let (_connection, channel, queue) = quorum_queue("locked").await;
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let migration = {
        let url = db.url.clone();
        std::thread::spawn(move || {
            let mut conn = PgConnection::establish(&url).unwrap();
            conn.batch_execute("SET lock_timeout = 0; BEGIN; LOCK TABLE inbox IN SHARE MODE")
                .unwrap();
            locked_tx.send(()).unwrap();
            std::thread::sleep(LOCKED_FOR);
            conn.batch_execute("COMMIT").unwrap();
        })
    };
    locked_rx.recv().unwrap();
    let pump = inbox_lapin::Pump::new()
        .prefetch(16)
        .redelivery(quick())
        .outage(pause());
    let consumer = pump.subscribe(&channel, &queue, "locked").await.unwrap();
    let timed_out = AtomicU32::new(0);
    let finished = async {
        tokio::time::sleep(LOCKED_FOR).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while db.effects().len() < MESSAGES as usize && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let report = pump
        .run(&channel, consumer, finished, |delivery| {
            let key = inbox_lapin::key(&delivery).unwrap();
            let body = String::from_utf8_lossy(&delivery.data).into_owned();
            handle(&db.url, key, body, LOCK_TIMEOUT, &timed_out)
        })
        .await
        .unwrap();
    migration.join().unwrap();
    let _ = channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    assert!(
        AtomicU32::load(&timed_out, Ordering::SeqCst) >= 1,
        "the lock failed no delivery: {report:?}"
    );
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    assert_eq!(report.acked, u64::from(MESSAGES), "{report:?}");
    let effects = db.effects();
    assert_eq!(effects.len(), MESSAGES as usize);
    assert!(effects.iter().all(|&n| n == 1), "{effects:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nats_pump_pauses_for_a_read_only_database() {
    use async_nats::jetstream::stream;

    let db = Db::new("nats");
    let url = env("INBOX_TEST_NATS", "nats://127.0.0.1:4222");
    let jetstream = inbox_nats::connect(&url, async_nats::ConnectOptions::new())
        .await
        .unwrap_or_else(|e| panic!("NATS is not reachable at {url} (INBOX_TEST_NATS): {e}"));
    let name = format!("inbox-outage-{}", std::process::id());
    let _ = jetstream.delete_stream(&name).await;
    jetstream
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            storage: stream::StorageType::Memory,
            ..stream::Config::default()
        })
        .await
        .unwrap();
    for n in 0..MESSAGES {
        let id = format!("m{n}");
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
        jetstream
            .publish_with_headers(format!("{name}.credits"), headers, id.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    db.read_only(true);
    let pump = inbox_nats::Pump::new()
        .max_ack_pending(16)
        .max_deliver(i64::from(DELIVERY_LIMIT) + 1)
        .redelivery(quick())
        .outage(pause());
    let consumer = pump.consumer(&jetstream, &name, "outage").await.unwrap();
    let refused = AtomicU32::new(0);
    let report = pump
        .run(&jetstream, &consumer, spell(&db), |message| {
            let key = inbox_nats::key(&message).unwrap();
            let body = String::from_utf8_lossy(&message.payload).into_owned();
            handle(&db.url, key, body, ErrorClass::ReadOnly, &refused)
        })
        .await
        .unwrap();
    let _ = jetstream.delete_stream(&name).await;
    let refused = AtomicU32::load(&refused, Ordering::SeqCst);
    assert!(
        (1..=AT_MOST).contains(&refused),
        "{refused} handlers ran into the read-only database; {report:?}"
    );
    let effects = db.effects();
    assert_eq!(effects.len(), MESSAGES as usize, "{report:?}");
    assert!(effects.iter().all(|&n| n == 1), "{effects:?}");
}
