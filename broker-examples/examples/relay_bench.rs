//! What the outbox relay costs and how long it makes a message wait: its throughput into
//! RabbitMQ and into JetStream against the same sink called directly, and the latency from a
//! handler's commit to a consumer's receipt, through the relay against publishing right
//! after the commit.
//!
//! ```text
//! cargo run --release --example relay_bench                    # the outbox in SQLite
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!     cargo run --release --example relay_bench --features inbox-broker-examples/postgres
//! DATABASE_URL=mysql://root@127.0.0.1:3306/test \
//!     cargo run --release --example relay_bench --features inbox-broker-examples/mysql
//! cargo run --release --example relay_bench -- --messages 2000 --rounds 3 --relays 1,4 \
//!     --keys none,16,1 --rate 200 --seconds 5 --only nats
//! ```
//!
//! The brokers are `AMQP_URL` (by default `amqp://guest:guest@127.0.0.1:5672/%2f`) and
//! `NATS_URL` (by default `nats://127.0.0.1:4222`, with JetStream). Every run has a fresh
//! database (`Store::prepare_service`: the inbox, `effects` and the outbox) and a fresh
//! RabbitMQ quorum queue or JetStream stream; the relay and the direct sender use the
//! adapters' sinks, `inbox_lapin::outbox::OutboxSink` (publisher confirms, the default
//! exchange) and `inbox_nats::outbox::OutboxSink` (JetStream acks, `Nats-Msg-Id`).
//!
//! **Throughput.** `--messages` messages are written to the outbox first, each by an
//! `#[idempotent]` handler (an `effects` row, the outbox row, the marker), with ordering keys
//! as `--keys` says: `none` (the empty key: no order among them), `16` (16 keys, in turn), `1`
//! (one key: all in order). Then `relays` relays (`Relay::new(outbox)`: batches of 100), each
//! on its own connection with its own sink, run until every message was sent, and the clock
//! stops when they have marked them. The baseline, in the same round: `relays` tasks calling
//! the sink directly on the same messages, each on its share, one after the other as the
//! relay sends them. After each relay run the bench checks that every row is marked sent and
//! that the sinks were called once per message; a failure makes the exit code non-zero.
//!
//! **Latency.** A producer runs the handler `--rate` times a second for `--seconds` seconds
//! (one task, on a schedule); a consumer on the queue or the stream notes when each message
//! arrives. The latency of a message is from the handler's return (its commit) to its
//! arrival. Variants: `after commit` — the handler without the outbox, then the sink called
//! directly (the dual write the outbox replaces: the baseline); `relay, polling` — the
//! outbox and one relay as it ships (a 200 ms pause when a round finds nothing); `relay,
//! 20 ms` — the relay with `idle(20 ms)`; on PostgreSQL `relay, notify` — an outbox that
//! notifies on commit, whose relay `LISTEN`s and wakes at once (polling every 200 ms as the
//! fallback).

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, Context};
use futures_util::StreamExt;
use inbox_broker_examples::store::{Database, OutboxState, Publish, Store};
use inbox_broker_examples::without_password;
use inbox_diesel::Uuid;
use inbox_diesel::outbox::Outbox;
use inbox_diesel::outbox::relay::{Outgoing, Relay, Sink, SinkError};
use inbox_diesel::{MessageKey, Outcome};
use lapin::options::{BasicConsumeOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties};

/// The outbox every run writes to.
static OUTBOX: Outbox = Outbox::new("outbox");
/// The same table, notifying its relay on commit (PostgreSQL).
static NOTIFYING: Outbox = Outbox::new("outbox").notify_on_commit();

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broker {
    RabbitMq,
    Nats,
}

impl Broker {
    fn name(self) -> &'static str {
        match self {
            Broker::RabbitMq => "RabbitMQ",
            Broker::Nats => "JetStream",
        }
    }
}

/// A sink of either adapter.
enum AnySink {
    RabbitMq(inbox_lapin::outbox::OutboxSink),
    Nats(inbox_nats::outbox::OutboxSink),
}

impl Sink for AnySink {
    async fn send(&mut self, message: &Outgoing) -> Result<(), SinkError> {
        match self {
            AnySink::RabbitMq(sink) => sink.send(message).await,
            AnySink::Nats(sink) => sink.send(message).await,
        }
    }
}

/// A sink that counts what it sent.
struct Counted {
    inner: AnySink,
    sent: tokio::sync::watch::Sender<usize>,
}

impl Sink for Counted {
    async fn send(&mut self, message: &Outgoing) -> Result<(), SinkError> {
        let sent = self.inner.send(message).await;
        if sent.is_ok() {
            self.sent.send_modify(|n| *n += 1);
        }
        sent
    }
}

/// Where a run publishes: a fresh queue or stream, and what reads it.
struct Destination {
    broker: Broker,
    /// The queue, or the stream's subject.
    name: String,
    stream: String,
    amqp: Option<(Connection, Channel)>,
    jetstream: Context,
    amqp_url: String,
}

impl Destination {
    async fn create(broker: Broker, brokers: &Brokers, run: usize) -> Result<Self, String> {
        let tag = format!("{}-{run}", std::process::id());
        let mut destination = Destination {
            broker,
            name: format!("relay-bench.{tag}"),
            stream: format!("RELAY_BENCH_{}", tag.replace('-', "_")),
            amqp: None,
            jetstream: brokers.jetstream.clone(),
            amqp_url: brokers.amqp_url.clone(),
        };
        match broker {
            Broker::RabbitMq => {
                let connection =
                    Connection::connect(&brokers.amqp_url, ConnectionProperties::default())
                        .await
                        .map_err(|e| format!("RabbitMQ: {e}"))?;
                let channel = connection
                    .create_channel()
                    .await
                    .map_err(|e| format!("RabbitMQ: {e}"))?;
                let mut arguments = FieldTable::default();
                arguments.insert(
                    "x-queue-type".into(),
                    AMQPValue::LongString("quorum".into()),
                );
                arguments.insert("x-expires".into(), AMQPValue::LongInt(600_000));
                let durable = QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                };
                channel
                    .queue_declare(destination.name.as_str().into(), durable, arguments)
                    .await
                    .map_err(|e| format!("declare {}: {e}", destination.name))?;
                destination.amqp = Some((connection, channel));
            }
            Broker::Nats => {
                brokers
                    .jetstream
                    .create_stream(jetstream::stream::Config {
                        name: destination.stream.clone(),
                        subjects: vec![destination.name.clone()],
                        max_age: Duration::from_secs(600),
                        ..jetstream::stream::Config::default()
                    })
                    .await
                    .map_err(|e| format!("create the stream {}: {e}", destination.stream))?;
            }
        }
        Ok(destination)
    }

    fn sink(&self) -> AnySink {
        match self.broker {
            Broker::RabbitMq => AnySink::RabbitMq(inbox_lapin::outbox::OutboxSink::new(
                self.amqp_url.clone(),
                "",
            )),
            Broker::Nats => {
                AnySink::Nats(inbox_nats::outbox::OutboxSink::new(self.jetstream.clone()))
            }
        }
    }

    /// Notes when each message (by its payload) arrives, until dropped.
    async fn receive(&self, arrived: Arrivals) -> Result<tokio::task::JoinHandle<()>, String> {
        match self.broker {
            Broker::RabbitMq => {
                let (_, channel) = self.amqp.as_ref().expect("a RabbitMQ destination");
                let mut consumer = channel
                    .basic_consume(
                        self.name.as_str().into(),
                        "relay-bench".into(),
                        BasicConsumeOptions {
                            no_ack: true,
                            ..BasicConsumeOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|e| format!("consume {}: {e}", self.name))?;
                Ok(tokio::spawn(async move {
                    while let Some(Ok(delivery)) = consumer.next().await {
                        arrived.note(&delivery.data);
                    }
                }))
            }
            Broker::Nats => {
                let mut subscriber = self
                    .jetstream
                    .client()
                    .subscribe(self.name.clone())
                    .await
                    .map_err(|e| format!("subscribe to {}: {e}", self.name))?;
                Ok(tokio::spawn(async move {
                    while let Some(message) = subscriber.next().await {
                        arrived.note(&message.payload);
                    }
                }))
            }
        }
    }

    /// Deletes the queue or stream; a broker that does not answer within 5 s is left to
    /// expire it (the queue's `x-expires`, the stream's `max_age`).
    async fn delete(self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.delete_now()).await;
    }

    async fn delete_now(self) {
        match self.broker {
            Broker::RabbitMq => {
                if let Some((connection, channel)) = self.amqp {
                    let _ = channel
                        .queue_delete(self.name.as_str().into(), QueueDeleteOptions::default())
                        .await;
                    let _ = connection.close(200, "done".into()).await;
                }
            }
            Broker::Nats => {
                let _ = self.jetstream.delete_stream(&self.stream).await;
            }
        }
    }
}

/// When each message arrived, by its payload.
#[derive(Clone, Default)]
struct Arrivals(Arc<Mutex<HashMap<String, Instant>>>);

impl Arrivals {
    fn note(&self, payload: &[u8]) {
        let now = Instant::now();
        let id = String::from_utf8_lossy(payload).into_owned();
        self.0.lock().unwrap().entry(id).or_insert(now);
    }
}

struct Brokers {
    amqp_url: String,
    jetstream: Context,
}

struct Settings {
    messages: usize,
    rounds: usize,
    relays: Vec<usize>,
    keys: Vec<Keys>,
    rate: u32,
    seconds: u32,
    brokers: Vec<Broker>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    None,
    Some(usize),
}

impl Keys {
    fn of(self, n: usize) -> String {
        match self {
            Keys::None => String::new(),
            Keys::Some(keys) => format!("key-{}", n % keys),
        }
    }

    fn label(self) -> String {
        match self {
            Keys::None => "no key".to_owned(),
            Keys::Some(1) => "1 key".to_owned(),
            Keys::Some(n) => format!("{n} keys"),
        }
    }
}

fn settings() -> Result<Settings, String> {
    let mut settings = Settings {
        messages: 2000,
        rounds: 3,
        relays: vec![1, 4],
        keys: vec![Keys::None, Keys::Some(16), Keys::Some(1)],
        rate: 200,
        seconds: 5,
        brokers: vec![Broker::RabbitMq, Broker::Nats],
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |text: String| {
            text.parse::<usize>()
                .map_err(|_| format!("{flag}: not a number: {text}"))
        };
        match flag.as_str() {
            "--messages" => settings.messages = number(value()?)?.max(1),
            "--rounds" => settings.rounds = number(value()?)?.max(1),
            "--rate" => settings.rate = u32::try_from(number(value()?)?.max(1)).unwrap_or(1000),
            "--seconds" => settings.seconds = u32::try_from(number(value()?)?).unwrap_or(5),
            "--relays" => {
                settings.relays = value()?
                    .split(',')
                    .map(|n| number(n.to_owned()).map(|n| n.max(1)))
                    .collect::<Result<_, _>>()?
            }
            "--keys" => {
                settings.keys = value()?
                    .split(',')
                    .map(|k| match k {
                        "none" => Ok(Keys::None),
                        n => number(n.to_owned()).map(|n| Keys::Some(n.max(1))),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--only" => {
                settings.brokers = match value()?.as_str() {
                    "rabbitmq" => vec![Broker::RabbitMq],
                    "nats" => vec![Broker::Nats],
                    other => return Err(format!("--only rabbitmq or nats, not {other}")),
                }
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(settings)
}

/// A fresh database with the inbox, `effects` and the outbox, and a pool of `connections`.
async fn database(connections: u32) -> Result<(Store, Database), String> {
    let store = Store::prepare_service("relay_bench", Some(&OUTBOX)).await?;
    let database = Database::connect(store.url(), connections).await?;
    Ok((store, database))
}

/// Message `id`'s effect and its outbox row, by the handler.
async fn publish(
    database: &Database,
    id: &str,
    outbox: &Outbox,
    destination: &str,
    ordering_key: &str,
) -> Result<Outcome<()>, inbox_broker_examples::store::Failure> {
    let key = MessageKey::text(id).map_err(inbox_diesel::Error::from)?;
    let to = Publish {
        outbox,
        destination,
        ordering_key,
    };
    database
        .apply_and_publish(&key, id, "relay-bench", Duration::ZERO, to)
        .await
}

/// Writes `messages` to the outbox through the handler, `concurrency` at a time.
async fn fill(
    database: &Arc<Database>,
    destination: &str,
    messages: usize,
    keys: Keys,
    concurrency: usize,
) -> Result<Vec<String>, String> {
    let ids: Vec<String> = (0..messages).map(|n| format!("m{n}")).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in ids.chunks(messages.div_ceil(concurrency)) {
        let (database, destination) = (database.clone(), destination.to_owned());
        let chunk: Vec<(usize, String)> = chunk
            .iter()
            .map(|id| (id[1..].parse().unwrap(), id.clone()))
            .collect();
        tasks.spawn(async move {
            for (n, id) in chunk {
                let outcome = publish(&database, &id, &OUTBOX, &destination, &keys.of(n))
                    .await
                    .map_err(|e| e.to_string())?;
                if !matches!(outcome, Outcome::Processed(())) {
                    return Err(format!("{id}: {outcome:?}"));
                }
            }
            Ok::<(), String>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| e.to_string())??;
    }
    Ok(ids)
}

/// Seconds the sinks take to send `ids` directly, `senders` of them at once.
async fn direct(destination: &Destination, ids: &[String], senders: usize) -> f64 {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in ids.chunks(ids.len().div_ceil(senders)) {
        let mut sink = destination.sink();
        let messages: Vec<Outgoing> = chunk
            .iter()
            .enumerate()
            .map(|(seq, id)| outgoing(&destination.name, seq, id))
            .collect();
        tasks.spawn(async move {
            for message in &messages {
                sink.send(message)
                    .await
                    .expect("the broker takes the message");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a direct sender");
    }
    started.elapsed().as_secs_f64()
}

fn outgoing(destination: &str, seq: usize, id: &str) -> Outgoing {
    Outgoing {
        seq: seq as i64,
        id: Uuid::new_v5(&Uuid::NAMESPACE_OID, id.as_bytes()),
        destination: destination.to_owned(),
        key: String::new(),
        headers: Vec::new(),
        payload: id.as_bytes().to_vec(),
        attempts: 0,
    }
}

/// Seconds `relays` relays take to send and mark `messages` outbox rows; checks the rows.
async fn relayed(
    database: &Arc<Database>,
    destination: &Destination,
    messages: usize,
    relays: usize,
) -> Result<f64, String> {
    let (sent, mut watch) = tokio::sync::watch::channel(0usize);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..relays {
        let (database, mut stopped) = (database.clone(), stopped.clone());
        let mut sink = Counted {
            inner: destination.sink(),
            sent: sent.clone(),
        };
        tasks.spawn(async move {
            let relay = Relay::new(OUTBOX);
            let shutdown = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            database.relay(&relay, &mut sink, shutdown).await
        });
    }
    watch
        .wait_for(|n| *n >= messages)
        .await
        .map_err(|e| e.to_string())?;
    stop.send_replace(true);
    while let Some(done) = tasks.join_next().await {
        let report = done.map_err(|e| e.to_string())??;
        if std::env::var_os("RELAY_BENCH_DEBUG").is_some() {
            eprintln!("{report:?}");
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let rows = database.outbox(&OUTBOX).await?;
    let calls = *watch.borrow();
    if rows.count(OutboxState::Sent) as usize != messages || calls != messages {
        return Err(format!(
            "{} of {messages} rows marked sent, {calls} sends",
            rows.count(OutboxState::Sent)
        ));
    }
    Ok(seconds)
}

/// One throughput round for `broker`, `keys` and `relays`: (direct, relay) messages a second.
async fn throughput(
    settings: &Settings,
    brokers: &Brokers,
    broker: Broker,
    keys: Keys,
    relays: usize,
    run: &mut usize,
) -> Result<(f64, f64), String> {
    *run += 1;
    let destination = Destination::create(broker, brokers, *run).await?;
    let (_store, database) = database(u32::try_from(relays).unwrap_or(1).max(4)).await?;
    let database = Arc::new(database);
    let concurrency = if std::env::var("DATABASE_URL").unwrap_or_default().is_empty() {
        1
    } else {
        8
    };
    let ids = fill(
        &database,
        &destination.name,
        settings.messages,
        keys,
        concurrency,
    )
    .await?;
    database.analyze(&OUTBOX).await?;
    let direct = direct(&destination, &ids, relays).await;
    let relay = relayed(&database, &destination, settings.messages, relays).await;
    destination.delete().await;
    let n = settings.messages as f64;
    Ok((n / direct, n / relay?))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    AfterCommit,
    Relay(Duration),
    Notify,
}

impl Path {
    fn label(self) -> String {
        match self {
            Path::AfterCommit => "after commit (dual write)".to_owned(),
            Path::Relay(idle) if idle == Duration::from_millis(200) => {
                "relay, polling (200 ms)".to_owned()
            }
            Path::Relay(idle) => format!("relay, polling ({} ms)", idle.as_millis()),
            Path::Notify => "relay, notify on commit".to_owned(),
        }
    }
}

/// One latency run: the latency of each message, in milliseconds.
async fn latency(
    settings: &Settings,
    brokers: &Brokers,
    broker: Broker,
    path: Path,
    run: &mut usize,
) -> Result<Vec<f64>, String> {
    *run += 1;
    let destination = Destination::create(broker, brokers, *run).await?;
    let (_store, database) = database(4).await?;
    let database = Arc::new(database);
    let arrived = Arrivals::default();
    let receiving = destination.receive(arrived.clone()).await?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let relaying = match path {
        Path::AfterCommit => None,
        Path::Relay(idle) => Some((Relay::new(OUTBOX).idle(idle), stopped)),
        Path::Notify => Some((Relay::new(NOTIFYING), stopped)),
    }
    .map(|(relay, mut stopped)| {
        let (database, mut sink) = (database.clone(), destination.sink());
        tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            database.relay(&relay, &mut sink, shutdown).await
        })
    });
    // The relay listens before the first message.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let outbox = if path == Path::Notify {
        &NOTIFYING
    } else {
        &OUTBOX
    };
    let total = settings.rate as usize * settings.seconds as usize;
    let mut committed = HashMap::with_capacity(total);
    let mut sink = destination.sink();
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / settings.rate);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 0..total {
        ticks.tick().await;
        let id = format!("m{n}");
        let key = MessageKey::text(&id).map_err(|e| e.to_string())?;
        let outcome = match path {
            Path::AfterCommit => {
                let outcome = database
                    .apply(&key, &id, "relay-bench", Duration::ZERO)
                    .await;
                committed.insert(id.clone(), Instant::now());
                sink.send(&outgoing(&destination.name, n, &id))
                    .await
                    .map_err(|e| e.to_string())?;
                outcome
            }
            _ => {
                let outcome = publish(&database, &id, outbox, &destination.name, "").await;
                committed.insert(id.clone(), Instant::now());
                outcome
            }
        };
        if !matches!(outcome, Ok(Outcome::Processed(()))) {
            return Err(format!("{id}: {outcome:?}"));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while arrived.0.lock().unwrap().len() < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send_replace(true);
    if let Some(relaying) = relaying {
        relaying.await.map_err(|e| e.to_string())??;
    }
    receiving.abort();
    destination.delete().await;
    let arrived = arrived.0.lock().unwrap().clone();
    if arrived.len() != total {
        return Err(format!("{} of {total} messages arrived", arrived.len()));
    }
    let mut latencies: Vec<f64> = committed
        .iter()
        .map(|(id, at)| arrived[id].saturating_duration_since(*at).as_secs_f64() * 1000.0)
        .collect();
    latencies.sort_by(f64::total_cmp);
    Ok(latencies)
}

/// `run`, or an error naming it if it has not finished within five minutes: a run that
/// hangs fails the bench instead of stalling it.
async fn within<T>(
    run: impl std::future::Future<Output = Result<T, String>>,
    what: &str,
) -> Result<T, String> {
    match tokio::time::timeout(Duration::from_secs(300), run).await {
        Ok(result) => result,
        Err(_) => Err(format!("{what} did not finish within 5 minutes")),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn range(values: &[f64]) -> String {
    let low = values.iter().copied().fold(f64::INFINITY, f64::min);
    let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{low:.2}–{high:.2}")
}

async fn bench(settings: Settings) -> Result<(), String> {
    let amqp_url = inbox_broker_examples::amqp_url();
    let nats_url = inbox_broker_examples::nats_url();
    let jetstream = inbox_nats::connect(&nats_url, async_nats::ConnectOptions::new())
        .await
        .map_err(|e| format!("NATS at {}: {e}", without_password(&nats_url)))?;
    let brokers = Brokers {
        amqp_url,
        jetstream,
    };
    let database_url = std::env::var("DATABASE_URL").unwrap_or_default();
    let backend = match database_url.split_once("://") {
        Some(("postgres" | "postgresql", _)) => "PostgreSQL",
        Some(("mysql", _)) => "MySQL/MariaDB",
        _ => "SQLite",
    };
    println!(
        "# outbox relay, {backend}: {} messages per throughput run, {} rounds\n",
        settings.messages, settings.rounds
    );
    let mut run = 0;
    for &broker in &settings.brokers {
        println!("## {}: messages per second\n", broker.name());
        println!("| ordering keys | relays | sink called directly | relay | relay / direct |");
        println!("|---|---:|---:|---:|---:|");
        for &keys in &settings.keys {
            for &relays in &settings.relays {
                let mut rounds = Vec::new();
                for _ in 0..settings.rounds {
                    let measured = throughput(&settings, &brokers, broker, keys, relays, &mut run);
                    rounds.push(within(measured, "a throughput run").await?);
                }
                let ratios: Vec<f64> = rounds.iter().map(|(d, r)| r / d).collect();
                println!(
                    "| {} | {relays} | {:.0}/s | {:.0}/s | {:.2} ({}) |",
                    keys.label(),
                    median(rounds.iter().map(|r| r.0).collect()),
                    median(rounds.iter().map(|r| r.1).collect()),
                    median(ratios.clone()),
                    range(&ratios),
                );
            }
        }
        println!(
            "\n## {}: latency from commit to arrival, {} messages at {}/s\n",
            broker.name(),
            settings.rate as usize * settings.seconds as usize,
            settings.rate
        );
        println!("| path | p50 | p99 | max | p50 − dual write |");
        println!("|---|---:|---:|---:|---:|");
        let mut paths = vec![
            Path::AfterCommit,
            Path::Relay(Duration::from_millis(200)),
            Path::Relay(Duration::from_millis(20)),
        ];
        if backend == "PostgreSQL" {
            paths.push(Path::Notify);
        }
        let mut baseline = None;
        for path in paths {
            let mut p50s = Vec::new();
            let mut p99s = Vec::new();
            let mut maxes = Vec::new();
            for _ in 0..settings.rounds {
                let measured = latency(&settings, &brokers, broker, path, &mut run);
                let latencies = within(measured, "a latency run").await?;
                p50s.push(percentile(&latencies, 0.5));
                p99s.push(percentile(&latencies, 0.99));
                maxes.push(*latencies.last().unwrap());
            }
            let p50 = median(p50s);
            let base = *baseline.get_or_insert(p50);
            println!(
                "| {} | {p50:.1} ms | {:.1} ms | {:.1} ms | {:+.1} ms |",
                path.label(),
                median(p99s),
                median(maxes),
                p50 - base
            );
        }
        println!();
    }
    Ok(())
}

fn main() -> ExitCode {
    let settings = match settings() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("relay_bench: {e}");
            return ExitCode::from(2);
        }
    };
    inbox_broker_examples::events::silence();
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    match runtime.block_on(bench(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("relay_bench: {e}");
            ExitCode::FAILURE
        }
    }
}
