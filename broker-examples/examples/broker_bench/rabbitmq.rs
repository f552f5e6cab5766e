//! RabbitMQ: a quorum queue per run, the direct consumer and the pump on it, timed, and the
//! memory they hold per delivery.

use std::time::Instant;

use futures_util::StreamExt;
use inbox_broker_examples::brokers::connect_rabbitmq;
use inbox_broker_examples::store::Failure;
use inbox_diesel::{Outcome, broker};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};

use crate::database::Database;
use crate::memory::{Gate, Held, SETTLE, allocated};
use crate::run::{PAYLOAD, RunError, Tally, Timing, Variant, message_ids, timing};

pub(crate) struct Rabbit {
    url: String,
    /// Declares, publishes, checks and deletes: never the measured consumer's connection.
    admin: Connection,
    channel: Channel,
}

impl Rabbit {
    pub(crate) async fn connect(url: String) -> Result<Self, String> {
        let admin = connect_rabbitmq(&url).await?;
        let channel = admin
            .create_channel()
            .await
            .map_err(|e| format!("open a channel: {e}"))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| format!("publisher confirms: {e}"))?;
        Ok(Self {
            url,
            admin,
            channel,
        })
    }

    /// A quorum queue of its own for run `run`, holding `ids`, each confirmed by the broker.
    pub(crate) async fn prepare(&self, run: usize, ids: &[String]) -> Result<String, String> {
        let queue = format!("inbox-broker-bench-{}-{run}", std::process::id());
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        // A queue a run abandons (the bench interrupted) goes after 10 minutes unused.
        arguments.insert("x-expires".into(), AMQPValue::LongInt(600_000));
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        self.channel
            .queue_declare(queue.as_str().into(), durable, arguments)
            .await
            .map_err(|e| format!("declare the queue {queue}: {e}"))?;
        let mut confirms = Vec::with_capacity(ids.len());
        for id in ids {
            confirms.push(
                self.channel
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        BasicPublishOptions::default(),
                        &PAYLOAD,
                        BasicProperties::default()
                            .with_message_id(id.as_str().into())
                            .with_delivery_mode(2),
                    )
                    .await
                    .map_err(|e| format!("publish {id}: {e}"))?,
            );
        }
        for confirm in confirms {
            let confirmation = confirm.await.map_err(|e| format!("publish: {e}"))?;
            if !confirmation.is_ack() {
                return Err(format!("the broker refused a message: {confirmation:?}"));
            }
        }
        Ok(queue)
    }

    /// Messages in `queue` not acknowledged: once the consumer's channel is closed, the
    /// broker has put back what it had delivered and not been acknowledged.
    pub(crate) async fn left(&self, queue: &str) -> Result<u64, String> {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        self.channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .map(|queue| u64::from(queue.message_count()))
            .map_err(|e| format!("ask for the length of {queue}: {e}"))
    }

    pub(crate) async fn delete(&self, queue: &str) {
        if let Err(e) = self
            .channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
        {
            eprintln!("delete the queue {queue}: {e}");
        }
    }

    pub(crate) async fn close(self) {
        let _ = self.admin.close(200, "done".into()).await;
    }

    /// One throughput run of `variant` on `queue`.
    pub(crate) async fn consume(
        &self,
        queue: &str,
        variant: Variant,
        prefetch: u16,
        database: &Database,
        tally: &Tally,
    ) -> Result<Timing, RunError> {
        let connection = connect_rabbitmq(&self.url).await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| format!("open a channel: {e}"))?;
        let start = Instant::now();
        match variant {
            Variant::Direct => {
                channel
                    .basic_qos(prefetch, BasicQosOptions::default())
                    .await
                    .map_err(|e| format!("basic.qos: {e}"))?;
                let consumer = channel
                    .basic_consume(
                        queue.into(),
                        "bench-direct".into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|e| format!("consume {queue}: {e}"))?;
                consumer
                    .take_until(tally.finished())
                    .for_each_concurrent(usize::from(prefetch), |delivery| async move {
                        let Ok(delivery) = delivery else {
                            return;
                        };
                        let id = delivery.properties.message_id().as_ref();
                        let id = id.map(|id| id.as_str());
                        let answer = tally
                            .handle(database, broker::amqp(id), id.unwrap_or_default())
                            .await;
                        let settled = match answer {
                            Ok(_) => delivery.acker.ack(BasicAckOptions::default()).await,
                            Err(_) => {
                                let requeue = BasicNackOptions {
                                    requeue: true,
                                    ..BasicNackOptions::default()
                                };
                                delivery.acker.nack(requeue).await
                            }
                        };
                        if let Err(e) = settled {
                            eprintln!("  settling a delivery failed: {e}");
                        }
                    })
                    .await;
            }
            Variant::Pump => {
                let pump = inbox_lapin::Pump::new().prefetch(prefetch);
                let consumer = pump
                    .subscribe(&channel, queue, "bench-pump")
                    .await
                    .map_err(|e| format!("consume {queue}: {e}"))?;
                pump.run(
                    &channel,
                    consumer,
                    tally.finished(),
                    |delivery| async move {
                        let id = delivery.properties.message_id().as_ref();
                        let id = id.map_or("", |id| id.as_str());
                        tally
                            .handle(database, inbox_lapin::key(&delivery), id)
                            .await
                    },
                )
                .await
                .map_err(|stopped| stopped.to_string())?;
            }
            Variant::DirectConfirmed => {
                unreachable!("RabbitMQ's acknowledgements are not confirmed")
            }
        }
        let stopped = Instant::now();
        let _ = channel.close(200, "done".into()).await;
        let _ = connection.close(200, "done".into()).await;
        timing(start, tally, stopped)
    }

    /// The allocated bytes per delivery held in flight by `variant`, `in_flight` at once.
    pub(crate) async fn memory(
        &self,
        run: usize,
        variant: Variant,
        in_flight: u16,
    ) -> Result<Held, String> {
        let ids = message_ids(run, usize::from(in_flight));
        let queue = self.prepare(run, &ids).await?;
        let connection = connect_rabbitmq(&self.url).await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| format!("open a channel: {e}"))?;
        let gate = Gate::new(usize::from(in_flight));
        let gate = &gate;
        tokio::time::sleep(SETTLE).await;
        let before = allocated();
        let consume = async {
            match variant {
                Variant::Pump => {
                    // The full window from the start: the gate answers no handler until
                    // every delivery is in hand, and a narrow start would take one and wait
                    // for its answer.
                    let pump = inbox_lapin::Pump::new()
                        .prefetch(in_flight)
                        .slow_start(false);
                    let consumer = pump
                        .subscribe(&channel, &queue, "bench-pump")
                        .await
                        .map_err(|e| format!("consume {queue}: {e}"))?;
                    pump.run(&channel, consumer, gate.all_done(), |delivery| async move {
                        gate.hold(&delivery.data).await;
                        Ok::<_, Failure>(Outcome::Processed(()))
                    })
                    .await
                    .map_err(|stopped| stopped.to_string())?;
                }
                _ => {
                    channel
                        .basic_qos(in_flight, BasicQosOptions::default())
                        .await
                        .map_err(|e| format!("basic.qos: {e}"))?;
                    let consumer = channel
                        .basic_consume(
                            queue.as_str().into(),
                            "bench-direct".into(),
                            BasicConsumeOptions::default(),
                            FieldTable::default(),
                        )
                        .await
                        .map_err(|e| format!("consume {queue}: {e}"))?;
                    consumer
                        .take_until(gate.all_done())
                        .for_each_concurrent(usize::from(in_flight), |delivery| async move {
                            let Ok(delivery) = delivery else {
                                return;
                            };
                            gate.hold(&delivery.data).await;
                            let _ = delivery.acker.ack(BasicAckOptions::default()).await;
                        })
                        .await;
                }
            }
            Ok::<(), String>(())
        };
        let (consumed, held) = tokio::join!(consume, gate.measure());
        consumed?;
        let _ = channel.close(200, "done".into()).await;
        let _ = connection.close(200, "done".into()).await;
        let left = self.left(&queue).await?;
        self.delete(&queue).await;
        if left != 0 {
            return Err(format!("{left} messages were left unacknowledged"));
        }
        Ok(Held::between(before, held, in_flight))
    }
}
