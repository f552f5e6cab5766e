//! The queue the pump is made for, declared ([`Topology`]): a quorum queue that counts
//! deliveries (`x-delivery-count`) and bounds them (`x-delivery-limit`), and dead-letters
//! at least once to a dead-letter queue of its own.
//!
//! ```no_run
//! use inbox_lapin::{Pump, Topology};
//!
//! # async fn run(channel: &lapin::Channel) -> Result<(), lapin::Error> {
//! let pump = Pump::new();
//! // `credits`, at most 20 deliveries of a message, then to `credits.dead`.
//! let topology = Topology::new("credits").delivery_limit(20);
//! topology.declare(channel, &pump).await?;
//! let consumer = pump.subscribe(channel, topology.queue(), "credit-service").await?;
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use inbox_diesel::pump;
use inbox_diesel::{Retention, broker};
use lapin::Channel;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};

use crate::Pump;

/// A quorum queue and its dead-letter queue, as [`Topology::declare`] declares them.
#[derive(Debug, Clone)]
pub struct Topology {
    queue: String,
    dead_letter_queue: String,
    delivery_limit: u32,
}

impl Topology {
    /// The queue `queue`, at most 20 deliveries of a message (RabbitMQ 4's default), dead
    /// letters to `<queue>.dead`.
    pub fn new(queue: impl Into<String>) -> Self {
        let queue = queue.into();
        Self {
            dead_letter_queue: format!("{queue}.dead"),
            queue,
            delivery_limit: 20,
        }
    }

    /// How many times a message is delivered at most (`x-delivery-limit`) before it is
    /// dead-lettered. At least 1.
    pub fn delivery_limit(self, delivery_limit: u32) -> Self {
        Self {
            delivery_limit: delivery_limit.max(1),
            ..self
        }
    }

    /// Where dead letters go, instead of `<queue>.dead`.
    pub fn dead_letter_queue(self, name: impl Into<String>) -> Self {
        Self {
            dead_letter_queue: name.into(),
            ..self
        }
    }

    /// The queue's name.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The dead-letter queue's name.
    pub fn dead(&self) -> &str {
        &self.dead_letter_queue
    }

    /// The arguments the queue is declared with: `x-queue-type` `quorum`,
    /// `x-delivery-limit`, dead letters through the default exchange to the dead-letter
    /// queue (`x-dead-letter-exchange` `""`, `x-dead-letter-routing-key`), at least once
    /// (`x-dead-letter-strategy` `at-least-once`, which takes `x-overflow`
    /// `reject-publish`: a full queue refuses publishes rather than drop its oldest). Add
    /// to them (an `x-message-ttl`) and declare the queue yourself where you need more.
    pub fn arguments(&self) -> FieldTable {
        let mut arguments = FieldTable::default();
        let text = |value: &str| AMQPValue::LongString(value.into());
        arguments.insert("x-queue-type".into(), text("quorum"));
        arguments.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongInt(i32::try_from(self.delivery_limit).unwrap_or(i32::MAX)),
        );
        arguments.insert("x-dead-letter-exchange".into(), text(""));
        arguments.insert(
            "x-dead-letter-routing-key".into(),
            text(&self.dead_letter_queue),
        );
        arguments.insert("x-dead-letter-strategy".into(), text("at-least-once"));
        arguments.insert("x-overflow".into(), text("reject-publish"));
        arguments
    }

    /// Declares the dead-letter queue (a durable quorum queue) and the queue (durable,
    /// [`arguments`](Self::arguments)); both are left as they are if they exist with the
    /// same arguments. Warns (a `tracing` warning, and on standard error without a
    /// subscriber) when the pump would dead-letter live messages in a database outage
    /// shorter than [`OUTAGE_TO_RIDE_OUT`](inbox_diesel::pump::OUTAGE_TO_RIDE_OUT)
    /// ([`outage_tolerance`](Self::outage_tolerance)).
    ///
    /// # Errors
    /// The broker's refusal: a queue of that name exists with other arguments
    /// (`PRECONDITION_FAILED`, which closes the channel), or a closed channel.
    pub async fn declare(&self, channel: &Channel, pump: &Pump) -> lapin::Result<()> {
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        let mut quorum = FieldTable::default();
        quorum.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        channel
            .queue_declare(self.dead_letter_queue.as_str().into(), durable, quorum)
            .await?;
        channel
            .queue_declare(self.queue.as_str().into(), durable, self.arguments())
            .await?;
        pump::warn_short_tolerance(
            &format!("the queue {}", self.queue),
            &pump.redelivery,
            self.delivery_limit,
        );
        Ok(())
    }

    /// The longest database outage a message outlives before its delivery limit is spent,
    /// at worst, under `pump`'s redelivery delays ([`pump::outage_tolerance`]).
    pub fn outage_tolerance(&self, pump: &Pump) -> Duration {
        pump::outage_tolerance(&pump.redelivery, self.delivery_limit)
    }

    /// How long the inbox must keep a marker for this queue's redeliveries, with RabbitMQ's
    /// `consumer_timeout` (30 minutes by default): add the queue's message TTL and a replay
    /// margin ([`Retention`]).
    pub fn retention(&self, consumer_timeout: Duration) -> Retention {
        broker::rabbitmq_quorum_retention(consumer_timeout, self.delivery_limit)
    }
}

#[cfg(test)]
mod tests {
    use inbox_diesel::pump::OUTAGE_TO_RIDE_OUT;

    use super::*;

    #[test]
    fn the_outage_tolerance_is_the_delays_before_the_last_delivery() {
        use inbox_diesel::Redelivery;
        let pump = Pump::new().redelivery(Redelivery::exponential(
            Duration::from_secs(1),
            Duration::from_secs(60),
        ));
        // 1 + 2 + 4 + 8 s before deliveries 2 to 5.
        assert_eq!(
            Topology::new("q").delivery_limit(5).outage_tolerance(&pump),
            Duration::from_secs(15)
        );
        // RabbitMQ 4's 20 with Redelivery::DEFAULT: 1 + 2 + … + 256 s, then 300 s each.
        let default = Topology::new("q").outage_tolerance(&Pump::new());
        assert_eq!(default, Duration::from_secs(511 + 10 * 300));
        assert!(default >= OUTAGE_TO_RIDE_OUT);
        assert!(
            Topology::new("q")
                .delivery_limit(10)
                .outage_tolerance(&Pump::new())
                < OUTAGE_TO_RIDE_OUT
        );
        assert_eq!(Topology::new("q").dead(), "q.dead");
    }
}
