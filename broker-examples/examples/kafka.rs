//! Two consumer processes are members of one Kafka consumer group; one is killed with
//! SIGKILL in the middle of a handler and started again; every message is produced twice.
//! Each message is still applied exactly once.
//!
//! ```text
//! TANSU=/path/to/tansu cargo run --example kafka    # a private broker; effects in SQLite
//! KAFKA_BROKERS=127.0.0.1:9092 cargo run --example kafka
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --example kafka --features inbox-broker-examples/postgres
//! ```
//!
//! The brokers are `KAFKA_BROKERS`; without it the run starts a private tansu broker (an
//! Apache Kafka-compatible broker: `TANSU`, else `tansu` on the PATH) on a free port. The
//! run creates a topic of its own with four partitions, `inbox-broker-example-<pid>`, starts
//! consumers `a` and `b` — this binary again, as `kafka consume <brokers> <topic> <database>
//! <name>`, members of the group `inbox-broker-example-<pid>` — and produces 40 messages twice
//! each with one `message-id` header and the message id as the record key (all once, then
//! all again), as a producer without idempotence does that retries after a lost
//! acknowledgement: two records per message, in one partition.
//!
//! Each consumer runs `inbox_kafka::Pump` (4 records in hand, one per partition) with an
//! `#[idempotent]` handler that writes one row to `effects` in the inbox's transaction, then
//! pauses 100 ms before the commit. The first consumer to start its third handler — say
//! `a` — is killed with SIGKILL the moment it prints that the handler is in that pause: its
//! transaction is rolled back, and what it had settled since its last commit (every 500 ms)
//! is not committed. Once the group misses its heartbeats (a session of 6 s), the broker
//! gives its partitions to `b` and `a2`, the restarted `a`, which read them from the
//! committed offsets: the records `a` applied and did not commit are answered `Duplicate`,
//! the one it died in is applied.
//!
//! The run ends when every message has its effect and the group has committed every record
//! (no lag); the consumers are stopped (their standard input closed: the pump finishes what
//! it holds and commits), and the table printed. The exit code is non-zero unless every
//! message has exactly one effect.

use std::process::ExitCode;
use std::time::Duration;

use inbox_broker_examples::brokers::Kafka;
use inbox_broker_examples::events::{Event, reported};
use inbox_broker_examples::fleet::{self, Fleet};
use inbox_broker_examples::scenario::Scenario;
use inbox_broker_examples::store::{Database, Failure, Store};
use inbox_diesel::Redelivery;
use inbox_kafka::{MESSAGE_ID, Pump, key, producer_config};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

const SCENARIO: Scenario = Scenario {
    messages: 40,
    copies: 2,
    kill_after: 3,
    timeout: Duration::from_secs(120),
};
/// The topic's partitions: the most records in hand at once in the group.
const PARTITIONS: i32 = 4;
/// Records each consumer holds at once, and database connections it pools.
const IN_HAND: usize = 4;
/// The handler's work before its commit, in which the kill lands.
const PAUSE: Duration = Duration::from_millis(100);

/// The consumers' pump: a retry (a busy database) runs again after 100 ms, then 200 ms, …
/// at most 2 s, up to 1 000 times (a half-hour database outage at those delays).
const PUMP: Pump = Pump::new()
    .max_in_hand(IN_HAND)
    .max_attempts(1000)
    .redelivery(Redelivery::exponential(
        Duration::from_millis(100),
        Duration::from_secs(2),
    ));

#[tokio::main]
async fn main() -> ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
    match arguments.as_slice() {
        [] => match orchestrate().await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        ["consume", brokers, topic, database, name] => {
            match consume(brokers, topic, database, name).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("consumer {name}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!("usage: kafka  (the orchestrator; it starts its consumers itself)");
            ExitCode::from(2)
        }
    }
}

/// Each message `copies` times with one `message-id`, keyed by its id, each acknowledged
/// before the next: every message once, then every message again.
async fn produce(producer: &FutureProducer, topic: &str, ids: &[String]) -> Result<(), String> {
    for _ in 0..SCENARIO.copies {
        for id in ids {
            let headers = OwnedHeaders::new().insert(Header {
                key: MESSAGE_ID,
                value: Some(id),
            });
            let record = FutureRecord::to(topic).key(id).payload(id).headers(headers);
            producer
                .send(record, Timeout::After(Duration::from_secs(10)))
                .await
                .map_err(|(e, _)| format!("produce {id} to {topic}: {e}"))?;
        }
    }
    Ok(())
}

/// The orchestrator: broker, topic, database, consumers, messages, the kill, the table.
async fn orchestrate() -> Result<ExitCode, String> {
    let kafka = Kafka::start().await?;
    let topic = format!("inbox-broker-example-{}", std::process::id());
    kafka.create_topic(&topic, PARTITIONS).await?;
    let outcome = run(&kafka, &topic).await;
    kafka.delete_topic(&topic).await;
    outcome
}

async fn run(kafka: &Kafka, topic: &str) -> Result<ExitCode, String> {
    let store = Store::prepare().await?;
    println!(
        "{}, topic {topic} ({PARTITIONS} partitions)\neffects in {}\n\
         {} messages, each produced {} times with one message-id; consumers a and b \
         (processes in one group, {IN_HAND} records in hand each, {} ms in each handler)\n",
        kafka.describe(),
        store.describe(),
        SCENARIO.messages,
        SCENARIO.copies,
        PAUSE.as_millis(),
    );
    let producer: FutureProducer = producer_config(&kafka.bootstrap)
        .create()
        .map_err(|e| format!("a producer for {}: {e}", kafka.bootstrap))?;
    let mut fleet = Fleet::new(["consume", kafka.bootstrap.as_str(), topic, store.url()])
        .map_err(|e| format!("find this program to start consumers: {e}"))?;
    SCENARIO.start(&mut fleet).await?;
    produce(&producer, topic, &SCENARIO.message_ids()).await?;
    // The group is named for its topic.
    let pending = async || kafka.lag(topic, topic, PARTITIONS);
    let tally = SCENARIO.drive(&mut fleet, &store, pending).await;
    let ended = fleet.stop(Duration::from_secs(15)).await;
    let mut tally = tally?;
    tally.stopped(ended);
    Ok(tally.report())
}

/// The record's `message-id`, or `-`.
fn message_id(record: &OwnedMessage) -> String {
    record
        .headers()
        .and_then(|headers| headers.iter().find(|header| header.key == MESSAGE_ID))
        .and_then(|header| header.value)
        .map_or_else(
            || "-".to_owned(),
            |id| String::from_utf8_lossy(id).into_owned(),
        )
}

/// A consumer process: the pump in the group, the `#[idempotent]` handler on the database,
/// an event line per record and per answer, until standard input closes.
async fn consume(brokers: &str, topic: &str, database: &str, name: &str) -> Result<(), String> {
    let connections = u32::try_from(IN_HAND).expect("a few connections");
    let inbox = Database::connect(database, connections).await?;
    let mut config = Pump::consumer_config(brokers, topic);
    // A killed member's partitions go to the others after 6 s without its heartbeats; what
    // was settled is committed every 500 ms.
    config
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("auto.commit.interval.ms", "500");
    let consumer = PUMP
        .consumer(&config)
        .map_err(|e| format!("a consumer for {brokers}: {e}"))?;
    consumer
        .subscribe(&[topic])
        .map_err(|e| format!("subscribe to {topic}: {e}"))?;
    let producer: FutureProducer = producer_config(brokers)
        .create()
        .map_err(|e| format!("a producer for {brokers}: {e}"))?;
    Event::Ready.emit();
    let inbox = &inbox;
    let report = PUMP
        .run(
            &consumer,
            &producer,
            fleet::until_stdin_closes(),
            |record| async move {
                let id = message_id(&record);
                reported(&id, false, 1, name, async {
                    match key(&record) {
                        Ok(key) => inbox.apply(&key, &id, name, PAUSE).await,
                        Err(invalid) => {
                            Err(Failure::from(inbox_diesel::Error::InvalidKey(invalid)))
                        }
                    }
                })
                .await
            },
        )
        .await
        .map_err(|stopped| stopped.to_string())?;
    Event::Stopped {
        report: format!("{report:?}"),
    }
    .emit();
    Ok(())
}
