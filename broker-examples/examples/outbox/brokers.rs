//! Service A's RabbitMQ queue and service B's JetStream stream, as this example names and
//! configures them, and what the orchestrator publishes to A.

use lapin::Channel;

pub use inbox_broker_examples::brokers::{Kafka, Queues, Stream, connect_nats, connect_rabbitmq};

use crate::{ABANDONED_AFTER, COPIES, DUPLICATE_WINDOW, IN_HAND, PUMP};

/// Service A's quorum queue — redeliveries bounded — and its dead-letter queue, named for
/// this process.
pub async fn declare_queues(channel: &Channel) -> Result<Queues, String> {
    let name = format!("inbox-broker-example-outbox-{}", std::process::id());
    Queues::declare(channel, name).await
}

/// Service B's stream, named for this process, and the durable pull consumer B's processes
/// share.
pub async fn create_stream(jetstream: &async_nats::jetstream::Context) -> Result<Stream, String> {
    let name = format!("inbox-broker-example-outbox-{}", std::process::id());
    // The two running consumers' messages in hand, and the killed one's until JetStream
    // takes them back.
    let consumer = |durable: &str| PUMP.max_ack_pending(3 * IN_HAND).consumer_config(durable);
    Stream::create(jetstream, name, DUPLICATE_WINDOW, ABANDONED_AFTER, consumer).await
}

/// Each message `COPIES` times with the same `message_id` to service A's queue, each copy
/// confirmed.
pub async fn publish(queues: &Queues, channel: &Channel, ids: &[String]) -> Result<u64, String> {
    let mut published = 0;
    for id in ids {
        for _ in 0..COPIES {
            queues.publish_one(channel, id).await?;
            published += 1;
        }
    }
    Ok(published)
}

/// The subject A's handler publishes to, on service B's stream `name` (with `--downstream
/// kafka`, the topic).
pub fn subject(name: &str) -> String {
    format!("{name}.effects")
}
