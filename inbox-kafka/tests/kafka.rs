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
        let consumer = pump
            .consumer(&Pump::consumer_config(&self.address, group))
            .unwrap();
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
