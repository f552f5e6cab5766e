//! The pump and the outbox's sink against a real Kafka-protocol broker and a real SQLite
//! inbox. Each test starts a broker of its own — the `tansu` binary (`INBOX_TEST_TANSU`, else
//! `tansu` on the PATH; `.ci/run` installs it), on a private port, its storage in memory —
//! and kills it at the end. A missing binary fails the suite.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::{InboxSchema, MessageKey, Outcome, Redelivery, Settlement, idempotent};
use inbox_kafka::{
    DEAD_LETTER_OFFSET, DEAD_LETTER_REASON, DEAD_LETTER_TOPIC, GroupConsumer, MESSAGE_ID, Pump,
    Stopped, key, producer_config,
};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// The broker binary: `INBOX_TEST_TANSU`, else `tansu` on the PATH.
fn tansu() -> String {
    let program = std::env::var("INBOX_TEST_TANSU").unwrap_or_else(|_| "tansu".to_owned());
    match Command::new(&program).arg("--version").output() {
        Ok(output) if output.status.success() => program,
        found => panic!(
            "the Kafka-protocol broker `{program}` cannot run ({found:?}): set INBOX_TEST_TANSU \
             to the tansu binary (`.ci/run` installs it)"
        ),
    }
}

/// A broker of the test's own, killed when dropped.
struct Broker {
    child: Child,
    address: String,
    _dir: tempfile::TempDir,
}

impl Broker {
    async fn start() -> Self {
        let program = tansu();
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address = format!("127.0.0.1:{port}");
        let url = format!("tcp://{address}");
        let child = Command::new(program)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let broker = Self {
            child,
            address,
            _dir: dir,
        };
        let started = Instant::now();
        while tokio::net::TcpStream::connect(&broker.address)
            .await
            .is_err()
        {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "tansu did not listen on {} within 10 s",
                broker.address
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        broker
    }

    async fn topic(&self, name: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.address)
            .create()
            .unwrap();
        let results = admin
            .create_topics(
                &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
                &AdminOptions::new(),
            )
            .await
            .unwrap();
        for result in results {
            result.unwrap();
        }
    }

    fn producer(&self) -> FutureProducer {
        producer_config(&self.address).create().unwrap()
    }

    /// Produces `body` to `topic`'s `partition`, with a `message-id` header if given.
    async fn produce(
        &self,
        producer: &FutureProducer,
        topic: &str,
        partition: i32,
        id: Option<&str>,
        body: &str,
    ) -> i64 {
        let mut headers = OwnedHeaders::new();
        if let Some(id) = id {
            headers = headers.insert(Header {
                key: MESSAGE_ID,
                value: Some(id),
            });
        }
        let record = FutureRecord::<str, str>::to(topic)
            .partition(partition)
            .payload(body)
            .headers(headers);
        producer
            .send(record, Timeout::After(Duration::from_secs(10)))
            .await
            .unwrap()
            .offset
    }

    fn consumer(&self, pump: &Pump, group: &str, topic: &str) -> GroupConsumer {
        let mut config = Pump::consumer_config(&self.address, group);
        config
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500")
            .set("max.poll.interval.ms", "10000");
        let consumer = pump.consumer(&config).unwrap();
        consumer.subscribe(&[topic]).unwrap();
        consumer
    }

    /// The group's committed offsets for `topic`'s `partitions`.
    fn committed(&self, group: &str, topic: &str, partitions: i32) -> Vec<i64> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.address)
            .set("group.id", group)
            .create()
            .unwrap();
        let mut list = TopicPartitionList::new();
        for partition in 0..partitions {
            list.add_partition(topic, partition);
        }
        let committed = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .unwrap();
        (0..partitions)
            .map(
                |partition| match committed.find_partition(topic, partition).unwrap().offset() {
                    Offset::Offset(offset) => offset,
                    _ => -1,
                },
            )
            .collect()
    }

    /// Every record of `topic` from its start, until `n` were read.
    async fn read(&self, topic: &str, n: usize) -> Vec<OwnedMessage> {
        let consumer: rdkafka::consumer::StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.address)
            .set("group.id", format!("reader-{topic}"))
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        consumer.subscribe(&[topic]).unwrap();
        let mut records = Vec::new();
        within(Duration::from_secs(30), "reading the records", async {
            while records.len() < n {
                records.push(consumer.recv().await.unwrap().detach());
            }
        })
        .await;
        records
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Fails the test when `future` takes longer than `limit`, rather than hanging the suite.
async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
}

/// The business side: an SQLite file with the inbox and one row per applied message.
struct Store {
    _dir: tempfile::TempDir,
    url: String,
}

impl Store {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().join("effects.sqlite").display().to_string();
        let mut conn = <SqliteConnection as diesel::Connection>::establish(&url).unwrap();
        conn.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(
            &InboxSchema::DEFAULT,
        ))
        .unwrap();
        conn.batch_execute("CREATE TABLE effects (message TEXT NOT NULL);")
            .unwrap();
        Self { _dir: dir, url }
    }

    fn connect(&self) -> SqliteConnection {
        <SqliteConnection as diesel::Connection>::establish(&self.url).unwrap()
    }

    /// How many times each message was applied, by message.
    fn effects(&self) -> BTreeMap<String, i64> {
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            message: String,
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        diesel::sql_query("SELECT message, count(*) AS n FROM effects GROUP BY message")
            .load::<Row>(&mut self.connect())
            .unwrap()
            .into_iter()
            .map(|row| (row.message, row.n))
            .collect()
    }
}

#[idempotent(consumer = "credits", key = key)]
fn apply(
    conn: &mut SqliteConnection,
    key: &MessageKey,
    body: &str,
) -> Result<(), inbox_diesel::Error> {
    diesel::sql_query("INSERT INTO effects (message) VALUES (?)")
        .bind::<diesel::sql_types::Text, _>(body)
        .execute(conn)?;
    Ok(())
}

/// The handler as a pump calls it: the key off the record, the effect in SQLite.
fn handle(store: &Store, record: &OwnedMessage) -> Result<Outcome<()>, inbox_diesel::Error> {
    let key = key(record).map_err(inbox_diesel::Error::InvalidKey)?;
    let body = String::from_utf8_lossy(record.payload().unwrap_or_default()).into_owned();
    apply(&mut store.connect(), &key, &body)
}

/// A future that resolves once `counter` reaches `n`.
async fn counted(counter: &AtomicU32, n: u32) {
    while counter.load(Ordering::SeqCst) < n {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every message produced twice (a producer's retry past its idempotence: two records, one
/// `message-id`) over three partitions: each applied once, every record acknowledged, and
/// the group's offsets committed to the end of each partition.
#[tokio::test]
async fn each_message_produced_twice_is_applied_once_and_committed() {
    let broker = Broker::start().await;
    broker.topic("credits", 3).await;
    let producer = broker.producer();
    for copy in 0..2 {
        for n in 0..30 {
            let id = format!("m{n:02}");
            let _ = copy;
            broker
                .produce(&producer, "credits", n % 3, Some(&id), &id)
                .await;
        }
    }
    let store = Store::new();
    let pump = Pump::new().max_in_hand(4);
    let consumer = broker.consumer(&pump, "twice", "credits");
    let answered = AtomicU32::new(0);
    let report = within(
        Duration::from_secs(60),
        "the pump",
        pump.run(&consumer, &producer, counted(&answered, 60), |record| {
            let answer = handle(&store, &record);
            answered.fetch_add(1, Ordering::SeqCst);
            async move { answer }
        }),
    )
    .await
    .unwrap();
    assert_eq!(report.acked, 60, "{report:?}");
    let effects = store.effects();
    assert_eq!(effects.len(), 30);
    assert!(effects.values().all(|n| *n == 1), "{effects:?}");
    assert_eq!(broker.committed("twice", "credits", 3), vec![20, 20, 20]);
}

/// Records of one partition run one after the other, in offset order; records of different
/// partitions run beside each other.
#[tokio::test]
async fn a_partition_runs_in_order_and_partitions_beside_each_other() {
    let broker = Broker::start().await;
    broker.topic("ordered", 3).await;
    let producer = broker.producer();
    for n in 0..24 {
        let id = format!("o{n:02}");
        broker
            .produce(&producer, "ordered", n % 3, Some(&id), &id)
            .await;
    }
    let store = Store::new();
    let pump = Pump::new().max_in_hand(8);
    let consumer = broker.consumer(&pump, "ordered", "ordered");
    let started: Mutex<Vec<(i32, i64)>> = Mutex::new(Vec::new());
    let running: Mutex<HashMap<i32, u32>> = Mutex::new(HashMap::new());
    let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let answered = AtomicU32::new(0);
    let report = within(
        Duration::from_secs(60),
        "the pump",
        pump.run(&consumer, &producer, counted(&answered, 24), |record| {
            let (store, started, running) = (&store, &started, &running);
            let (now, most, answered) = (&now, &most, &answered);
            async move {
                let partition = record.partition();
                started.lock().unwrap().push((partition, record.offset()));
                let overlapping = {
                    let mut running = running.lock().unwrap();
                    let mine = running.entry(partition).or_default();
                    *mine += 1;
                    *mine
                };
                assert_eq!(
                    overlapping, 1,
                    "two records of partition {partition} in hand"
                );
                most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(30)).await;
                let answer = handle(store, &record);
                now.fetch_sub(1, Ordering::SeqCst);
                *running.lock().unwrap().get_mut(&partition).unwrap() -= 1;
                answered.fetch_add(1, Ordering::SeqCst);
                answer
            }
        }),
    )
    .await
    .unwrap();
    assert_eq!(report.acked, 24, "{report:?}");
    let started = started.into_inner().unwrap();
    for partition in 0..3 {
        let offsets: Vec<i64> = started
            .iter()
            .filter(|(p, _)| *p == partition)
            .map(|(_, offset)| *offset)
            .collect();
        assert_eq!(offsets, (0..8).collect::<Vec<_>>(), "partition {partition}");
    }
    assert!(
        most.load(Ordering::SeqCst) >= 2,
        "the partitions' records never ran beside each other"
    );
}

/// A payment whose reference must be new: `payments.reference` is unique.
#[idempotent(consumer = "payments", key = key)]
fn pay(
    conn: &mut SqliteConnection,
    key: &MessageKey,
    reference: &str,
) -> Result<(), inbox_diesel::Error> {
    diesel::sql_query("INSERT INTO payments (reference) VALUES (?)")
        .bind::<diesel::sql_types::Text, _>(reference)
        .execute(conn)?;
    diesel::sql_query("INSERT INTO effects (message) VALUES (?)")
        .bind::<diesel::sql_types::Text, _>(reference)
        .execute(conn)?;
    Ok(())
}

fn header(record: &OwnedMessage, name: &str) -> Option<String> {
    record.headers().and_then(|headers| {
        headers
            .iter()
            .find(|header| header.key == name)
            .and_then(|header| header.value)
            .map(|value| String::from_utf8_lossy(value).into_owned())
    })
}

/// Two payments with one reference: the second breaks the business's unique constraint,
/// which the runtime answers `DeadLetter`. It is written to `payments.DLT` with its key,
/// payload and headers and where it came from; the partition goes on past it, and the offset
/// is committed past it once the dead letter was acknowledged.
#[tokio::test]
async fn a_business_constraint_goes_to_the_dead_letter_topic() {
    let broker = Broker::start().await;
    broker.topic("payments", 1).await;
    broker.topic("payments.DLT", 1).await;
    let producer = broker.producer();
    for (id, reference) in [("p0", "r0"), ("p1", "r1"), ("p2", "r1"), ("p3", "r3")] {
        let mut headers = OwnedHeaders::new();
        headers = headers
            .insert(Header {
                key: MESSAGE_ID,
                value: Some(id),
            })
            .insert(Header {
                key: "trace",
                value: Some(id),
            });
        let record = FutureRecord::to("payments")
            .key(id)
            .payload(reference)
            .headers(headers);
        producer
            .send(record, Timeout::After(Duration::from_secs(10)))
            .await
            .unwrap();
    }
    let store = Store::new();
    store
        .connect()
        .batch_execute("CREATE TABLE payments (reference TEXT NOT NULL UNIQUE);")
        .unwrap();
    let pump = Pump::new();
    let consumer = broker.consumer(&pump, "payments", "payments");
    let answered = AtomicU32::new(0);
    let report = within(
        Duration::from_secs(60),
        "the pump",
        pump.run(&consumer, &producer, counted(&answered, 4), |record| {
            let answer = key(&record)
                .map_err(inbox_diesel::Error::InvalidKey)
                .and_then(|key| {
                    let reference = String::from_utf8_lossy(record.payload().unwrap_or_default());
                    pay(&mut store.connect(), &key, &reference)
                });
            answered.fetch_add(1, Ordering::SeqCst);
            async move { answer }
        }),
    )
    .await
    .unwrap();
    assert_eq!((report.acked, report.dead_lettered), (3, 1), "{report:?}");
    let dead = broker.read("payments.DLT", 1).await;
    let dead = &dead[0];
    assert_eq!(dead.key(), Some(&b"p2"[..]));
    assert_eq!(dead.payload(), Some(&b"r1"[..]));
    assert_eq!(header(dead, MESSAGE_ID).as_deref(), Some("p2"));
    assert_eq!(header(dead, "trace").as_deref(), Some("p2"));
    assert_eq!(header(dead, DEAD_LETTER_TOPIC).as_deref(), Some("payments"));
    assert_eq!(header(dead, DEAD_LETTER_OFFSET).as_deref(), Some("2"));
    let reason = header(dead, DEAD_LETTER_REASON).unwrap();
    assert!(reason.contains("UniqueViolation"), "{reason}");
    assert_eq!(broker.committed("payments", "payments", 1), vec![4]);
    assert_eq!(store.effects().len(), 3);
}

/// A record whose handler keeps answering a retry holds its partition — the record behind
/// it waits — and runs `max_attempts` times, then goes to the dead-letter topic; the record
/// behind it runs after that.
#[tokio::test]
async fn a_record_retried_past_its_attempts_is_dead_lettered_and_its_partition_goes_on() {
    let broker = Broker::start().await;
    broker.topic("retried", 1).await;
    broker.topic("retried.DLT", 1).await;
    let producer = broker.producer();
    for id in ["a", "poison", "b"] {
        broker.produce(&producer, "retried", 0, Some(id), id).await;
    }
    let pump = Pump::new()
        .max_attempts(3)
        .redelivery(Redelivery::exponential(
            Duration::from_millis(20),
            Duration::from_millis(50),
        ));
    let consumer = broker.consumer(&pump, "retried", "retried");
    let runs = Mutex::new(Vec::new());
    let answered = AtomicU32::new(0);
    let report = within(
        Duration::from_secs(60),
        "the pump",
        pump.run(&consumer, &producer, counted(&answered, 2), |record| {
            let body = String::from_utf8_lossy(record.payload().unwrap_or_default()).into_owned();
            runs.lock().unwrap().push(body.clone());
            let answer = if body == "poison" {
                Settlement::Retry { reconnect: false }
            } else {
                answered.fetch_add(1, Ordering::SeqCst);
                Settlement::Ack
            };
            async move { answer }
        }),
    )
    .await
    .unwrap();
    assert_eq!(
        runs.into_inner().unwrap(),
        ["a", "poison", "poison", "poison", "b"]
    );
    assert_eq!(
        (report.acked, report.dead_lettered, report.retries),
        (2, 1, 2),
        "{report:?}"
    );
    let dead = broker.read("retried.DLT", 1).await;
    let reason = header(&dead[0], DEAD_LETTER_REASON).unwrap();
    assert!(reason.contains("after 3 attempts"), "{reason}");
    assert_eq!(broker.committed("retried", "retried", 1), vec![3]);
}

/// A handler that panics on a record's first run: its transaction is rolled back, the
/// record runs again and is applied once, and the pump goes on.
#[tokio::test]
async fn a_panicking_handler_retries_its_own_record_and_the_pump_goes_on() {
    let broker = Broker::start().await;
    broker.topic("panics", 2).await;
    let producer = broker.producer();
    for n in 0..6 {
        let id = format!("q{n}");
        broker
            .produce(&producer, "panics", n % 2, Some(&id), &id)
            .await;
    }
    let store = Store::new();
    let pump = Pump::new().redelivery(Redelivery::exponential(
        Duration::from_millis(20),
        Duration::from_millis(50),
    ));
    let consumer = broker.consumer(&pump, "panics", "panics");
    let panicked = std::sync::atomic::AtomicBool::new(false);
    let answered = AtomicU32::new(0);
    let report = within(
        Duration::from_secs(60),
        "the pump",
        pump.run(&consumer, &producer, counted(&answered, 6), |record| {
            let answer = if record.offset() == 1
                && record.partition() == 0
                && !panicked.swap(true, Ordering::SeqCst)
            {
                let key = key(&record).unwrap();
                #[idempotent(consumer = "credits", key = key)]
                fn apply_then_panic(
                    conn: &mut SqliteConnection,
                    key: &MessageKey,
                ) -> Result<(), inbox_diesel::Error> {
                    diesel::sql_query("INSERT INTO effects (message) VALUES ('q2')")
                        .execute(conn)?;
                    panic!("the handler fails mid-transaction");
                }
                apply_then_panic(&mut store.connect(), &key)
            } else {
                let answer = handle(&store, &record);
                answered.fetch_add(1, Ordering::SeqCst);
                answer
            };
            async move { answer }
        }),
    )
    .await
    .unwrap();
    assert_eq!((report.acked, report.retries), (6, 1), "{report:?}");
    let effects = store.effects();
    assert_eq!(effects.len(), 6);
    assert!(effects.values().all(|n| *n == 1), "{effects:?}");
}

/// A halting answer (a deployment fault) stops the pump with nothing stored for its record
/// or past it: the group's offset stays at it, and a pump started after the fix applies it.
#[tokio::test]
async fn a_halt_commits_nothing_past_its_record() {
    let broker = Broker::start().await;
    broker.topic("halts", 1).await;
    let producer = broker.producer();
    for id in ["h0", "h1", "h2"] {
        broker.produce(&producer, "halts", 0, Some(id), id).await;
    }
    let store = Store::new();
    let pump = Pump::new();
    let consumer = broker.consumer(&pump, "halts", "halts");
    let stopped = within(
        Duration::from_secs(60),
        "the pump",
        pump.run(&consumer, &producer, std::future::pending(), |record| {
            let answer = if record.offset() == 1 {
                Err(Settlement::Halt)
            } else {
                handle(&store, &record).map_err(|e| inbox_diesel::Settle::settlement(&e))
            };
            async move { answer }
        }),
    )
    .await
    .unwrap_err();
    let Stopped::Halted { report, .. } = stopped else {
        panic!("{stopped:?}")
    };
    assert_eq!((report.acked, report.halted), (1, 1), "{report:?}");
    drop(consumer);
    assert_eq!(broker.committed("halts", "halts", 1), vec![1]);

    let consumer = broker.consumer(&pump, "halts", "halts");
    let answered = AtomicU32::new(0);
    within(
        Duration::from_secs(60),
        "the pump after the fix",
        pump.run(&consumer, &producer, counted(&answered, 2), |record| {
            let answer = handle(&store, &record);
            answered.fetch_add(1, Ordering::SeqCst);
            async move { answer }
        }),
    )
    .await
    .unwrap();
    assert_eq!(store.effects().len(), 3);
    assert_eq!(broker.committed("halts", "halts", 1), vec![3]);
}

/// A shutdown while handlers run: those in hand settle and their offsets are committed;
/// nothing past a record not yet run is. A pump started again applies the rest, each once.
#[tokio::test]
async fn a_shutdown_commits_what_settled_and_loses_nothing() {
    let broker = Broker::start().await;
    broker.topic("stops", 2).await;
    let producer = broker.producer();
    for n in 0..20 {
        let id = format!("s{n:02}");
        broker
            .produce(&producer, "stops", n % 2, Some(&id), &id)
            .await;
    }
    let store = Store::new();
    let pump = Pump::new();
    let answered = AtomicU32::new(0);
    let slow = |record: OwnedMessage| {
        let (store, answered) = (&store, &answered);
        async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let answer = handle(store, &record);
            answered.fetch_add(1, Ordering::SeqCst);
            answer
        }
    };
    let consumer = broker.consumer(&pump, "stops", "stops");
    let report = within(
        Duration::from_secs(60),
        "the pump",
        pump.run(&consumer, &producer, counted(&answered, 5), slow),
    )
    .await
    .unwrap();
    drop(consumer);
    let applied = store.effects().len();
    assert!(applied >= 5, "{applied}");
    assert_eq!(report.acked as usize, applied, "{report:?}");
    let committed: i64 = broker.committed("stops", "stops", 2).iter().sum();
    assert_eq!(
        committed as usize, applied,
        "every settled record committed, none past"
    );

    let consumer = broker.consumer(&pump, "stops", "stops");
    within(
        Duration::from_secs(60),
        "the pump started again",
        pump.run(&consumer, &producer, counted(&answered, 20), slow),
    )
    .await
    .unwrap();
    let effects = store.effects();
    assert_eq!(effects.len(), 20);
    assert!(effects.values().all(|n| *n == 1), "{effects:?}");
    assert_eq!(broker.committed("stops", "stops", 2), vec![10, 10]);
}

/// Records without a `message-id` are keyed by their position: each is applied once
/// however often it is delivered — and two records with the same body at two offsets are
/// two messages, as a producer's retry without idempotence would write them.
#[tokio::test]
async fn records_without_a_message_id_are_keyed_by_their_position() {
    let broker = Broker::start().await;
    broker.topic("positions", 1).await;
    let producer = broker.producer();
    for body in ["x", "x", "y"] {
        broker.produce(&producer, "positions", 0, None, body).await;
    }
    let store = Store::new();
    let pump = Pump::new();
    for _ in 0..2 {
        // The second group reads the topic again from its start: every record a duplicate.
        let group = format!("positions-{}", store.effects().len());
        let consumer = broker.consumer(&pump, &group, "positions");
        let answered = AtomicU32::new(0);
        within(
            Duration::from_secs(60),
            "the pump",
            pump.run(&consumer, &producer, counted(&answered, 3), |record| {
                assert_eq!(
                    key(&record).unwrap(),
                    MessageKey::kafka("positions", 0, record.offset()).unwrap()
                );
                let answer = handle(&store, &record);
                answered.fetch_add(1, Ordering::SeqCst);
                async move { answer }
            }),
        )
        .await
        .unwrap();
    }
    assert_eq!(
        store.effects(),
        BTreeMap::from([("x".to_owned(), 2), ("y".to_owned(), 1)])
    );
}

/// A dead letter that cannot be written (its topic does not exist) stops the pump before
/// anything past its record is committed: the record and those behind it are delivered
/// again once the topic exists.
#[tokio::test]
async fn a_dead_letter_that_cannot_be_written_stops_the_pump_before_its_offset() {
    let broker = Broker::start().await;
    // A topic name at Kafka's limit of 249 characters: its dead-letter topic's is too long.
    let orphans = format!("orphans{}", "o".repeat(242));
    broker.topic(&orphans, 1).await;
    let producer: FutureProducer = producer_config(&broker.address)
        .set("message.timeout.ms", "3000")
        .create()
        .unwrap();
    for id in ["d0", "d1", "d2"] {
        broker.produce(&producer, &orphans, 0, Some(id), id).await;
    }
    let pump = Pump::new();
    let consumer = broker.consumer(&pump, "orphans", &orphans);
    let stopped = within(
        Duration::from_secs(60),
        "the pump",
        pump.run(&consumer, &producer, std::future::pending(), |record| {
            let answer = if record.offset() == 1 {
                Settlement::DeadLetter
            } else {
                Settlement::Ack
            };
            async move { answer }
        }),
    )
    .await
    .unwrap_err();
    let Stopped::DeadLetter { report, failure } = stopped else {
        panic!("{stopped:?}")
    };
    assert!(failure.contains(".DLT"), "{failure}");
    assert_eq!(report.acked, 1, "{report:?}");
    drop(consumer);
    assert_eq!(broker.committed("orphans", &orphans, 1), vec![1]);
}

/// A second member joins the group while the first holds a record in its handler (the
/// first takes one at a time, and has queued the other partition's): the rebalance splits
/// the partitions between them. The held record's handler finishes; the records the first
/// had queued for a partition it lost are dropped, not run; each partition's owner reads it
/// from its committed offset. Every message is applied once, no record but the held one runs
/// in both members, and every offset is committed.
#[tokio::test]
async fn a_rebalance_while_a_handler_runs_loses_nothing_and_applies_nothing_twice() {
    let broker = Broker::start().await;
    broker.topic("shared", 2).await;
    let producer = broker.producer();
    for n in 0..20 {
        let id = format!("r{n:02}");
        broker
            .produce(&producer, "shared", n % 2, Some(&id), &id)
            .await;
    }
    let store = Store::new();
    let total = AtomicU32::new(0);
    let held = std::sync::atomic::AtomicBool::new(false);
    let (ran_first, ran_second) = (Mutex::new(Vec::new()), Mutex::new(Vec::new()));
    let one_at_a_time = Pump::new().max_in_hand(1);
    let first = broker.consumer(&one_at_a_time, "shared", "shared");
    let first_pump = one_at_a_time.run(&first, &producer, counted(&total, 20), |record| {
        let (store, total, held, ran, first) = (&store, &total, &held, &ran_first, &first);
        async move {
            ran.lock()
                .unwrap()
                .push((record.partition(), record.offset()));
            if !held.swap(true, Ordering::SeqCst) {
                // The first record waits until the rebalance left the first one partition.
                within(Duration::from_secs(60), "the rebalance", async {
                    while first.rdkafka().assignment().unwrap().count() != 1 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                })
                .await;
            }
            let answer = handle(store, &record);
            total.fetch_add(1, Ordering::SeqCst);
            answer
        }
    });
    let second_pump = async {
        // Joins once the first holds its record.
        while !held.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let pump = Pump::new();
        let second = broker.consumer(&pump, "shared", "shared");
        pump.run(&second, &producer, counted(&total, 20), |record| {
            ran_second
                .lock()
                .unwrap()
                .push((record.partition(), record.offset()));
            let answer = handle(&store, &record);
            total.fetch_add(1, Ordering::SeqCst);
            async move { answer }
        })
        .await
    };
    let (first, second) = within(Duration::from_secs(120), "both members", async {
        tokio::join!(first_pump, second_pump)
    })
    .await;
    let (first, second) = (first.unwrap(), second.unwrap());
    assert!(second.acked >= 9, "{second:?}");
    let effects = store.effects();
    assert_eq!(effects.len(), 20, "{first:?} {second:?}");
    assert!(effects.values().all(|n| *n == 1), "{effects:?}");
    let (ran_first, ran_second) = (
        ran_first.into_inner().unwrap(),
        ran_second.into_inner().unwrap(),
    );
    let both: Vec<_> = ran_first
        .iter()
        .filter(|run| ran_second.contains(run))
        .collect();
    assert!(
        both.len() <= 1 && both.iter().all(|run| **run == ran_first[0]),
        "{ran_first:?} {ran_second:?}"
    );
    assert_eq!(broker.committed("shared", "shared", 2), vec![10, 10]);
}

mod outbox {
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use inbox_diesel::outbox::relay::Relay;
    use inbox_diesel::outbox::{Message as Outgoing, Outbox};
    use inbox_kafka::outbox::{LIMITS, OutboxSink};

    use super::*;

    static OUTBOX: Outbox = Outbox::new("outbox").limits(LIMITS);

    /// Publishes three events of one order, keyed by the order, beside the business change.
    #[idempotent(consumer = "orders", key = key)]
    fn place(
        conn: &mut SqliteConnection,
        key: &MessageKey,
        order: &str,
    ) -> Result<(), inbox_diesel::Error> {
        diesel::sql_query("INSERT INTO effects (message) VALUES ('placed')").execute(conn)?;
        for at in 0..3 {
            OUTBOX.publish(
                conn,
                Outgoing::new("events", format!("{order} event {at}"))
                    .key(order)
                    .header("at", at.to_string()),
            )?;
        }
        Ok(())
    }

    /// The relay produces each outbox row with its id as `message-id` and its ordering key
    /// as the record's key; a relay that sends the rows again (it stopped before marking
    /// them) writes second records with the same ids, which the consumer's inbox answers
    /// `Duplicate`: each event applied once downstream, in the order of its key.
    #[tokio::test]
    async fn the_outbox_sink_produces_each_row_keyed_with_its_id() {
        let broker = Broker::start().await;
        broker.topic("events", 3).await;
        let upstream = Store::new();
        upstream
            .connect()
            .batch_execute(&OUTBOX.create_table_sql(inbox_diesel::schema::Backend::Sqlite))
            .unwrap();
        for order in ["order-1", "order-2"] {
            let _ = place(
                &mut upstream.connect(),
                &MessageKey::text(order).unwrap(),
                order,
            )
            .unwrap();
        }
        let mut sink = OutboxSink::new(broker.producer());
        let mut conn = SyncConnectionWrapper::new(upstream.connect());
        let relay = Relay::new(OUTBOX);
        assert_eq!(relay.run_once(&mut conn, &mut sink).await.unwrap().sent, 6);
        upstream
            .connect()
            .batch_execute("UPDATE outbox SET sent_at = NULL")
            .unwrap();
        assert_eq!(relay.run_once(&mut conn, &mut sink).await.unwrap().sent, 6);

        let records = broker.read("events", 12).await;
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            id: String,
        }
        let ids: Vec<String> = diesel::sql_query("SELECT id FROM outbox ORDER BY seq")
            .load::<Row>(&mut upstream.connect())
            .unwrap()
            .into_iter()
            .map(|row| row.id)
            .collect();
        let mut by_key: HashMap<Vec<u8>, (i32, Vec<String>)> = HashMap::new();
        for record in &records {
            let id = header(record, MESSAGE_ID).unwrap();
            assert!(ids.contains(&id), "{id} is no outbox id");
            let body = String::from_utf8_lossy(record.payload().unwrap()).into_owned();
            let entry = by_key
                .entry(record.key().unwrap().to_vec())
                .or_insert((record.partition(), Vec::new()));
            assert_eq!(entry.0, record.partition(), "one key, one partition");
            entry.1.push(body);
        }
        for (key, (_, bodies)) in &by_key {
            let order = String::from_utf8_lossy(key);
            let expected: Vec<String> = (0..2)
                .flat_map(|_| (0..3).map(|at| format!("{order} event {at}")))
                .collect();
            assert_eq!(bodies, &expected, "in the relay's order, per key");
        }

        let downstream = Store::new();
        let pump = Pump::new();
        let consumer = broker.consumer(&pump, "downstream", "events");
        let answered = AtomicU32::new(0);
        let report = within(
            Duration::from_secs(60),
            "the pump",
            pump.run(
                &consumer,
                &broker.producer(),
                counted(&answered, 12),
                |record| {
                    let answer = handle(&downstream, &record);
                    answered.fetch_add(1, Ordering::SeqCst);
                    async move { answer }
                },
            ),
        )
        .await
        .unwrap();
        assert_eq!(report.acked, 12);
        let effects = downstream.effects();
        assert_eq!(effects.len(), 6);
        assert!(effects.values().all(|n| *n == 1), "{effects:?}");
    }
}

/// A partition revoked while its record is in hand, read to its end by another member, and
/// assigned back: the record's offset is not stored when its handler answers (it would move
/// the group's committed offset back behind what the other member committed).
#[tokio::test]
async fn a_record_whose_partition_came_back_stores_no_offset() {
    let broker = Broker::start().await;
    broker.topic("returns", 1).await;
    let producer = broker.producer();
    for n in 0..10 {
        let id = format!("t{n}");
        broker
            .produce(&producer, "returns", 0, Some(&id), &id)
            .await;
    }
    let store = Store::new();
    // The range assignor gives the partition to the member whose id sorts first: the
    // second member's client id sorts before the first's, so the rebalance hands it over.
    let member = |client: &str, pump: &Pump| {
        let mut config = Pump::consumer_config(&broker.address, "returns");
        config
            .set("client.id", client)
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500");
        let consumer = pump.consumer(&config).unwrap();
        consumer.subscribe(&["returns"]).unwrap();
        consumer
    };
    let pump = Pump::new().max_in_hand(1);
    let first = member("z-first", &pump);
    let (held, release) = (
        std::sync::atomic::AtomicBool::new(false),
        tokio::sync::Notify::new(),
    );
    let first_stop = tokio::sync::Notify::new();
    let second_ran = Mutex::new(Vec::new());
    let first_pump = pump.run(&first, &producer, first_stop.notified(), |record| {
        let (store, held, release) = (&store, &held, &release);
        async move {
            if record.offset() == 0 && !held.swap(true, Ordering::SeqCst) {
                release.notified().await;
            }
            handle(store, &record)
        }
    });
    let rest = async {
        while !held.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let second = member("a-second", &pump);
        let answered = AtomicU32::new(0);
        let report = pump
            .run(&second, &producer, counted(&answered, 10), |record| {
                second_ran.lock().unwrap().push(record.offset());
                let answer = handle(&store, &record);
                answered.fetch_add(1, Ordering::SeqCst);
                async move { answer }
            })
            .await
            .unwrap();
        drop(second);
        // The partition back with the first member, its record still in hand.
        within(Duration::from_secs(60), "the partition's return", async {
            while first.rdkafka().assignment().unwrap().count() != 1
                || broker.committed("returns", "returns", 1) != vec![10]
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        release.notify_one();
        tokio::time::sleep(Duration::from_secs(2)).await;
        first_stop.notify_one();
        report
    };
    let (first_report, second_report) = within(Duration::from_secs(120), "both members", async {
        tokio::join!(first_pump, rest)
    })
    .await;
    let first_report = first_report.unwrap();
    assert_eq!(
        second_ran.into_inner().unwrap(),
        (0..10).collect::<Vec<_>>(),
        "the second member read the partition from its start: {second_report:?}"
    );
    assert_eq!(first_report.unstored, 1, "{first_report:?}");
    assert_eq!(broker.committed("returns", "returns", 1), vec![10]);
    let effects = store.effects();
    assert_eq!(effects.len(), 10);
    assert!(effects.values().all(|n| *n == 1), "{effects:?}");
}
