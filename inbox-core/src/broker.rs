//! Each broker's message id as a [`MessageKey`], and its redelivery settings as a
//! [`Retention`]: what a consumer reads off a delivery to deduplicate it, and how long the
//! marker must then be kept.
//!
//! | broker | key | when it is missing |
//! |---|---|---|
//! | RabbitMQ (AMQP 0-9-1) | the `message_id` property, set by the publisher ([`amqp`]) | refused: [`KeyError::Missing`], dead-lettered |
//! | NATS JetStream | the `Nats-Msg-Id` header (the publisher's deduplication id), else the stream and its stream sequence ([`jetstream`]) | never: a stream numbers every message |
//! | Kafka | the `message-id` header when the producer set one, else topic, partition, offset ([`kafka`]) | never: every record has a position |
//! | Amazon SQS | the sender's `message-id` attribute, else `MessageId` ([`sqs`]) | refused |
//! | Azure Service Bus | `MessageId` ([`service_bus`]) | refused |
//! | CloudEvents | `source` and `id` ([`MessageKey::cloud_event`]) | refused: [`KeyError::Empty`] |
//!
//! A key the consumer makes up (a fresh UUID when the id is missing) is a new key on every
//! redelivery, and deduplicates nothing: a missing id is refused, so that the message is
//! dead-lettered and its publisher fixed. Where the broker assigns the id on each send (SQS's
//! `MessageId`, a stream sequence), a publisher that retries a send publishes a second
//! message with a new id: key such messages on an id the publisher sets (`Nats-Msg-Id`, an AMQP
//! `message_id`, a business id in the body).
//!
//! **A business id in the body.** A consumer may key on an id of its own — an order number
//! the publisher puts in the body — rather than the broker's: that is the way where the
//! broker's id is assigned per send (above), and the handler reads the body anyway. A key
//! is its text, wherever it was read: `MessageKey::text("7")` from a body is the same key as
//! an AMQP `message_id` of `"7"`. A consumer that keys some messages by the broker's id and
//! others by a body id, or that takes body ids of two kinds (order 7, invoice 7), scopes
//! each kind ([`MessageKey::scoped`]) so that their texts cannot meet; and it reads the id
//! before the handler's transaction, refusing a body without one ([`KeyError`], which the
//! pumps dead-letter) rather than falling back to the broker's id — a redelivery would then
//! be keyed the same way, but a publisher's retry would not.
//!
//! ```
//! use std::time::Duration;
//! use inbox_core::{KeyError, MessageKey, broker};
//!
//! // The same text is the same key, whether a broker or a body carried it; scoped, not.
//! assert_eq!(broker::amqp(Some("7"))?, MessageKey::text("7")?);
//! let order = MessageKey::text("7")?.scoped("order")?;
//! assert_ne!(order, MessageKey::text("7")?);
//! assert_ne!(order, MessageKey::text("7")?.scoped("invoice")?);
//!
//! assert_eq!(broker::amqp(Some("order-7"))?, MessageKey::text("order-7")?);
//! assert!(matches!(broker::amqp(None), Err(KeyError::Missing { .. })));
//!
//! // JetStream: the publisher's id when it set one, else the stream's numbering and the time
//! // the stream stored the message (a stream created again under its name numbers anew).
//! let stored = 1_764_000_000_000_000_000;
//! assert_eq!(broker::jetstream(Some("order-7"), "ORDERS", 42, stored)?, MessageKey::text("order-7")?);
//! assert_ne!(broker::jetstream(None, "ORDERS", 42, stored)?, broker::jetstream(None, "ORDERS", 42, stored + 1)?);
//!
//! // How long markers must be kept: ack_wait 30 s, max_deliver 5, and a week for replays.
//! let retention = broker::jetstream_retention(Duration::from_secs(30), 5)
//!     .replay_margin(Duration::from_secs(7 * 86_400));
//! assert_eq!(retention.keep_for(), Duration::from_secs(7 * 86_400 + 150));
//! # Ok::<(), KeyError>(())
//! ```

use std::time::Duration;

use crate::{KeyError, MessageKey, Retention};

/// An AMQP 0-9-1 message's key (RabbitMQ): its `message_id` property, as text.
///
/// # Errors
/// [`KeyError::Missing`] when the publisher left `message_id` unset or empty;
/// [`KeyError::TooLong`] past [`MessageKey::MAX_LEN`].
pub fn amqp(message_id: Option<&str>) -> Result<MessageKey, KeyError> {
    required(message_id, "AMQP message_id")
}

/// A NATS JetStream message's key: the `Nats-Msg-Id` header when the publisher set one
/// (JetStream itself deduplicates by it within the stream's duplicate window; this keeps
/// deduplicating after the window), else the stream's name, the message's stream sequence
/// and the time the stream stored it (`published`, nanoseconds since the Unix epoch) — a
/// composite key ([`MessageKey::composite`]). A stream deleted and created again under its
/// name numbers from 1 again; the time tells its messages from the old stream's, whose
/// markers they would otherwise have met and been answered `Duplicate` by (acknowledged,
/// never applied).
///
/// # Errors
/// [`KeyError::Empty`] for an empty stream name; [`KeyError::TooLong`] past
/// [`MessageKey::MAX_LEN`].
pub fn jetstream(
    msg_id: Option<&str>,
    stream: &str,
    stream_sequence: u64,
    published_unix_nanos: i128,
) -> Result<MessageKey, KeyError> {
    use crate::ToMessageKey;
    match msg_id {
        Some(id) if !id.is_empty() => MessageKey::text(id),
        _ => (stream, stream_sequence, published_unix_nanos).to_message_key(),
    }
}

/// A Kafka record's key: the `message-id` header when the producer set one, not empty (the
/// outbox's Kafka sink sets it to the outbox id), else the record's position — topic, partition and
/// offset ([`MessageKey::kafka`]).
///
/// A position names a record, not a message. A producer that retries a send without
/// Kafka's idempotent producer (`enable.idempotence`) may write one message at two offsets,
/// and each copy is then applied: key such messages by a header the producer sets, or
/// enable idempotence (the broker then drops the retry of a send it already wrote). A topic
/// deleted and created again under its name numbers its partitions from 0 again, and its
/// records meet the old topic's markers (answered `Duplicate`, never applied): purge those
/// markers when a topic is recreated, or key by header.
///
/// # Errors
/// [`KeyError::Empty`] for an empty topic; [`KeyError::TooLong`] past
/// [`MessageKey::MAX_LEN`].
pub fn kafka(
    message_id: Option<&str>,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<MessageKey, KeyError> {
    match message_id {
        Some(id) if !id.is_empty() => MessageKey::text(id),
        _ => MessageKey::kafka(topic, partition, offset),
    }
}

/// An Amazon SQS message's key: its `MessageId`. SQS assigns it on each `SendMessage`, so a
/// publisher's retried send is another message: key on an id the publisher puts in an
/// attribute (`inbox-sqs` reads `message-id`) or the body. Not on a FIFO queue's
/// `MessageDeduplicationId`: SQS honours it for five minutes, and content-based
/// deduplication derives it from the body (two orders with one body would share it).
///
/// # Errors
/// [`KeyError::Missing`] for an empty id; [`KeyError::TooLong`] past [`MessageKey::MAX_LEN`].
pub fn sqs(message_id: &str) -> Result<MessageKey, KeyError> {
    required(Some(message_id), "SQS MessageId")
}

/// An Azure Service Bus message's key: its `MessageId`, which the sender sets (and which
/// duplicate detection, where enabled, also uses).
///
/// # Errors
/// [`KeyError::Missing`] for an empty id; [`KeyError::TooLong`] past [`MessageKey::MAX_LEN`].
pub fn service_bus(message_id: &str) -> Result<MessageKey, KeyError> {
    required(Some(message_id), "Service Bus MessageId")
}

fn required(id: Option<&str>, field: &'static str) -> Result<MessageKey, KeyError> {
    match id {
        Some(id) if !id.is_empty() => MessageKey::text(id),
        _ => Err(KeyError::Missing { field }),
    }
}

/// A RabbitMQ quorum queue's redelivery window: a delivery unacknowledged for
/// `consumer_timeout` (30 minutes by default) is returned to the queue, at most
/// `delivery_limit` times (`x-delivery-limit`; 20 by default since RabbitMQ 4.0). Add the
/// queue's `x-message-ttl` ([`Retention::message_ttl`]) and a replay margin.
pub const fn rabbitmq_quorum_retention(
    consumer_timeout: Duration,
    delivery_limit: u32,
) -> Retention {
    Retention::redeliveries(consumer_timeout, delivery_limit)
}

/// A JetStream consumer's redelivery window: `ack_wait` × `max_deliver`. `max_deliver` of
/// -1 (or 0) is JetStream's "unlimited": the window has no end, and the retention is the
/// longest there is (the purge then removes nothing) — set `max_deliver`.
pub const fn jetstream_retention(ack_wait: Duration, max_deliver: i64) -> Retention {
    let deliveries = match max_deliver {
        n if n <= 0 => u32::MAX,
        n if n > u32::MAX as i64 => u32::MAX,
        n => n as u32,
    };
    Retention::redeliveries(ack_wait, deliveries)
}

/// An SQS queue's redelivery window: the visibility timeout × `maxReceiveCount` of the
/// redrive policy. Add the queue's retention period as the message TTL.
pub const fn sqs_retention(visibility_timeout: Duration, max_receive_count: u32) -> Retention {
    Retention::redeliveries(visibility_timeout, max_receive_count)
}

/// An Azure Service Bus queue's redelivery window: the lock duration × `MaxDeliveryCount`.
pub const fn service_bus_retention(lock_duration: Duration, max_delivery_count: u32) -> Retention {
    Retention::redeliveries(lock_duration, max_delivery_count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_ids_are_refused_never_made_up() {
        for missing in [amqp(None), amqp(Some("")), sqs(""), service_bus("")] {
            assert!(
                matches!(missing, Err(KeyError::Missing { .. })),
                "{missing:?}"
            );
        }
        let message = KeyError::Missing {
            field: "AMQP message_id",
        }
        .to_string();
        assert!(message.contains("publisher must set it"), "{message}");
    }

    #[test]
    fn jetstream_keys_are_tagged_apart_from_text() {
        const AT: i128 = 1_764_000_000_000_000_000;
        let by_sequence = jetstream(None, "ORDERS", 42, AT).unwrap();
        assert_eq!(jetstream(Some(""), "ORDERS", 42, AT).unwrap(), by_sequence);
        assert_ne!(by_sequence, MessageKey::text("ORDERS:42").unwrap());
        assert_ne!(by_sequence, MessageKey::sequence("ORDERS", 42).unwrap());
        assert_ne!(by_sequence, jetstream(None, "ORDERS", 43, AT).unwrap());
        assert_ne!(by_sequence, jetstream(None, "ORDERS2", 42, AT).unwrap());
        // The same name and number in a stream created again: another message.
        assert_ne!(by_sequence, jetstream(None, "ORDERS", 42, AT + 1).unwrap());
    }

    #[test]
    fn kafka_keys_are_the_header_else_the_position() {
        let by_position = kafka(None, "payments", 3, 1_204).unwrap();
        assert_eq!(
            by_position,
            MessageKey::kafka("payments", 3, 1_204).unwrap()
        );
        assert_eq!(kafka(Some(""), "payments", 3, 1_204).unwrap(), by_position);
        assert_ne!(by_position, kafka(None, "payments", 3, 1_205).unwrap());
        // The header wins wherever the record sits: a copy at another offset is the same.
        let by_header = kafka(Some("order-7"), "payments", 3, 1_204).unwrap();
        assert_eq!(by_header, kafka(Some("order-7"), "payments", 0, 9).unwrap());
        assert_eq!(by_header, MessageKey::text("order-7").unwrap());
        assert_eq!(kafka(None, "", 0, 0), Err(KeyError::Empty));
    }

    #[test]
    fn unlimited_redeliveries_keep_markers_for_ever() {
        let unlimited = jetstream_retention(Duration::from_secs(30), -1);
        assert_eq!(unlimited.keep_for(), Duration::from_secs(30) * u32::MAX);
        assert_eq!(
            rabbitmq_quorum_retention(Duration::from_secs(1800), 20).keep_for(),
            Duration::from_secs(36_000)
        );
        assert_eq!(
            sqs_retention(Duration::from_secs(30), 5).keep_for(),
            Duration::from_secs(150)
        );
    }
}
