//! An outbox's relay producing to Kafka ([`OutboxSink`]) through the idempotent producer,
//! each record acknowledged by every in-sync replica.
//!
//! ```no_run
//! use inbox_diesel::outbox::Outbox;
//! use inbox_diesel::outbox::relay::Relay;
//! use inbox_kafka::outbox::{LIMITS, OutboxSink};
//!
//! // The handlers publish with Kafka's limits: what it cannot carry is refused there.
//! static OUTBOX: Outbox = Outbox::new("outbox").limits(LIMITS);
//!
//! # type Conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;
//! # async fn run(conn: &mut Conn) -> Result<(), Box<dyn std::error::Error>> {
//! // `conn`: a diesel-async connection to the database the handlers publish in.
//! let mut sink = OutboxSink::new(inbox_kafka::producer_config("127.0.0.1:9092").create()?);
//! let shutdown = std::future::pending::<()>();
//! Relay::new(OUTBOX).run(conn, &mut sink, shutdown).await?;
//! # Ok(())
//! # }
//! ```
//!
//! Each message is produced to the topic its destination names, with its ordering key as
//! the record's key (records of one key go to one partition, in the relay's order; a
//! message without one goes where the producer's partitioner puts it), its headers, and its
//! outbox id in the [`MESSAGE_ID`] header, which [`key`](crate::key)
//! reads downstream. The row is marked sent once the broker acknowledged the record. A
//! relay that sends a message again (it stopped between the send and the mark) writes a
//! second record with the same `message-id`: the consumer's inbox answers it `Duplicate`. A
//! retry of the client's own within one send is written once: the producer is idempotent
//! ([`producer_config`](crate::producer_config)).
//!
//! A topic the cluster does not know (where the brokers create none), a record over
//! `message.max.bytes`, an invalid topic name are [`Rejected`](SinkError::Rejected) — parked
//! after the relay's `max_attempts`; a timeout, brokers out of reach, a partition without a
//! leader yet (`UnknownTopicOrPartition` on a topic just made) and a missing ACL
//! (`TopicAuthorizationFailed`: every message would be parked until it is granted) are
//! [`Unavailable`](SinkError::Unavailable): the relay pauses and tries again.

use std::time::Duration;

use inbox_diesel::outbox::Limits;
use inbox_diesel::outbox::relay::{Outgoing, Sink, SinkError};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use crate::MESSAGE_ID;

/// What Kafka carries: payloads up to 900 000 bytes — librdkafka's producer refuses a
/// record over its `message.max.bytes` (1 000 000 by default) with its key, headers and
/// framing, and the broker one over its own (1 MiB by default); the rest is room for the
/// key and headers — topic names of at most 249 characters from `[a-zA-Z0-9._-]`, ordering
/// keys of up to 255 bytes, and headers of any text but `message-id` (the outbox id's). A
/// producer or broker configured lower refuses larger records at
/// the send (rejected, then parked).
pub const LIMITS: Limits = Limits {
    max_payload: 900_000,
    max_destination: 249,
    max_key: 255,
    destination: topic,
    header,
};

/// Whether `topic` is a name a record can be produced to.
fn topic(topic: &str) -> Result<(), &'static str> {
    if topic.is_empty() || topic == "." || topic == ".." {
        return Err("a Kafka topic name is not empty, `.` or `..`");
    }
    if !topic
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("a Kafka topic name has only ASCII letters, digits, `.`, `_` and `-`");
    }
    Ok(())
}

fn header(name: &str, _: &str) -> Result<(), &'static str> {
    if name == MESSAGE_ID {
        return Err("the `message-id` header is the outbox id's, set by the sink");
    }
    Ok(())
}

/// Produces an outbox's messages to Kafka, each acknowledged by the broker.
#[derive(Clone)]
pub struct OutboxSink {
    producer: FutureProducer,
    timeout: Duration,
}

impl std::fmt::Debug for OutboxSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxSink")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl OutboxSink {
    /// A sink producing through `producer`, made from
    /// [`producer_config`](crate::producer_config) (idempotent, `acks=all`). A send waits
    /// up to 30 s for room in the producer's queue, then for the broker's acknowledgement
    /// up to the producer's `delivery.timeout.ms` (`message.timeout.ms`, 300 s by default):
    /// a send that times out is [`Unavailable`](SinkError::Unavailable). Lower that setting
    /// for a relay that should pause sooner when the brokers are out of reach.
    pub fn new(producer: FutureProducer) -> Self {
        Self {
            producer,
            timeout: Duration::from_secs(30),
        }
    }

    /// How long one send waits for room in the producer's queue (the wait for the broker's
    /// acknowledgement is the producer's `delivery.timeout.ms`).
    pub fn timeout(self, timeout: Duration) -> Self {
        Self { timeout, ..self }
    }

    async fn produce(&self, message: &Outgoing) -> Result<(), SinkError> {
        // Checked again here, for rows written with other limits.
        topic(&message.destination).map_err(|why| SinkError::Rejected(why.into()))?;
        let id = message.id.to_string();
        let mut headers = OwnedHeaders::new_with_capacity(message.headers.len() + 1);
        for (name, value) in &message.headers {
            header(name, value).map_err(|why| SinkError::Rejected(why.into()))?;
            headers = headers.insert(Header {
                key: name,
                value: Some(value),
            });
        }
        headers = headers.insert(Header {
            key: MESSAGE_ID,
            value: Some(&id),
        });
        let mut record = FutureRecord::<str, [u8]>::to(&message.destination)
            .payload(&message.payload)
            .headers(headers);
        if !message.key.is_empty() {
            record = record.key(&message.key);
        }
        match self
            .producer
            .send(record, Timeout::After(self.timeout))
            .await
        {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(classify(&e)),
        }
    }
}

/// A failed send: the broker's refusal of this record, or brokers out of reach.
fn classify(error: &KafkaError) -> SinkError {
    match error.rdkafka_error_code() {
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::InvalidTopic
            | RDKafkaErrorCode::UnknownTopic
            | RDKafkaErrorCode::MessageBatchTooLarge
            | RDKafkaErrorCode::InvalidRecord,
        ) => SinkError::Rejected(error.to_string()),
        _ => SinkError::Unavailable(error.to_string()),
    }
}

impl Sink for OutboxSink {
    fn send(&mut self, message: &Outgoing) -> impl Future<Output = Result<(), SinkError>> + Send {
        self.produce(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_and_headers_are_checked() {
        assert!(topic("orders.placed-v2_eu").is_ok());
        assert!(topic("").is_err());
        assert!(topic("..").is_err());
        assert!(topic("orders placed").is_err());
        assert!(topic("orders/placed").is_err());
        assert!(header("trace", "x").is_ok());
        assert!(header(MESSAGE_ID, "x").is_err());
    }
}
