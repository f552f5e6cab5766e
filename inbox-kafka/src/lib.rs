//! Kafka consumers for `inbox-diesel` handlers, through [rdkafka]: each record is settled by
//! what the handler answered ([`Settle`]), and a partition's offset is committed only past
//! records that are settled.
//!
//! ```no_run
//! use inbox_diesel::Outcome;
//! use inbox_kafka::{Pump, key};
//! use rdkafka::producer::FutureProducer;
//!
//! # async fn credit(key: inbox_diesel::MessageKey, body: &[u8]) -> Result<Outcome<()>, inbox_diesel::Error> { Ok(Outcome::Processed(())) }
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pump = Pump::new().max_in_hand(16);
//! // A member of the group `credit-service`, reading `credits` from its start.
//! let consumer = pump.consumer(&Pump::consumer_config("127.0.0.1:9092", "credit-service"))?;
//! consumer.subscribe(&["credits"])?;
//! // Where dead letters go (`credits.DLT`): the idempotent producer.
//! let producer: FutureProducer = inbox_kafka::producer_config("127.0.0.1:9092").create()?;
//! // Until the process is asked to stop (`tokio::signal::ctrl_c()`, say).
//! let shutdown = std::future::pending::<()>();
//! let report = pump
//!     .run(&consumer, &producer, shutdown, |record| async move {
//!         // The producer's `message-id` header, else the topic, partition and offset.
//!         let key = match key(&record) {
//!             Ok(key) => key,
//!             Err(invalid) => return Err(inbox_diesel::Error::InvalidKey(invalid)),
//!         };
//!         credit(key, rdkafka::Message::payload(&record).unwrap_or_default()).await
//!     })
//!     .await?;
//! println!("{report:?}");
//! # Ok(())
//! # }
//! ```
//!
//! | the handler answered | [`Settlement`] | what the pump does |
//! |---|---|---|
//! | `Processed`, `Duplicate` | `Ack` | stores the offset after the record's, committed with the next commit |
//! | `InFlight`, a transient failure, a panic | `Retry`, `Held` | runs the handler on the record again after [`Redelivery`]'s delay, its partition waiting; after [`Pump::max_attempts`] runs, as `DeadLetter` |
//! | a business constraint, an invalid key, a stale claim | `DeadLetter` | writes the record to the dead-letter topic, waits for the broker's acknowledgement, then stores the offset |
//! | misuse, a schema fault, a missing privilege | `Halt` | stores nothing for the record, stops taking records, finishes those in hand, and returns [`Stopped::Halted`] |
//!
//! **Order and offsets.** Kafka keeps one offset per partition, so a record is settled
//! when every record before it in its partition is. The pump holds at most one record of a
//! partition at a time: records of one partition are handled in order, one after the other,
//! and records of different partitions beside each other, up to [`Pump::max_in_hand`]. Its
//! offset is stored once a record is settled (`enable.auto.offset.store` off), and the
//! consumer commits what is stored every `auto.commit.interval.ms` (5 s by default), at a
//! rebalance, and when the pump stops. Nothing past a record still in hand is stored,
//! whatever happened to the records behind it: a process that dies restarts its partitions
//! at their oldest unsettled record, and the inbox answers `Duplicate` for the settled ones
//! whose commit it did not live to make. Order holds per partition, which is per key for a
//! producer that keys its records (the outbox's sink does); for more parallelism than
//! partitions, add partitions.
//!
//! **Rebalances.** A partition revoked while its record's handler runs is not waited for:
//! the handler finishes, its offset is not stored — nor retried or dead-lettered — even if
//! the partition was assigned back since (another member may have read and committed past
//! it meanwhile: storing the offset would move the group back), and the owner delivers the
//! record again — the inbox answers `Duplicate`
//! if it was processed, or waits (`InFlight`) if its transaction is still open. What the pump
//! had queued for a revoked partition is dropped; the new owner reads it from the committed
//! offset.
//!
//! **Keys.** [`key`] is the producer's `message-id` header ([`MESSAGE_ID`]; the outbox's
//! [`OutboxSink`](outbox::OutboxSink) sets it to the outbox id), else the record's topic,
//! partition and offset ([`broker::kafka`]). A position names a record, not a message: a
//! producer that retries a send without `enable.idempotence` can write a message twice, at
//! two offsets, and each is then applied. Set the header, or use the idempotent producer
//! ([`producer_config`]).
//!
//! **Retries and dead letters.** Kafka redelivers nothing by itself and has no dead-letter
//! queue. A record whose handler answers a retry keeps its partition waiting while the pump
//! runs the handler on it again after [`Redelivery`]'s delay (the partition is paused at
//! the broker while its queue is long); after [`Pump::max_attempts`] runs (20 by default) it
//! is dead-lettered, so that a poison record cannot stall its partition for ever. A dead
//! letter is written to the record's topic with [`Pump::dead_letter_suffix`] appended
//! (`credits.DLT`), with its key, payload and headers and the headers
//! [`DEAD_LETTER_TOPIC`], [`DEAD_LETTER_PARTITION`], [`DEAD_LETTER_OFFSET`] and
//! [`DEAD_LETTER_REASON`]; the offset is stored only after the broker acknowledged it. A
//! dead letter that cannot be written stops the pump ([`Stopped::DeadLetter`]) rather than
//! commit past it. A record that takes the process down with it (an abort, an
//! out-of-memory kill) is not counted: it comes back first on its partition after every
//! restart, until it is skipped by hand, the group's members stopped:
//! `kafka-consumer-groups --bootstrap-server <brokers> --group <group> --topic
//! <topic>:<partition> --reset-offsets --shift-by 1 --execute`.
//!
//! **Reconnect and outages.** As in the other pumps ([`inbox_diesel::pump`]): the database
//! connection is the handler's, discarded by its pool after an `Action::Reconnect`; after a
//! failure of the database the pump starts no handler for a pause, doubling while it
//! lasts ([`Pump::outage`]). librdkafka reconnects to the brokers by itself.
//!
//! **Pool checkouts.** A closure that takes the handler's connection from a pool (bb8,
//! deadpool, r2d2) before calling it answers a failed checkout with
//! [`inbox_diesel::Error::checkout`]: nothing ran, and its class (`ConnectionLost`) settles
//! it as the database's outage — retried after a delay, the pump pausing as above — never as
//! a dead letter: `pool.get().await.map_err(inbox_diesel::Error::checkout)?`.
//!
//! **Shutdown.** When `shutdown` completes (or the pump halts), the pump pauses its
//! partitions, drops what it had queued (not stored: read again by whoever consumes the
//! partition next), lets the handlers in hand settle, commits the stored offsets, and
//! returns.
//!
//! **Traces.** Each run of a handler is one span, [`process_span`]`("kafka", topic,
//! attempt)`, with the record's `message-id`, partition and offset, the handler's consumer,
//! the stored id, the outcome and the settlement recorded on it
//! ([`inbox_diesel::telemetry`]).
//!
//! [rdkafka]: https://docs.rs/rdkafka

pub mod outbox;

use std::future::Future;
use std::time::Duration;

use inbox_diesel::pump::{self};
use inbox_diesel::telemetry::process_span;
use inbox_diesel::{KeyError, MessageKey, Outage, Redelivery, Settle, Settlement, broker};
use rdkafka::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::FutureProducer;

mod report;
mod source;
mod work;

pub use report::{Report, Stopped};
pub use source::Rebalances;
use work::*;

/// The header [`key`] reads a record's message id from, and the outbox's sink writes the
/// outbox id to.
pub const MESSAGE_ID: &str = "message-id";
/// On a dead letter: the topic the record was read from.
pub const DEAD_LETTER_TOPIC: &str = "inbox-dead-letter-topic";
/// On a dead letter: its partition there.
pub const DEAD_LETTER_PARTITION: &str = "inbox-dead-letter-partition";
/// On a dead letter: its offset there.
pub const DEAD_LETTER_OFFSET: &str = "inbox-dead-letter-offset";
/// On a dead letter: why — the handler's answer, as `Debug` prints it.
pub const DEAD_LETTER_REASON: &str = "inbox-dead-letter-reason";

/// The key of a Kafka record ([`broker::kafka`]): its [`MESSAGE_ID`] header when the
/// producer set one, else its topic, partition and offset.
///
/// # Errors
/// [`KeyError::TooLong`] for a header past [`MessageKey::MAX_LEN`]; [`KeyError::Missing`]
/// for a header that is not UTF-8.
pub fn key(record: &impl Message) -> Result<MessageKey, KeyError> {
    let id = match message_id(record) {
        Some(bytes) => Some(std::str::from_utf8(bytes).map_err(|_| KeyError::Missing {
            field: "Kafka message-id header (UTF-8)",
        })?),
        None => None,
    };
    broker::kafka(id, record.topic(), record.partition(), record.offset())
}

/// The record's [`MESSAGE_ID`] header, as bytes.
pub(crate) fn message_id(record: &impl Message) -> Option<&[u8]> {
    record.headers().and_then(|headers| {
        headers
            .iter()
            .find(|header| header.key == MESSAGE_ID)
            .and_then(|header| header.value)
    })
}

/// A producer's configuration for `bootstrap_servers` as the pump's dead letters and the
/// outbox's sink want it: the idempotent producer (`enable.idempotence`: a send the client
/// retries is written once) and `acks=all` (acknowledged once every in-sync replica has
/// it). Create it with `.create::<FutureProducer>()`.
pub fn producer_config(bootstrap_servers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap_servers)
        .set("enable.idempotence", "true")
        .set("acks", "all");
    config
}

/// A member of a consumer group, configured for the pump ([`Pump::consumer`]): offsets are
/// stored by the pump as records settle, and committed by the client.
pub struct GroupConsumer {
    consumer: StreamConsumer<Rebalances>,
}

impl std::fmt::Debug for GroupConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupConsumer").finish_non_exhaustive()
    }
}

impl GroupConsumer {
    /// Subscribes to `topics` (joining the group: partitions are assigned at the first poll).
    ///
    /// # Errors
    /// librdkafka's refusal (an invalid topic name).
    pub fn subscribe(&self, topics: &[&str]) -> KafkaResult<()> {
        self.consumer.subscribe(topics)
    }

    /// rdkafka's consumer, for what the pump does not do (metadata, committed offsets,
    /// lag). Storing or committing offsets through it would commit past records in hand.
    pub fn rdkafka(&self) -> &StreamConsumer<Rebalances> {
        &self.consumer
    }
}

/// Runs handlers on Kafka records and settles each by the handler's answer: how many at
/// once, how retries wait, where dead letters go.
#[derive(Debug, Clone, Copy)]
pub struct Pump {
    max_in_hand: usize,
    redelivery: Redelivery,
    outage: Redelivery,
    max_attempts: u32,
    dead_letter_suffix: &'static str,
    dead_letter_timeout: Duration,
    queued_per_partition: usize,
}

impl Default for Pump {
    fn default() -> Self {
        Self::new()
    }
}

impl Pump {
    /// 16 records in hand (at most one per partition), [`Redelivery::DEFAULT`] between runs
    /// of a retried record, at most 20 runs (a database outage of almost an hour,
    /// [`pump::outage_tolerance`]), dead letters to `<topic>.DLT`,
    /// [`Outage::DEFAULT`].
    pub const fn new() -> Self {
        Self {
            max_in_hand: 16,
            redelivery: Redelivery::DEFAULT,
            outage: Outage::DEFAULT,
            max_attempts: 20,
            dead_letter_suffix: ".DLT",
            dead_letter_timeout: Duration::from_secs(30),
            queued_per_partition: 256,
        }
    }

    /// How many handlers run at once, each on a partition of its own. At least 1.
    pub const fn max_in_hand(self, max_in_hand: usize) -> Self {
        Self {
            max_in_hand: if max_in_hand == 0 { 1 } else { max_in_hand },
            ..self
        }
    }

    /// How long a retried record waits before its handler runs again: the delay after run
    /// `n` is [`Redelivery::delay_of`] for `n`.
    pub const fn redelivery(self, redelivery: Redelivery) -> Self {
        Self { redelivery, ..self }
    }

    /// How often the handler runs on a record that answers a retry before it is
    /// dead-lettered. At least 1. [`Pump::run`] warns when a database outage shorter than
    /// [`OUTAGE_TO_RIDE_OUT`](pump::OUTAGE_TO_RIDE_OUT) can spend them
    /// ([`pump::outage_tolerance`]).
    pub const fn max_attempts(self, max_attempts: u32) -> Self {
        Self {
            max_attempts: if max_attempts == 0 { 1 } else { max_attempts },
            ..self
        }
    }

    /// What is appended to a record's topic to name its dead-letter topic (`.DLT`, as
    /// Spring for Apache Kafka names them).
    pub const fn dead_letter_suffix(self, dead_letter_suffix: &'static str) -> Self {
        Self {
            dead_letter_suffix,
            ..self
        }
    }

    /// How long the pump starts no handler after a record that needed a new database
    /// connection ([`Outage`]): a pause per such record in a row, then one tries alone.
    pub const fn outage(self, outage: Redelivery) -> Self {
        Self { outage, ..self }
    }

    /// A consumer's configuration for the pump: `bootstrap_servers`, the group `group_id`,
    /// and a group with no committed offset reading from the earliest record
    /// (`auto.offset.reset=earliest`: a new group does not skip what was produced before
    /// it joined). Add what your brokers need (security, timeouts) before
    /// [`Pump::consumer`]. librdkafka's group timings are left as they are: a member killed
    /// without leaving keeps its partitions until its `session.timeout.ms` (45 s by default)
    /// runs out, and some brokers hold a new group's first assignment as long; lower it
    /// (with `heartbeat.interval.ms` below a third of it) where that wait matters.
    pub fn consumer_config(bootstrap_servers: &str, group_id: &str) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap_servers)
            .set("group.id", group_id)
            .set("auto.offset.reset", "earliest");
        config
    }

    /// A group member made from `config` for this pump: the pump stores each offset itself
    /// once its record is settled (`enable.auto.offset.store=false`), and the client commits
    /// what was stored (`enable.auto.commit=true`) — whatever `config` said of either.
    ///
    /// # Errors
    /// [`KafkaError::ClientCreation`] when `config` has no `group.id`, or librdkafka refuses
    /// it.
    pub fn consumer(&self, config: &ClientConfig) -> KafkaResult<GroupConsumer> {
        if config.get("group.id").is_none_or(str::is_empty) {
            return Err(KafkaError::ClientCreation(
                "the pump's consumer is a group member: set `group.id` (Pump::consumer_config)"
                    .to_owned(),
            ));
        }
        let mut config = config.clone();
        config
            .set("enable.auto.offset.store", "false")
            .set("enable.auto.commit", "true");
        let consumer = config.create_with_context(Rebalances::new())?;
        Ok(GroupConsumer { consumer })
    }

    /// Runs `handler` on each record `consumer` is assigned, in order within a partition
    /// and beside each other across partitions, up to [`Pump::max_in_hand`] at once; settles
    /// each by its answer; and stores its offset once it is settled, until `shutdown`
    /// completes, an answer halts, or a dead letter cannot be written. Dead letters are
    /// written with `producer` ([`producer_config`]); one the brokers do not acknowledge
    /// within the producer's `delivery.timeout.ms` (300 s by default) stops the pump.
    ///
    /// A handler that panics settles its own record ([`Settlement::of_panic`]): its
    /// transaction was rolled back as the panic unwound, and the record is retried like a
    /// retrying answer; the pump goes on with the others.
    ///
    /// # Errors
    /// [`Stopped::Halted`] when an answer halted the pump; [`Stopped::DeadLetter`] when a
    /// dead letter could not be written; [`Stopped::Broker`] on a fatal consumer error.
    pub async fn run<H, F, A, S>(
        &self,
        consumer: &GroupConsumer,
        producer: &FutureProducer,
        shutdown: S,
        handler: H,
    ) -> Result<Report, Stopped>
    where
        H: Fn(rdkafka::message::OwnedMessage) -> F,
        F: Future<Output = A>,
        A: Settle + std::fmt::Debug,
        S: Future<Output = ()>,
    {
        pump::warn_short_tolerance("the Kafka pump", &self.redelivery, self.max_attempts);
        let settings = Settings {
            redelivery: self.redelivery,
            max_attempts: self.max_attempts,
            dead_letter_suffix: self.dead_letter_suffix,
            dead_letter_timeout: self.dead_letter_timeout,
            retries: std::sync::atomic::AtomicU64::new(0),
        };
        let outage = Outage::new(self.outage);
        let mut records = source::Records::new(
            &consumer.consumer,
            self.max_in_hand,
            self.queued_per_partition,
        );
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let (settings, outage, handler, stopping) = (&settings, &outage, &handler, &stopping);
        let ended = pump::run(
            &mut records,
            shutdown,
            &stop,
            |delivery| {
                work(
                    handler, settings, outage, stopping, consumer, producer, delivery,
                )
            },
            give_back,
        )
        .await;
        drop(records);
        commit(&consumer.consumer);
        let report = Report::of(
            ended.counts,
            settings.retries.load(std::sync::atomic::Ordering::Relaxed),
        );
        match (ended.end, ended.halted, ended.failed) {
            (Some(failure), _, _) => Err(Stopped::Broker { failure, report }),
            (None, Some(answer), _) => Err(Stopped::Halted { answer, report }),
            (None, None, Some(failure)) => Err(Stopped::DeadLetter { failure, report }),
            (None, None, None) => Ok(report),
        }
    }
}

/// Commits what was stored, once the records in hand are settled.
fn commit(consumer: &StreamConsumer<Rebalances>) {
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) => {}
        // Nothing stored since the last commit.
        Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => tracing::warn!(
            error = %e,
            "committing the stored offsets at the stop failed: the group delivers the records \
             since the last commit again"
        ),
    }
}
