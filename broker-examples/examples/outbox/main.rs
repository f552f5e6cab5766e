//! The transactional outbox end to end, with kills: service A's `#[idempotent]` handler
//! consumes from RabbitMQ, writes its effect and publishes through the outbox in one
//! transaction; relays send the outbox to NATS JetStream; service B's `#[idempotent]` handler
//! consumes from JetStream and applies the effect. One A consumer, one relay and one B
//! consumer are killed with SIGKILL at points drawn from a seeded generator, and started
//! again. Each message still has exactly one effect in B.
//!
//! ```text
//! cargo run --example outbox                   # A's and B's databases: SQLite files
//! cargo run --example outbox -- --seed 1234    # the kill points of the run of seed 1234
//! TANSU=/path/to/tansu cargo run --example outbox -- --downstream kafka
//!                                              # relays to Kafka, B a Kafka consumer group
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --example outbox --features inbox-broker-examples/postgres
//! DATABASE_URL=mysql://root@127.0.0.1:3306/test \
//!     cargo run --example outbox --features inbox-broker-examples/mysql
//! ```
//!
//! The brokers are `AMQP_URL` (by default `amqp://guest:guest@127.0.0.1:5672/%2f`) and
//! `NATS_URL` (by default `nats://127.0.0.1:4222`, with JetStream). With `--downstream
//! kafka`, the relays send to Kafka instead — `KAFKA_BROKERS`, else a private tansu broker
//! (`TANSU`, else `tansu` on the PATH) — through `inbox_kafka::outbox::OutboxSink` (the
//! outbox id in the `message-id` header), to a topic of four partitions, and service B is a
//! consumer group of `inbox_kafka::Pump`s (4 records in hand, one per partition, offsets
//! committed every 500 ms): a killed B's partitions go to the others once the group misses
//! its heartbeats (a session of 6 s), from the committed offsets. Kafka keeps every copy a
//! relay sends again: B's inbox drops them. Each service has its own
//! database: two SQLite files in temporary directories, or with `DATABASE_URL` the schemas
//! (PostgreSQL) or databases (MySQL/MariaDB) `inbox_broker_example_a` and
//! `inbox_broker_example_b`, created afresh. A's holds the inbox, `effects` and `outbox`; B's
//! the inbox and `effects`.
//!
//! The orchestrator — this binary without arguments — declares a RabbitMQ quorum queue and a
//! JetStream stream of its own, starts nine processes over the run (this binary again, as
//! `outbox serve …`, each doing what its name says), publishes 40 messages to RabbitMQ twice
//! each with one `message_id`, and reads their events:
//!
//! - **service A**, `a1` and `a2` (restarted: `a3`): `inbox_lapin::Pump` (prefetch 4) with an
//!   `#[idempotent]` handler on A's database that writes one row to `effects` and, in the
//!   same transaction, publishes a message to NATS through the outbox
//!   (`OUTBOX.publish_async`), its payload the message's id; then it pauses 100 ms before the
//!   commit. A duplicate delivery publishes nothing.
//! - **relays**, `r1` and `r2` side by side (restarted: `r3`):
//!   `Relay::new(OUTBOX).run(…)` on a diesel-async connection to A's database, in batches of
//!   2 with a 6 s lease, through `inbox_nats::outbox::OutboxSink` — each message's outbox id
//!   as its `Nats-Msg-Id` — wrapped to print each confirmed send and pause 100 ms before the
//!   relay marks the row sent.
//! - **service B**, `b1` and `b2` (restarted: `b3`): `inbox_nats::Pump` (4 messages in hand,
//!   `ack_wait` 2 s) on one durable consumer, with an `#[idempotent]` handler on B's database
//!   keyed by `Nats-Msg-Id` that writes one row to `effects`, then pauses 100 ms before the
//!   commit.
//!
//! **The kills.** A seed (printed; `--seed N` replays it) draws three points, each in the
//! first half of a service's work: once service A has answered so many deliveries, `a1` is
//! killed in the next handler it starts (its effect and its outbox row roll back; RabbitMQ
//! hands its unacknowledged deliveries to the others); once the relays have sent so many
//! messages, `r1` is killed after its next send JetStream confirms, before the mark; once
//! service B has answered so many messages, `b1` is killed in the next handler it starts
//! (JetStream redelivers its messages after `ack_wait`). Each victim is started again at once
//! under a new name. A replayed seed kills at the same points; which messages are in flight
//! then depends on the processes' timing.
//!
//! The relay's kill leaves its claimed rows leased: when the lease ends another relay claims
//! them and sends the one that went out again, with the same `Nats-Msg-Id`. The stream's
//! duplicate window is 1 s here, shorter than the lease, so JetStream stores that copy and
//! B's inbox is what drops it; with JetStream's default window (two minutes) the broker
//! drops it itself. The lease is 6 s because on SQLite a relay's marks wait for A's one
//! writer, which A's handlers hold through their pause, for as long as A is busy (about 5 s):
//! a relay whose round outlives its lease loses its rows to the other relay, which sends
//! them again — the table counts those apart from the kill's.
//!
//! The run ends when every message has its effect in A and in B, every outbox row is marked
//! sent, and neither broker has anything left to deliver or waiting for an acknowledgement;
//! the processes are stopped (their standard input closed), the queue and the stream deleted
//! — also when the run fails — and the table printed. The exit code is non-zero unless each
//! message has exactly one effect in A, one outbox row and exactly one effect in B.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use async_nats::jetstream::Context;
use inbox_broker_examples::events::Event;
use inbox_broker_examples::fleet::{Fleet, Heard};
use inbox_broker_examples::store::{Effects, OutboxState, Store};
use inbox_broker_examples::without_password;
use inbox_diesel::Redelivery;
use inbox_diesel::outbox::Outbox;
use inbox_nats::outbox::LIMITS;
use lapin::Channel;
use lapin::options::ConfirmSelectOptions;

use crate::brokers::{
    Kafka, Queues, Stream, connect_nats, connect_rabbitmq, create_stream, declare_queues, publish,
    subject,
};
use crate::services::{Places, serve};
use crate::tally::Tally;
use inbox_broker_examples::{amqp_url, nats_url};

/// Distinct messages (ids `m001`, `m002`, …).
const MESSAGES: u32 = 40;
/// How many times each is published to RabbitMQ with the same `message_id`.
const COPIES: u32 = 2;
/// The run fails if it is not done by then.
const TIMEOUT: Duration = Duration::from_secs(90);
/// Deliveries each A consumer holds at once, and database connections it pools.
const PREFETCH: u16 = 4;
/// Messages each B consumer handles at once, and database connections it pools.
const IN_HAND: usize = 4;
/// The handlers' work before their commit, in which a kill lands.
const PAUSE: Duration = Duration::from_millis(100);
/// A relay's pause between a send the broker confirmed and the mark, in which its kill
/// lands.
const SEND_PAUSE: Duration = Duration::from_millis(100);
/// Rows a relay claims per round.
const RELAY_BATCH: u32 = 2;
/// How long a relay's claim holds its rows: a killed relay's rows are claimed again after.
/// Above a round's longest wait for SQLite's one writer while A's handlers hold it (they
/// can keep a relay waiting for as long as A is busy).
const RELAY_LEASE: Duration = Duration::from_secs(6);
/// How long JetStream waits for a settlement or a progress report before it redelivers.
const ACK_WAIT: Duration = Duration::from_secs(2);
/// The stream's duplicate window: shorter than the relay's lease, so that a copy sent again
/// after a relay's kill is stored, and B's inbox is what recognises it.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(1);
/// The stream's `max_age`: a stream an interrupted run leaves behind holds nothing after it.
const ABANDONED_AFTER: Duration = Duration::from_secs(600);

/// Service A's outbox, with NATS's limits: what JetStream cannot carry is refused in A's
/// handler, not found by the relay.
static OUTBOX: Outbox = Outbox::new("outbox").limits(LIMITS);

/// Service B's pump: a retry (a busy database) redelivered after 100 ms, then 200 ms, … at
/// most 2 s; a running handler's message reported in progress four times per `ack_wait`.
const PUMP: inbox_nats::Pump = inbox_nats::Pump::new()
    .max_ack_pending(IN_HAND)
    .ack_wait(ACK_WAIT)
    .progress_every(Duration::from_millis(500))
    .redelivery(Redelivery::exponential(
        Duration::from_millis(100),
        Duration::from_secs(2),
    ));

/// Where the relays send A's outbox and service B consumes: `--downstream nats` (the
/// default) or `kafka`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Downstream {
    Nats,
    Kafka,
}

impl Downstream {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "nats" => Some(Downstream::Nats),
            "kafka" => Some(Downstream::Kafka),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Downstream::Nats => "nats",
            Downstream::Kafka => "kafka",
        }
    }

    /// The broker, as the table names it.
    pub fn broker(self) -> &'static str {
        match self {
            Downstream::Nats => "JetStream",
            Downstream::Kafka => "Kafka",
        }
    }

    /// What carries the outbox id to B.
    pub fn id_header(self) -> &'static str {
        match self {
            Downstream::Nats => "Nats-Msg-Id",
            Downstream::Kafka => "message-id header",
        }
    }

    /// Who drops a copy a relay sent again.
    pub fn copies_dropped(self) -> String {
        match self {
            Downstream::Nats => format!(
                "JetStream drops a copy inside its {} s window, B's inbox one after it.",
                DUPLICATE_WINDOW.as_secs_f64()
            ),
            Downstream::Kafka => "Kafka stores every copy; B's inbox drops them.".to_owned(),
        }
    }

    /// How a killed B's messages come back.
    pub fn taken_back(self) -> String {
        match self {
            Downstream::Nats => {
                format!("redelivered after ack_wait ({} s)", ACK_WAIT.as_secs_f64())
            }
            Downstream::Kafka => format!(
                "read again from the committed offsets once the group's session ran out ({} s)",
                KAFKA_SESSION.as_secs_f64()
            ),
        }
    }
}

/// How long the Kafka group waits for a member's heartbeats before it gives its partitions
/// to the others.
const KAFKA_SESSION: Duration = Duration::from_secs(6);
/// Partitions of B's topic with `--downstream kafka`.
const KAFKA_PARTITIONS: i32 = 4;

/// Service B's pump with `--downstream kafka`: a retry (a busy database) run again after
/// 100 ms, then 200 ms, … at most 2 s, up to 1 000 times (a half-hour outage at those
/// delays).
const KAFKA_PUMP: inbox_kafka::Pump = inbox_kafka::Pump::new()
    .max_in_hand(IN_HAND)
    .max_attempts(1000)
    .redelivery(Redelivery::exponential(
        Duration::from_millis(100),
        Duration::from_secs(2),
    ));

/// The processes, by service: the first two run from the start, the first is the one
/// killed, the third is it started again.
const A: [&str; 3] = ["a1", "a2", "a3"];
const RELAYS: [&str; 3] = ["r1", "r2", "r3"];
const B: [&str; 3] = ["b1", "b2", "b3"];

#[tokio::main]
async fn main() -> ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
    let usage = || {
        eprintln!(
            "usage: outbox [--seed N] [--downstream nats|kafka]  (the orchestrator; it starts \
             the services' processes itself)"
        );
        ExitCode::from(2)
    };
    if let ["serve", downstream, queue, stream, durable, a, b, name] = arguments.as_slice() {
        let Some(downstream) = Downstream::parse(downstream) else {
            return usage();
        };
        let places = Places {
            downstream,
            queue,
            stream,
            durable,
            a,
            b,
        };
        return match serve(&places, name).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{name}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let (mut seed, mut downstream) = (fastrand::u64(..1_000_000), Downstream::Nats);
    let mut rest = arguments.iter();
    while let Some(flag) = rest.next() {
        let value = rest.next();
        match (*flag, value) {
            ("--seed", Some(value)) => match value.parse() {
                Ok(value) => seed = value,
                Err(_) => return usage(),
            },
            ("--downstream", Some(value)) => match Downstream::parse(value) {
                Some(value) => downstream = value,
                None => return usage(),
            },
            _ => return usage(),
        }
    }
    match orchestrate(seed, downstream).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

mod brokers;
mod services;
mod tally;

/// Where the kills land, drawn from the seed: each at a point of its service's progress, not
/// of the victim's own, so that the point comes however the work is shared out.
#[derive(Debug, Clone, Copy)]
struct Plan {
    seed: u64,
    /// `a1` is killed in the first handler it starts once service A has answered this many
    /// deliveries (of 80).
    a_after: u64,
    /// `r1` is killed after its first send once the relays have sent this many messages
    /// (of 40 and more), before its mark.
    relay_after: u64,
    /// `b1` is killed in the first handler it starts once service B has answered this many
    /// messages (of 40 and more).
    b_after: u64,
}

impl Plan {
    /// Within the first half of each service's work: the victim still has new messages to
    /// start or send after its point.
    fn draw(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        Self {
            seed,
            a_after: rng.u64(2..=u64::from(MESSAGES * COPIES / 2)),
            relay_after: rng.u64(0..=u64::from(MESSAGES / 2)),
            b_after: rng.u64(1..=u64::from(MESSAGES / 2)),
        }
    }
}

/// The orchestrator: brokers first (an unreachable one is named before anything is made),
/// then the queue and the stream, the run, and their deletion whatever the run's outcome.
async fn orchestrate(seed: u64, downstream: Downstream) -> Result<ExitCode, String> {
    let plan = Plan::draw(seed);
    let amqp = amqp_url();
    let connection = connect_rabbitmq(&amqp).await?;
    let place = Place::connect(downstream).await?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| format!("open a channel on {}: {e}", without_password(&amqp)))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| format!("publisher confirms: {e}"))?;
    let queues = declare_queues(&channel).await?;
    let outcome = match place.create().await {
        Ok(place) => {
            let outcome = run(plan, &channel, &queues, &place).await;
            place.delete().await;
            outcome
        }
        Err(e) => Err(e),
    };
    if let Ok(n @ 1..) = Queues::ready(&channel, &queues.dead).await {
        eprintln!("{n} messages were dead-lettered to {}", queues.dead);
    }
    queues.delete(&channel).await;
    let _ = connection.close(200, "done".into()).await;
    outcome
}

/// The downstream broker, connected to: what the orchestrator makes its place on.
enum Place {
    Nats(Context),
    Kafka(Kafka),
}

/// Service B's place on the downstream broker: a JetStream stream and its durable consumer,
/// or a Kafka topic (its group named for it).
enum Made {
    Nats(Context, Box<Stream>),
    Kafka(Kafka, String),
}

impl Place {
    async fn connect(downstream: Downstream) -> Result<Self, String> {
        Ok(match downstream {
            Downstream::Nats => Place::Nats(connect_nats(&nats_url()).await?),
            Downstream::Kafka => Place::Kafka(Kafka::start().await?),
        })
    }

    async fn create(self) -> Result<Made, String> {
        Ok(match self {
            Place::Nats(jetstream) => {
                let stream = create_stream(&jetstream).await?;
                Made::Nats(jetstream, Box::new(stream))
            }
            Place::Kafka(kafka) => {
                let name = format!("inbox-broker-example-outbox-{}", std::process::id());
                kafka
                    .create_topic(&subject(&name), KAFKA_PARTITIONS)
                    .await?;
                Made::Kafka(kafka, name)
            }
        })
    }
}

impl Made {
    fn downstream(&self) -> Downstream {
        match self {
            Made::Nats(..) => Downstream::Nats,
            Made::Kafka(..) => Downstream::Kafka,
        }
    }

    fn describe(&self) -> String {
        match self {
            Made::Nats(_, stream) => format!(
                "NATS {}, stream {} (in memory, duplicate window {} s), consumer {} (ack_wait {} \
                 s)",
                without_password(&nats_url()),
                stream.name,
                DUPLICATE_WINDOW.as_secs_f64(),
                stream.durable,
                ACK_WAIT.as_secs_f64(),
            ),
            Made::Kafka(kafka, name) => format!(
                "{}, topic {} ({KAFKA_PARTITIONS} partitions), group {0} (session {} s)",
                kafka.describe(),
                subject(name),
                KAFKA_SESSION.as_secs_f64(),
            ),
        }
    }

    /// What the processes are told: the stream and its consumer, or the topic's base name
    /// and the brokers.
    fn places(&self) -> (&str, &str) {
        match self {
            Made::Nats(_, stream) => (&stream.name, &stream.durable),
            Made::Kafka(kafka, name) => (name, &kafka.bootstrap),
        }
    }

    /// Messages B has not acknowledged (or whose offsets are not committed).
    async fn pending(&self) -> Result<u64, String> {
        match self {
            Made::Nats(_, stream) => stream.pending().await,
            Made::Kafka(kafka, name) => {
                let topic = subject(name);
                kafka.lag(&topic, &topic, KAFKA_PARTITIONS)
            }
        }
    }

    /// Messages the broker stored.
    async fn stored(&self) -> Result<u64, String> {
        match self {
            Made::Nats(jetstream, stream) => stream.stored(jetstream).await,
            Made::Kafka(kafka, name) => kafka.records(&subject(name), KAFKA_PARTITIONS),
        }
    }

    async fn delete(&self) {
        match self {
            Made::Nats(jetstream, stream) => stream.delete(jetstream).await,
            Made::Kafka(kafka, name) => kafka.delete_topic(&subject(name)).await,
        }
    }
}

async fn run(
    plan: Plan,
    channel: &Channel,
    queues: &Queues,
    place: &Made,
) -> Result<ExitCode, String> {
    let a = Store::prepare_service("a", Some(&OUTBOX)).await?;
    let b = Store::prepare_service("b", None).await?;
    println!(
        "RabbitMQ {}, quorum queue {}\n\
         {}\n\
         A's database: {} (inbox, effects, outbox)\n\
         B's database: {} (inbox, effects)\n\n\
         {MESSAGES} messages, each published {COPIES} times to RabbitMQ with one message_id.\n\
         Service A, {} and {}: prefetch {PREFETCH}; the handler writes its effect and an \
         outbox row, then {} ms before the commit.\n\
         Relays {} and {}: batches of {RELAY_BATCH}, a {} s lease, {} ms between a confirmed \
         send and its mark.\n\
         Service B, {} and {}: {IN_HAND} messages in hand; the handler writes its effect, then \
         {} ms before the commit.\n\
         Seed {}: {} is killed in the first handler it starts once service A has answered {} \
         deliveries, {} after its first send once the relays have sent {} (before the mark), \
         {} in the first handler it starts once service B has answered {}; each is started \
         again at once ({}, {}, {}).\n",
        without_password(&amqp_url()),
        queues.name,
        place.describe(),
        a.describe(),
        b.describe(),
        A[0],
        A[1],
        PAUSE.as_millis(),
        RELAYS[0],
        RELAYS[1],
        RELAY_LEASE.as_secs_f64(),
        SEND_PAUSE.as_millis(),
        B[0],
        B[1],
        PAUSE.as_millis(),
        plan.seed,
        A[0],
        plan.a_after,
        RELAYS[0],
        plan.relay_after,
        B[0],
        plan.b_after,
        A[2],
        RELAYS[2],
        B[2],
    );
    let (stream, durable) = place.places();
    let mut fleet = Fleet::new([
        "serve",
        place.downstream().name(),
        queues.name.as_str(),
        stream,
        durable,
        a.url(),
        b.url(),
    ])
    .map_err(|e| format!("find this program to start the services: {e}"))?;
    let ids: Vec<String> = (1..=MESSAGES).map(|n| format!("m{n:03}")).collect();
    start(&mut fleet).await?;
    let started = Instant::now();
    let mut tally = Tally::new(ids.clone(), started, place.downstream());
    tally.published = publish(queues, channel, &ids).await?;
    let observed = Observed {
        a: &a,
        b: &b,
        channel,
        queues,
        place,
    };
    let driven = drive(plan, &mut fleet, &mut tally, &observed).await;
    let ended = fleet.stop(Duration::from_secs(15)).await;
    driven?;
    tally.elapsed = started.elapsed();
    tally.stopped(ended);
    tally.a_effects = a.effects().await?;
    tally.outbox = a.outbox(&OUTBOX).await?;
    tally.b_effects = b.effects().await?;
    tally.stored = place.stored().await?;
    Ok(tally.report(plan))
}

/// Starts the first two processes of each service and waits until each is ready.
async fn start(fleet: &mut Fleet) -> Result<(), String> {
    let first = [A[0], A[1], RELAYS[0], RELAYS[1], B[0], B[1]];
    for name in first {
        fleet
            .start(name)
            .map_err(|e| format!("start the process {name}: {e}"))?;
    }
    let deadline = Instant::now() + TIMEOUT;
    let mut ready = 0;
    while ready < first.len() {
        match fleet.next(Duration::from_millis(100)).await {
            Some((_, Heard::Event(Event::Ready))) => ready += 1,
            Some((name, Heard::Closed)) => {
                return Err(format!(
                    "{name} exited before it was ready (its error is above)"
                ));
            }
            _ if Instant::now() > deadline => {
                return Err(format!("the processes were not ready within {TIMEOUT:?}"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// What the orchestrator reads besides the events: the two databases and the two brokers.
struct Observed<'a> {
    a: &'a Store,
    b: &'a Store,
    channel: &'a Channel,
    queues: &'a Queues,
    place: &'a Made,
}

impl Observed<'_> {
    /// Every message has its effect in A and in B, every outbox row is sent, and neither
    /// broker has a message to deliver or waiting for an acknowledgement.
    async fn settled(&self, ids: &[String]) -> Result<bool, String> {
        let applied = |effects: &Effects| {
            let applied = effects.per_message();
            ids.iter().all(|id| applied.contains_key(id.as_str()))
        };
        Ok(applied(&self.a.effects().await?)
            && {
                let rows = self.a.outbox(&OUTBOX).await?;
                rows.len() == u64::from(MESSAGES) && rows.count(OutboxState::Sent) == rows.len()
            }
            && applied(&self.b.effects().await?)
            && Queues::ready(self.channel, &self.queues.name).await? == 0
            && self.place.pending().await? == 0)
    }
}

/// Reads the processes' events and kills the victims at their points, until the victims are
/// gone, every copy published to RabbitMQ is answered, no process holds a message it has
/// not answered and everything [`Observed::settled`] — twice in a row — or until the
/// timeout.
async fn drive(
    plan: Plan,
    fleet: &mut Fleet,
    tally: &mut Tally,
    observed: &Observed<'_>,
) -> Result<(), String> {
    let started = tally.started;
    let deadline = started + TIMEOUT;
    let mut checked = Instant::now();
    let mut quiet_checks = 0;
    loop {
        if let Some((name, heard)) = fleet.next(Duration::from_millis(50)).await {
            match heard {
                Heard::Event(event) => {
                    let point = tally.record(&name, &event);
                    let reached = match (name.as_str(), &point) {
                        (victim, Some(_)) if victim == A[0] => tally.answered(&A) >= plan.a_after,
                        (victim, Some(_)) if victim == RELAYS[0] => {
                            // This send included.
                            tally.sent() > plan.relay_after
                        }
                        (victim, Some(_)) if victim == B[0] => tally.answered(&B) >= plan.b_after,
                        _ => false,
                    };
                    if let Some(id) = point
                        && reached
                        && !tally.kills.iter().any(|kill| kill.victim == name)
                    {
                        fleet.kill(&name).map_err(|e| format!("kill {name}: {e}"))?;
                        let restarted = restart_of(&name);
                        tally.killed(&name, restarted, id, started.elapsed());
                        fleet
                            .start(restarted)
                            .map_err(|e| format!("start {restarted}: {e}"))?;
                    }
                }
                Heard::Closed if tally.kills.iter().any(|kill| kill.victim == name) => {
                    tally.gone(&name);
                }
                Heard::Closed => {
                    let status = fleet
                        .exited(&name)
                        .map_or_else(String::new, |status| format!(" ({status})"));
                    tally.problems.push(format!(
                        "{name} exited before the end{status}; its error is above"
                    ));
                    return Ok(());
                }
            }
        }
        if Instant::now() > deadline {
            tally.problems.push(format!(
                "not done after {TIMEOUT:?}: {} of the 3 kills, {} A answers of {}, {} relay \
                 sends, {} B answers",
                tally.kills.len(),
                tally.answered(&A),
                tally.published,
                tally.sent(),
                tally.answered(&B),
            ));
            return Ok(());
        }
        if checked.elapsed() < Duration::from_millis(200) {
            continue;
        }
        checked = Instant::now();
        // Without all three kills too: a run done before a victim's point came ends, and the
        // verdict says which kill is missing.
        let quiet = tally.kills.iter().all(|kill| kill.gone)
            && tally.every_copy_answered()
            && tally.nothing_in_hand()
            && observed.settled(&tally.ids).await?;
        quiet_checks = if quiet { quiet_checks + 1 } else { 0 };
        if quiet_checks == 2 {
            return Ok(());
        }
    }
}

/// The name `victim` is started again under.
fn restart_of(victim: &str) -> &'static str {
    [A, RELAYS, B]
        .into_iter()
        .find(|names| names[0] == victim)
        .map_or("?", |names| names[2])
}
