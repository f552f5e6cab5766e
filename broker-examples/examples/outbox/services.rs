//! The services' processes: service A's consumer, the relay, service B's consumer — this
//! binary started again as `outbox serve …`, each printing its events for the orchestrator.

use std::time::Duration;

use async_nats::jetstream::Message;
use inbox_broker_examples::events::{Event, reported};
use inbox_broker_examples::fleet;
use inbox_broker_examples::store::{Database, Failure, Publish};
use inbox_diesel::Redelivery;
use inbox_diesel::outbox::relay::{Outgoing, Relay, Sink, SinkError};
use inbox_nats::outbox::OutboxSink;

use crate::brokers::{connect_nats, connect_rabbitmq, subject};
use crate::{
    Downstream, IN_HAND, KAFKA_PUMP, KAFKA_SESSION, OUTBOX, PAUSE, PREFETCH, PUMP, RELAY_BATCH,
    RELAY_LEASE, SEND_PAUSE,
};
use inbox_broker_examples::{amqp_url, nats_url};

/// What every process is given: where B consumes, the queue, the stream and its consumer (or
/// the topic's base name and the Kafka brokers), the databases.
pub struct Places<'a> {
    pub downstream: Downstream,
    pub queue: &'a str,
    pub stream: &'a str,
    pub durable: &'a str,
    pub a: &'a str,
    pub b: &'a str,
}

/// A process: what its name says — `a…` service A, `r…` a relay, `b…` service B.
pub async fn serve(places: &Places<'_>, name: &str) -> Result<(), String> {
    match name.as_bytes().first() {
        Some(b'a') => service_a(places, name).await,
        Some(b'r') => match places.downstream {
            Downstream::Nats => {
                let jetstream = connect_nats(&nats_url()).await?;
                relay(places, name, OutboxSink::new(jetstream)).await
            }
            Downstream::Kafka => {
                let producer = inbox_kafka::producer_config(places.durable)
                    .create()
                    .map_err(|e| format!("a producer for {}: {e}", places.durable))?;
                relay(places, name, inbox_kafka::outbox::OutboxSink::new(producer)).await
            }
        },
        Some(b'b') if places.downstream == Downstream::Kafka => service_b_kafka(places, name).await,
        Some(b'b') => service_b(places, name).await,
        _ => Err(format!("no service for the name {name}")),
    }
}

/// Service A: the RabbitMQ pump, the `#[idempotent]` handler writing the effect and the
/// outbox row, an event line per delivery and per answer, until standard input closes.
async fn service_a(places: &Places<'_>, name: &str) -> Result<(), String> {
    let database = Database::connect(places.a, u32::from(PREFETCH)).await?;
    let subject = subject(places.stream);
    let connection = connect_rabbitmq(&amqp_url()).await?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| format!("open a channel: {e}"))?;
    // A busy database: requeued after 100 ms, then 200 ms, … at most 2 s.
    let pump = inbox_lapin::Pump::new()
        .prefetch(PREFETCH)
        .redelivery(Redelivery::exponential(
            Duration::from_millis(100),
            Duration::from_secs(2),
        ));
    let consumer = pump
        .subscribe(&channel, places.queue, name)
        .await
        .map_err(|e| format!("consume {}: {e}", places.queue))?;
    Event::Ready.emit();
    let (database, subject) = (&database, subject.as_str());
    let report = pump
        .run(
            &channel,
            consumer,
            fleet::until_stdin_closes(),
            |delivery| async move {
                let id = delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |id| id.as_str().to_owned());
                reported(
                    &id,
                    delivery.redelivered,
                    inbox_lapin::delivery_count(&delivery),
                    name,
                    async {
                        match inbox_lapin::key(&delivery) {
                            Ok(key) => {
                                database
                                    .apply_and_publish(
                                        &key,
                                        &id,
                                        name,
                                        PAUSE,
                                        Publish {
                                            outbox: &OUTBOX,
                                            destination: subject,
                                            ordering_key: "",
                                        },
                                    )
                                    .await
                            }
                            Err(missing) => {
                                Err(Failure::from(inbox_diesel::Error::InvalidKey(missing)))
                            }
                        }
                    },
                )
                .await
            },
        )
        .await
        .map_err(|stopped| stopped.to_string())?;
    Event::Stopped {
        report: format!("{report:?}"),
    }
    .emit();
    let _ = connection.close(200, "stopped".into()).await;
    Ok(())
}

/// The relay's sink, announced: each message the broker confirmed is printed as
/// [`Event::Sent`] (by its payload, the id of the message A applied), then the relay waits
/// [`SEND_PAUSE`] before it marks the row — the moment a kill leaves a message sent and not
/// marked.
struct Announced<'a, S> {
    sink: S,
    relay: &'a str,
}

impl<S: Sink + Send> Sink for Announced<'_, S> {
    async fn send(&mut self, message: &Outgoing) -> Result<(), SinkError> {
        let sent = self.sink.send(message).await;
        let id = String::from_utf8_lossy(&message.payload).into_owned();
        match &sent {
            Ok(()) => {
                Event::Sent { id }.emit();
                tokio::time::sleep(SEND_PAUSE).await;
            }
            Err(e) => eprintln!("{}: {id}: {e}", self.relay),
        }
        sent
    }
}

/// A relay: `Relay::run` on A's database through the announced sink (JetStream's or Kafka's),
/// until standard input closes; run again after a database error (a busy SQLite file), its
/// claimed rows taken again when their lease ends.
async fn relay<S: Sink + Send>(places: &Places<'_>, name: &str, sink: S) -> Result<(), String> {
    let database = Database::connect(places.a, 1).await?;
    let mut sink = Announced { sink, relay: name };
    let relay = Relay::new(OUTBOX)
        .batch(RELAY_BATCH)
        .lease(RELAY_LEASE)
        .idle(Duration::from_millis(100));
    let (stop, stopping) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        fleet::until_stdin_closes().await;
        let _ = stop.send(true);
    });
    Event::Ready.emit();
    loop {
        let mut watching = stopping.clone();
        let shutdown = async move {
            let _ = watching.wait_for(|stop| *stop).await;
        };
        match database.relay(&relay, &mut sink, shutdown).await {
            Ok(report) => {
                Event::Stopped {
                    report: format!("{report:?}"),
                }
                .emit();
                return Ok(());
            }
            Err(e) if *stopping.borrow() => return Err(e),
            Err(e) => {
                eprintln!("{name}: {e}; running the relay again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Service B: the JetStream pump on the shared durable consumer, the `#[idempotent]` handler
/// keyed by `Nats-Msg-Id`, an event line per delivery and per answer, until standard input
/// closes.
async fn service_b(places: &Places<'_>, name: &str) -> Result<(), String> {
    let connections = u32::try_from(IN_HAND).expect("a few connections");
    let database = Database::connect(places.b, connections).await?;
    let jetstream = connect_nats(&nats_url()).await?;
    let consumer = PUMP
        .consumer(&jetstream, places.stream, places.durable)
        .await
        .map_err(|e| format!("the consumer {} of {}: {e}", places.durable, places.stream))?;
    Event::Ready.emit();
    let database = &database;
    let report = PUMP
        .run(
            &jetstream,
            &consumer,
            fleet::until_stdin_closes(),
            |message: Message| async move {
                // The payload: the id of the message A applied.
                let id = String::from_utf8_lossy(&message.payload).into_owned();
                let count = inbox_nats::delivery_count(&message);
                reported(&id, count > 1, count, name, async {
                    match inbox_nats::key(&message) {
                        Ok(key) => database.apply(&key, &id, name, PAUSE).await,
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

/// Service B with `--downstream kafka`: the Kafka pump in the group named for the topic, the
/// `#[idempotent]` handler keyed by the `message-id` header, an event line per record and per
/// answer, until standard input closes.
async fn service_b_kafka(places: &Places<'_>, name: &str) -> Result<(), String> {
    let connections = u32::try_from(IN_HAND).expect("a few connections");
    let database = Database::connect(places.b, connections).await?;
    let (topic, brokers) = (subject(places.stream), places.durable);
    let mut config = inbox_kafka::Pump::consumer_config(brokers, &topic);
    config
        .set("session.timeout.ms", KAFKA_SESSION.as_millis().to_string())
        .set("heartbeat.interval.ms", "500")
        .set("auto.commit.interval.ms", "500");
    let consumer = KAFKA_PUMP
        .consumer(&config)
        .map_err(|e| format!("a consumer for {brokers}: {e}"))?;
    consumer
        .subscribe(&[topic.as_str()])
        .map_err(|e| format!("subscribe to {topic}: {e}"))?;
    let producer: rdkafka::producer::FutureProducer = inbox_kafka::producer_config(brokers)
        .create()
        .map_err(|e| format!("a producer for {brokers}: {e}"))?;
    Event::Ready.emit();
    let database = &database;
    let report = KAFKA_PUMP
        .run(
            &consumer,
            &producer,
            fleet::until_stdin_closes(),
            |record| async move {
                // The payload: the id of the message A applied.
                let id =
                    String::from_utf8_lossy(rdkafka::Message::payload(&record).unwrap_or_default())
                        .into_owned();
                reported(&id, false, 1, name, async {
                    match inbox_kafka::key(&record) {
                        Ok(key) => database.apply(&key, &id, name, PAUSE).await,
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
