//! The sweep's runs: one throughput run or memory measurement at a time, on a fresh queue or
//! stream and database, with its checks.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::database::Target;
use crate::kafka::Kafka;
use crate::memory::Held;
use crate::nats::Nats;
use crate::options::Options;
use crate::rabbitmq::Rabbit;
use crate::report::rate;
use crate::run::{Broker, Tally, Timing, Variant, message_ids};
use crate::sqs::Sqs;

pub(crate) struct Bench {
    pub(crate) options: Options,
    pub(crate) target: Target,
    pub(crate) connections: u32,
    pub(crate) rabbit: Option<Rabbit>,
    pub(crate) nats: Option<Nats>,
    pub(crate) kafka: Option<Kafka>,
    pub(crate) sqs: Option<Sqs>,
    pub(crate) runs: usize,
    pub(crate) failures: Vec<String>,
}

impl Bench {
    /// One throughput run: a fresh queue or stream and database, the consumer, the checks.
    pub(crate) async fn run(
        &mut self,
        broker: Broker,
        variant: Variant,
        prefetch: u16,
    ) -> Option<Timing> {
        self.runs += 1;
        let run = self.runs;
        let label = format!("{broker} {variant}, prefetch {prefetch}");
        // A safety net beyond the consumer's own limit (`measure`): publishing or a check
        // that hangs ends the run as a failure, not the bench.
        let limit =
            Duration::from_secs(180) + Duration::from_millis(30) * self.options.messages as u32;
        let outcome = tokio::time::timeout(limit, self.measure(run, broker, variant, prefetch))
            .await
            .unwrap_or_else(|_| Err(format!("not done after {} s", limit.as_secs())));
        match outcome {
            Ok(timing) => {
                eprintln!(
                    "  {label}: {:.0} msgs/s ({:.2} s; stopped {} ms after the last answer)",
                    rate(self.options.messages, timing),
                    timing.consuming.as_secs_f64(),
                    timing.stopping.as_millis()
                );
                Some(timing)
            }
            Err(e) => {
                eprintln!("  {label}: FAILED: {e}");
                self.failures.push(format!("{label}: {e}"));
                None
            }
        }
    }

    async fn measure(
        &self,
        run: usize,
        broker: Broker,
        variant: Variant,
        prefetch: u16,
    ) -> Result<Timing, String> {
        let n = self.options.messages;
        let ids = message_ids(run, n);
        let connections = self.connections.min(u32::from(prefetch));
        let database = self.target.fresh(run, connections).await?;
        let tally = Tally::new(n);
        // Generous: the slowest cell (prefetch 1) runs at a few hundred messages per second.
        let limit = Duration::from_secs(60) + Duration::from_millis(20) * n as u32;
        let (timing, left) = match broker {
            Broker::RabbitMq => {
                let rabbit = self.rabbit.as_ref().expect("connected");
                let queue = rabbit.prepare(run, &ids).await?;
                let consumed = tokio::time::timeout(
                    limit,
                    rabbit.consume(&queue, variant, prefetch, &database, &tally),
                )
                .await
                .unwrap_or_else(|_| Err(format!("not done after {} s", limit.as_secs())));
                let left = rabbit.left(&queue).await;
                rabbit.delete(&queue).await;
                (consumed, left)
            }
            Broker::Nats => {
                let nats = self.nats.as_ref().expect("connected");
                let stream = nats.prepare(run, &ids).await?;
                let consumed = tokio::time::timeout(
                    limit,
                    nats.consume(&stream, variant, usize::from(prefetch), &database, &tally),
                )
                .await
                .unwrap_or_else(|_| Err(format!("not done after {} s", limit.as_secs())));
                let left = nats.left(&stream).await;
                nats.delete(&stream).await;
                (consumed, left)
            }
            Broker::Kafka => {
                let kafka = self.kafka.as_ref().expect("connected");
                let topic = kafka.prepare(run, &ids).await?;
                let consumed = tokio::time::timeout(
                    limit,
                    kafka.consume(&topic, variant, usize::from(prefetch), &database, &tally),
                )
                .await
                .unwrap_or_else(|_| Err(format!("not done after {} s", limit.as_secs())));
                let left = kafka.left(&topic).await;
                kafka.delete(&topic).await;
                (consumed, left)
            }
            Broker::Sqs => {
                let sqs = self.sqs.as_ref().expect("connected");
                let queue = sqs.prepare(run, &ids).await?;
                let consumed = tokio::time::timeout(
                    limit,
                    sqs.consume(&queue, variant, usize::from(prefetch), &database, &tally),
                )
                .await
                .unwrap_or_else(|_| Err(format!("not done after {} s", limit.as_secs())));
                let left = sqs.left(&queue).await;
                sqs.delete(&queue).await;
                (consumed, left)
            }
        };
        let timing = timing?;
        let left = left?;
        let (rows, distinct) = database.effects().await?;
        database.discard();
        let (duplicates, failed) = (
            tally.duplicates.load(Ordering::Relaxed),
            tally.failed.load(Ordering::Relaxed),
        );
        if left != 0 || rows != n as i64 || distinct != n as i64 {
            return Err(format!(
                "{n} messages: {rows} effect rows for {distinct} messages, {left} left \
                 unacknowledged on the broker ({duplicates} duplicates, {failed} failures)"
            ));
        }
        if duplicates != 0 || failed != 0 {
            eprintln!(
                "  (every message applied once; {duplicates} duplicates, {failed} failures on the way)"
            );
        }
        Ok(timing)
    }

    pub(crate) async fn memory(&mut self, broker: Broker, variant: Variant) -> Option<Held> {
        self.runs += 1;
        let run = self.runs;
        let k = self.options.in_flight;
        let held = match broker {
            Broker::RabbitMq => {
                let rabbit = self.rabbit.as_ref().expect("connected");
                rabbit.memory(run, variant, k).await
            }
            Broker::Nats => {
                let nats = self.nats.as_ref().expect("connected");
                nats.memory(run, variant, usize::from(k)).await
            }
            // Not measured: throughput only.
            Broker::Kafka | Broker::Sqs => return None,
        };
        match held {
            Ok(held) => {
                eprintln!(
                    "  {broker} {variant}, {k} in flight: {:.0} bytes, {:.1} allocations per delivery",
                    held.bytes, held.blocks
                );
                Some(held)
            }
            Err(e) => {
                eprintln!("  {broker} {variant}, {k} in flight: FAILED: {e}");
                self.failures
                    .push(format!("memory, {broker} {variant}: {e}"));
                None
            }
        }
    }
}
