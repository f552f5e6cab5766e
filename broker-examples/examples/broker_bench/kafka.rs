//! Kafka: a topic per run on the run's brokers (a private tansu, or `KAFKA_BROKERS`), the
//! direct consumer and the pump on it, timed.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use inbox_broker_examples::brokers::Kafka as Brokers;
use inbox_diesel::broker;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::database::Database;
use crate::run::{PAYLOAD, RunError, Tally, Timing, Variant, timing};

/// Partitions of every run's topic: the most records the pump has in hand at once.
pub(crate) const PARTITIONS: i32 = 8;

pub(crate) struct Kafka {
    brokers: Brokers,
    producer: FutureProducer,
}

impl Kafka {
    pub(crate) async fn connect() -> Result<Self, String> {
        let brokers = Brokers::start().await?;
        let producer = inbox_kafka::producer_config(&brokers.bootstrap)
            .create()
            .map_err(|e| format!("a producer for {}: {e}", brokers.bootstrap))?;
        Ok(Self { brokers, producer })
    }

    pub(crate) fn describe(&self) -> String {
        self.brokers.describe()
    }

    /// A topic of its own for run `run`, holding `ids` (each its `message-id`), spread over
    /// the partitions, each acknowledged by the broker.
    pub(crate) async fn prepare(&self, run: usize, ids: &[String]) -> Result<String, String> {
        let topic = format!("inbox-bench-{}-{run}", std::process::id());
        self.brokers.create_topic(&topic, PARTITIONS).await?;
        for chunk in ids.chunks(1000) {
            let sends = chunk.iter().map(|id| {
                let headers = OwnedHeaders::new().insert(Header {
                    key: inbox_kafka::MESSAGE_ID,
                    value: Some(id),
                });
                let record = FutureRecord::to(&topic)
                    .key(id)
                    .payload(&PAYLOAD[..])
                    .headers(headers);
                self.producer
                    .send(record, Timeout::After(Duration::from_secs(30)))
            });
            for sent in futures_util::future::join_all(sends).await {
                sent.map_err(|(e, _)| format!("produce to {topic}: {e}"))?;
            }
        }
        Ok(topic)
    }

    /// Records past the group's committed offsets.
    pub(crate) async fn left(&self, topic: &str) -> Result<u64, String> {
        self.brokers.lag(topic, topic, PARTITIONS)
    }

    pub(crate) async fn delete(&self, topic: &str) {
        self.brokers.delete_topic(topic).await;
    }

    fn config(&self, group: &str) -> ClientConfig {
        let mut config = inbox_kafka::Pump::consumer_config(&self.brokers.bootstrap, group);
        config
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500");
        config
    }

    /// One throughput run of `variant` on `topic`, as the group named for the topic.
    pub(crate) async fn consume(
        &self,
        topic: &str,
        variant: Variant,
        in_hand: usize,
        database: &Database,
        tally: &Tally,
    ) -> Result<Timing, RunError> {
        let (start, stopped) = match variant {
            Variant::Pump => {
                let pump = inbox_kafka::Pump::new().max_in_hand(in_hand);
                let consumer = pump
                    .consumer(&self.config(topic))
                    .map_err(|e| format!("a consumer: {e}"))?;
                consumer
                    .subscribe(&[topic])
                    .map_err(|e| format!("subscribe to {topic}: {e}"))?;
                let start = Instant::now();
                pump.run(
                    &consumer,
                    &self.producer,
                    tally.finished(),
                    |record| async move {
                        let id = id_of(&record);
                        tally.handle(database, inbox_kafka::key(&record), &id).await
                    },
                )
                .await
                .map_err(|stopped| stopped.to_string())?;
                (start, Instant::now())
            }
            _ => {
                // What one writes with rdkafka alone: up to `in_hand` handlers at once over
                // the stream, each offset stored after its answer, the client committing what
                // is stored. (Across a partition's records, out of order: a commit can pass a
                // record still in hand.)
                let mut config = self.config(topic);
                config.set("enable.auto.offset.store", "false");
                let consumer: StreamConsumer =
                    config.create().map_err(|e| format!("a consumer: {e}"))?;
                consumer
                    .subscribe(&[topic])
                    .map_err(|e| format!("subscribe to {topic}: {e}"))?;
                let consumer = &consumer;
                let start = Instant::now();
                consumer
                    .stream()
                    .take_until(tally.finished())
                    .for_each_concurrent(in_hand, |record| async move {
                        let Ok(record) = record else { return };
                        let id = id_of(&record);
                        let key = broker::kafka(
                            Some(id.as_str()),
                            record.topic(),
                            record.partition(),
                            record.offset(),
                        );
                        if tally.handle(database, key, &id).await.is_ok() {
                            let mut list = TopicPartitionList::new();
                            let _ = list.add_partition_offset(
                                record.topic(),
                                record.partition(),
                                Offset::Offset(record.offset() + 1),
                            );
                            let _ = consumer.store_offsets(&list);
                        }
                    })
                    .await;
                let _ = consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync);
                (start, Instant::now())
            }
        };
        timing(start, tally, stopped)
    }
}

fn id_of(record: &impl Message) -> String {
    record
        .headers()
        .and_then(|headers| headers.iter().find(|h| h.key == inbox_kafka::MESSAGE_ID))
        .and_then(|header| header.value)
        .map(|id| String::from_utf8_lossy(id).into_owned())
        .unwrap_or_default()
}
