//! NATS JetStream: a stream per run, the direct pull consumers and the pump on it, timed, and
//! the memory they hold per message.

use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::pull::Config as PullConfig;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, AckKind};
use futures_util::StreamExt;
use inbox_broker_examples::store::Failure;
use inbox_diesel::{KeyError, Outcome, broker};

use crate::database::Database;
use crate::memory::{Gate, Held, SETTLE, allocated};
use crate::run::{PAYLOAD, RunError, Tally, Timing, Variant, message_ids, timing};

pub(crate) struct Nats {
    url: String,
    /// Creates streams, publishes, checks and deletes: never the measured consumer's client.
    admin: jetstream::Context,
    pub(crate) version: String,
}

/// The durable consumer's name in every run's stream.
const DURABLE: &str = "bench";

/// How long the direct variants' pull requests wait on the server. async-nats' pull stream
/// counts a request's messages when the task that sent it reports back; a message that
/// overtakes that report is counted against nothing, the request stays counted as pending,
/// and no new request goes out until the stream's timer gives it up, `expires` + 5 s later
/// (30 s + 5 s by default). At `max_ack_pending` 1 with unconfirmed acks that happens every
/// few hundred messages; a short expiry bounds each stall to about 6 s.
const DIRECT_PULL_EXPIRES: Duration = Duration::from_secs(1);

impl Nats {
    pub(crate) async fn connect(url: String) -> Result<Self, String> {
        let client = nats_client(&url).await?;
        let version = client.server_info().version;
        Ok(Self {
            url,
            admin: jetstream::new(client),
            version,
        })
    }

    /// A stream of its own for run `run` (file storage), holding `ids` (each its
    /// `Nats-Msg-Id`), each confirmed by the server.
    pub(crate) async fn prepare(&self, run: usize, ids: &[String]) -> Result<String, String> {
        let stream = format!("INBOX_BENCH_{}_{run}", std::process::id());
        let subject = format!("inbox-bench.{}.{run}", std::process::id());
        self.admin
            .create_stream(jetstream::stream::Config {
                name: stream.clone(),
                subjects: vec![subject.clone()],
                max_age: Duration::from_secs(600),
                ..jetstream::stream::Config::default()
            })
            .await
            .map_err(|e| format!("create the stream {stream}: {e}"))?;
        // Confirmations awaited a thousand at a time: async-nats lets a context have only so
        // many unconfirmed publishes (5 000 by default) before `send_publish` waits.
        for chunk in ids.chunks(1000) {
            let mut confirms = Vec::with_capacity(chunk.len());
            for id in chunk {
                let message = PublishMessage::build()
                    .payload(PAYLOAD[..].into())
                    .message_id(id);
                confirms.push(
                    self.admin
                        .send_publish(subject.clone(), message)
                        .await
                        .map_err(|e| format!("publish {id}: {e}"))?,
                );
            }
            for confirm in confirms {
                confirm.await.map_err(|e| format!("publish: {e}"))?;
            }
        }
        Ok(stream)
    }

    /// The consumer's messages not yet acknowledged, delivered or not, once the server has
    /// processed the acknowledgements on their way (waits up to 5 s for the count to reach 0).
    pub(crate) async fn left(&self, stream: &str) -> Result<u64, String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let consumer: PullConsumer = self
                .admin
                .get_consumer_from_stream(DURABLE, stream)
                .await
                .map_err(|e| format!("find the consumer of {stream}: {e}"))?;
            let info = consumer
                .get_info()
                .await
                .map_err(|e| format!("ask for the consumer of {stream}: {e}"))?;
            let left = info.num_pending + info.num_ack_pending as u64;
            if left == 0 || Instant::now() >= deadline {
                return Ok(left);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) async fn delete(&self, stream: &str) {
        if let Err(e) = self.admin.delete_stream(stream).await {
            eprintln!("delete the stream {stream}: {e}");
        }
    }

    /// The consumer the direct variants read: what `Pump::consumer` creates, written out.
    async fn direct_consumer(
        jetstream: &jetstream::Context,
        stream: &str,
        max_ack_pending: usize,
    ) -> Result<PullConsumer, String> {
        jetstream
            .create_consumer_on_stream(
                PullConfig {
                    durable_name: Some(DURABLE.to_owned()),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: Duration::from_secs(30),
                    max_deliver: 10,
                    max_ack_pending: max_ack_pending as i64,
                    ..PullConfig::default()
                },
                stream,
            )
            .await
            .map_err(|e| format!("create the consumer on {stream}: {e}"))
    }

    /// One throughput run of `variant` on `stream`.
    pub(crate) async fn consume(
        &self,
        stream: &str,
        variant: Variant,
        max_ack_pending: usize,
        database: &Database,
        tally: &Tally,
    ) -> Result<Timing, RunError> {
        let client = nats_client(&self.url).await?;
        let jetstream = jetstream::new(client.clone());
        let (start, stopped) = match variant {
            Variant::Direct | Variant::DirectConfirmed => {
                let consumer = Self::direct_consumer(&jetstream, stream, max_ack_pending).await?;
                let start = Instant::now();
                let messages = consumer
                    .stream()
                    .max_messages_per_batch(max_ack_pending)
                    .expires(DIRECT_PULL_EXPIRES)
                    .messages()
                    .await
                    .map_err(|e| format!("pull from {stream}: {e}"))?;
                messages
                    .take_until(tally.finished())
                    .for_each_concurrent(max_ack_pending, |message| async move {
                        let Ok(message) = message else {
                            return;
                        };
                        let id = message
                            .headers
                            .as_ref()
                            .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
                            .map(|id| id.as_str());
                        let key = match message.info() {
                            Ok(info) => broker::jetstream(
                                id,
                                info.stream,
                                info.stream_sequence,
                                info.published.unix_timestamp_nanos(),
                            ),
                            Err(_) => Err(KeyError::Missing {
                                field: "JetStream metadata",
                            }),
                        };
                        let answer = tally.handle(database, key, id.unwrap_or_default()).await;
                        let settled = match (answer, variant) {
                            (Ok(_), Variant::DirectConfirmed) => message.double_ack().await,
                            (Ok(_), _) => message.ack().await,
                            (Err(_), _) => message.ack_with(AckKind::Nak(None)).await,
                        };
                        if let Err(e) = settled {
                            eprintln!("  settling a message failed: {e}");
                        }
                    })
                    .await;
                (start, Instant::now())
            }
            Variant::Pump => {
                let pump = inbox_nats::Pump::new().max_ack_pending(max_ack_pending);
                let consumer = pump
                    .consumer(&jetstream, stream, DURABLE)
                    .await
                    .map_err(|e| format!("create the consumer on {stream}: {e}"))?;
                let start = Instant::now();
                pump.run(
                    &jetstream,
                    &consumer,
                    tally.finished(),
                    |message| async move {
                        let id = message
                            .headers
                            .as_ref()
                            .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
                            .map_or("", |id| id.as_str());
                        tally.handle(database, inbox_nats::key(&message), id).await
                    },
                )
                .await
                .map_err(|stopped| stopped.to_string())?;
                (start, Instant::now())
            }
        };
        // Acknowledgements sent without a confirmation are on their way: flushed before the
        // check counts what the server still holds.
        let _ = client.flush().await;
        drop(client);
        timing(start, tally, stopped)
    }

    /// The allocated bytes per message held in flight by `variant`, `in_flight` at once.
    pub(crate) async fn memory(
        &self,
        run: usize,
        variant: Variant,
        in_flight: usize,
    ) -> Result<Held, String> {
        let ids = message_ids(run, in_flight);
        let stream = self.prepare(run, &ids).await?;
        let client = nats_client(&self.url).await?;
        let jetstream = jetstream::new(client.clone());
        // The full window from the start: the gate answers no handler until every message is
        // in hand, and a narrow start would take one and wait for its answer.
        let pump = inbox_nats::Pump::new()
            .max_ack_pending(in_flight)
            .slow_start(false);
        let consumer = match variant {
            Variant::Pump => pump
                .consumer(&jetstream, &stream, DURABLE)
                .await
                .map_err(|e| format!("create the consumer on {stream}: {e}"))?,
            _ => Self::direct_consumer(&jetstream, &stream, in_flight).await?,
        };
        let gate = Gate::new(in_flight);
        let gate = &gate;
        tokio::time::sleep(SETTLE).await;
        let before = allocated();
        let consume = async {
            match variant {
                Variant::Pump => {
                    pump.run(
                        &jetstream,
                        &consumer,
                        gate.all_done(),
                        |message| async move {
                            gate.hold(&message.payload).await;
                            Ok::<_, Failure>(Outcome::Processed(()))
                        },
                    )
                    .await
                    .map_err(|stopped| stopped.to_string())?;
                }
                _ => {
                    let messages = consumer
                        .stream()
                        .max_messages_per_batch(in_flight)
                        .expires(DIRECT_PULL_EXPIRES)
                        .messages()
                        .await
                        .map_err(|e| format!("pull from {stream}: {e}"))?;
                    messages
                        .take_until(gate.all_done())
                        .for_each_concurrent(in_flight, |message| async move {
                            let Ok(message) = message else {
                                return;
                            };
                            gate.hold(&message.payload).await;
                            let _ = message.ack().await;
                        })
                        .await;
                }
            }
            Ok::<(), String>(())
        };
        let (consumed, held) = tokio::join!(consume, gate.measure());
        consumed?;
        drop(consumer);
        let _ = client.flush().await;
        drop(client);
        let left = self.left(&stream).await?;
        self.delete(&stream).await;
        if left != 0 {
            return Err(format!("{left} messages were left unacknowledged"));
        }
        Ok(Held::between(before, held, in_flight as u16))
    }
}

async fn nats_client(url: &str) -> Result<async_nats::Client, String> {
    let client = tokio::time::timeout(
        Duration::from_secs(10),
        async_nats::ConnectOptions::new().connect(url),
    )
    .await
    .map_err(|_| format!("NATS at {url} did not answer within 10 s"))?
    .map_err(|e| format!("NATS is not reachable at {url} (set NATS_URL to change it): {e}"))?;
    if !client.server_info().jetstream {
        return Err(format!("the NATS server at {url} runs without JetStream"));
    }
    Ok(client)
}
