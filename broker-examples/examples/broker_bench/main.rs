//! What the broker adapters cost: messages per second through `inbox_lapin::Pump`,
//! `inbox_nats::Pump`, `inbox_kafka::Pump` and `inbox_sqs::Pump` against the same
//! `#[idempotent]` handler called directly on the same deliveries by the broker's own client,
//! at several prefetch / `max_ack_pending` / in-hand values, and (RabbitMQ, JetStream) the
//! memory the consumer holds per delivery in flight.
//!
//! ```text
//! cargo run --release --example broker_bench                  # effects in SQLite
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!     cargo run --release --example broker_bench --features inbox-broker-examples/postgres
//! cargo run --release --example broker_bench -- --messages 10000 --rounds 3 \
//!     --prefetch 1,4,16,64,256 --in-flight 1000 --connections 16 --only nats
//! cargo run --release --example broker_bench -- --no-database
//! ```
//!
//! The brokers are `AMQP_URL` (by default `amqp://guest:guest@127.0.0.1:5672/%2f`),
//! `NATS_URL` (by default `nats://127.0.0.1:4222`, with JetStream), `KAFKA_BROKERS` (else a
//! private tansu broker: `TANSU`, else `tansu` on the PATH) and `SQS_ENDPOINT` (else a
//! private moto server: `MOTO`, else `moto_server` on the PATH).
//!
//! **Throughput.** Each run publishes `--messages` messages (a 100-byte payload and an id of
//! their own) to a fresh RabbitMQ quorum queue or JetStream stream, and waits for the broker
//! to confirm them all, before any consumer starts: publishing is not measured. A consumer
//! then applies each message with one `#[idempotent]` handler — an `effects` row and the
//! inbox marker in one transaction — on a fresh database (an SQLite file in WAL with
//! `synchronous = NORMAL`, or a schema of its own on PostgreSQL), through a bb8 pool of
//! `min(prefetch, --connections)` connections (by default 1 on SQLite, 16 on PostgreSQL).
//! With `--no-database` the handler only notes the message's id in memory: what the broker,
//! its client and the adapter allow without a database. The clock runs from the subscription
//! until the last message's handler answers. The variants:
//!
//! - RabbitMQ, `direct`: lapin's `basic_qos(prefetch)` and `basic_consume` with manual acks,
//!   up to `prefetch` handlers at once, `basic.ack` after each answer; `Pump`: the same
//!   through `Pump::new().prefetch(prefetch)`, `subscribe` and `run`.
//! - JetStream, `direct, ack`: a durable pull consumer with explicit acks and
//!   `max_ack_pending`, read with async-nats' `stream().max_messages_per_batch(n)`, up to `n`
//!   handlers at once, `ack()` (not confirmed) after each (pull requests expire after 1 s:
//!   see `DIRECT_PULL_EXPIRES`); `direct, double_ack`: the same, acknowledged with
//!   `double_ack()`, which waits for the server's confirmation as the pump does; `Pump`:
//!   `Pump::new().max_ack_pending(n)`, `consumer` and `run`.
//! - Kafka (a topic of 8 partitions per run, the records keyed by their ids): `direct`:
//!   rdkafka's `StreamConsumer` with `enable.auto.offset.store` off, up to `n` handlers at
//!   once over its stream, each offset stored after its answer (out of order across a
//!   partition: what one writes first, and what can commit past a record in hand); `Pump`:
//!   `Pump::new().max_in_hand(n)` — at most one record of a partition in hand, so at most 8.
//! - SQS (a queue with a redrive policy per run): `direct`: receives of up to 10 messages
//!   (`WaitTimeSeconds` 1) with the SDK, up to `n` handlers at once, `DeleteMessage` after
//!   each answer; `Pump`: `Pump::new().max_in_hand(n)`.
//!
//! Every run, of every variant, gets its own queue or stream and its own database; the
//! rounds repeat the whole sweep, each round in another order of the variants, and the
//! tables show each cell's median and the ratio of the pump to the direct consumer measured
//! in the same round (median, and the rounds' range). After each run the bench checks that
//! the broker holds nothing unacknowledged and that every message has exactly one effect row;
//! the exit code is non-zero if any run fails that.
//!
//! **Memory.** `--in-flight K` messages are published, then a consumer with prefetch /
//! `max_ack_pending` K takes them all into handlers that hold their delivery and wait until
//! all K have arrived. The bytes the process has allocated (counted by this binary's global
//! allocator) while they wait, less those before the consumer started, divided by K, is the
//! consumer's memory per delivery in flight: the delivery itself (100-byte payload), the
//! broker client's buffers, the handler's future and what the adapter keeps beside it. The
//! handler's own work (a database connection, the transaction) is not in it: it is the same
//! whoever calls the handler. Measured `--rounds` times for each variant (median);
//! `--prefetch none` measures the memory alone.

mod database;
mod kafka;
mod memory;
mod nats;
mod options;
mod rabbitmq;
mod report;
mod run;
mod sqs;
mod sweep;

use std::collections::BTreeMap;
use std::process::ExitCode;

use inbox_broker_examples::without_password;

use crate::database::Target;
use crate::kafka::Kafka;
use crate::memory::Held;
use crate::nats::Nats;
use crate::options::Options;
use crate::rabbitmq::Rabbit;
use crate::report::{Rates, cell, median, rate, ratio};
use crate::run::{Broker, PAYLOAD, Variant};
use crate::sqs::Sqs;
use crate::sweep::Bench;

#[tokio::main]
async fn main() -> ExitCode {
    match bench().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn bench() -> Result<ExitCode, String> {
    let options = Options::parse()?;
    let target = Target::from_env(options.no_database)?;
    let connections = options
        .connections
        .unwrap_or_else(|| target.default_connections());
    let brokers = options.brokers();
    let amqp = inbox_broker_examples::amqp_url();
    let nats_url = inbox_broker_examples::nats_url();
    let rabbit = match brokers.contains(&Broker::RabbitMq) {
        true => Some(Rabbit::connect(amqp.clone()).await?),
        false => None,
    };
    let nats = match brokers.contains(&Broker::Nats) {
        true => Some(Nats::connect(nats_url.clone()).await?),
        false => None,
    };
    let kafka = match brokers.contains(&Broker::Kafka) {
        true => Some(Kafka::connect().await?),
        false => None,
    };
    let sqs = match brokers.contains(&Broker::Sqs) {
        true => Some(Sqs::connect().await?),
        false => None,
    };
    println!("effects in {}", target.describe());
    if let Some(kafka) = &kafka {
        println!(
            "{}, a topic of {} partitions per run",
            kafka.describe(),
            crate::kafka::PARTITIONS
        );
    }
    if let Some(sqs) = &sqs {
        println!("{}, a queue per run", sqs.describe());
    }
    if rabbit.is_some() {
        println!(
            "RabbitMQ {}, a quorum queue per run",
            without_password(&amqp)
        );
    }
    if let Some(nats) = &nats {
        println!(
            "NATS {} {nats_url}, a JetStream stream (file storage) per run",
            nats.version
        );
    }
    println!(
        "{} messages per run, payload {} bytes; {} rounds; pool of min(prefetch, {connections}) \
         connections",
        options.messages,
        PAYLOAD.len(),
        options.rounds
    );
    let mut bench = Bench {
        options,
        target,
        connections,
        rabbit,
        nats,
        kafka,
        sqs,
        runs: 0,
        failures: Vec::new(),
    };

    let mut rates = Rates::new();
    let mut stops: BTreeMap<(Broker, Variant), Vec<f64>> = BTreeMap::new();
    let prefetches = bench.options.prefetch.clone();
    for round in 0..bench.options.rounds {
        eprintln!("round {} of {}", round + 1, bench.options.rounds);
        for &prefetch in &prefetches {
            for &broker in &brokers {
                // Each round in another order, so that no variant always runs first.
                let mut variants = broker.variants().to_vec();
                let turn = round % variants.len();
                variants.rotate_left(turn);
                for variant in variants {
                    let timing = bench.run(broker, variant, prefetch).await;
                    let rate = timing.map_or(f64::NAN, |t| rate(bench.options.messages, t));
                    rates
                        .entry((broker, prefetch, variant))
                        .or_default()
                        .push(rate);
                    if let Some(timing) = timing {
                        stops
                            .entry((broker, variant))
                            .or_default()
                            .push(timing.stopping.as_secs_f64() * 1000.0);
                    }
                }
            }
        }
    }

    let mut memory: BTreeMap<(Broker, Variant), Vec<Held>> = BTreeMap::new();
    if bench.options.in_flight > 0 {
        // Repeated as the throughput is: the broker client's buffers grow by steps, and
        // where a step falls moves a little from one run to the next.
        for round in 0..bench.options.rounds {
            eprintln!(
                "memory, {} deliveries in flight, round {} of {}",
                bench.options.in_flight,
                round + 1,
                bench.options.rounds
            );
            for &broker in brokers
                .iter()
                .filter(|broker| matches!(broker, Broker::RabbitMq | Broker::Nats))
            {
                for &variant in broker.variants() {
                    if variant == Variant::DirectConfirmed {
                        continue;
                    }
                    if let Some(held) = bench.memory(broker, variant).await {
                        memory.entry((broker, variant)).or_default().push(held);
                    }
                }
            }
        }
    }
    if let Some(rabbit) = bench.rabbit.take() {
        rabbit.close().await;
    }

    println!();
    for &broker in brokers.iter().filter(|_| !prefetches.is_empty()) {
        let setting = match broker {
            Broker::RabbitMq => "prefetch",
            Broker::Nats => "max_ack_pending",
            Broker::Kafka | Broker::Sqs => "in hand",
        };
        println!(
            "{broker}: messages per second, median of {} rounds; Pump / direct per round, \
             median (range)\n",
            bench.options.rounds
        );
        match broker {
            Broker::RabbitMq | Broker::Kafka | Broker::Sqs => {
                println!("| {setting} | direct | Pump | Pump / direct |");
                println!("|---:|---:|---:|---:|");
            }
            Broker::Nats => {
                println!(
                    "| {setting} | direct, ack | direct, double_ack | Pump | Pump / ack | \
                     Pump / double_ack |"
                );
                println!("|---:|---:|---:|---:|---:|---:|");
            }
        }
        for &prefetch in &prefetches {
            let mut row = format!("| {prefetch} |");
            for &variant in broker.variants() {
                row += &format!(" {} |", cell(&rates, (broker, prefetch, variant)));
            }
            row += &format!(
                " {} |",
                ratio(&rates, broker, prefetch, (Variant::Pump, Variant::Direct))
            );
            if broker == Broker::Nats {
                row += &format!(
                    " {} |",
                    ratio(
                        &rates,
                        broker,
                        prefetch,
                        (Variant::Pump, Variant::DirectConfirmed)
                    )
                );
            }
            println!("{row}");
        }
        let stopping: Vec<String> = broker
            .variants()
            .iter()
            .filter_map(|variant| {
                let median = median(stops.get(&(broker, *variant))?)?;
                Some(format!("{variant} {median:.0} ms"))
            })
            .collect();
        println!(
            "\nfrom the last answer until the consumer had stopped (median over all runs): {}\n",
            stopping.join(", ")
        );
    }
    if !memory.is_empty() {
        println!(
            "memory per delivery in flight, {} held at once (prefetch / max_ack_pending {0}), \
             payload {} bytes; median of {} rounds (range of the bytes)\n",
            bench.options.in_flight,
            PAYLOAD.len(),
            bench.options.rounds
        );
        println!("| adapter | direct | Pump | Pump − direct |");
        println!("|---|---:|---:|---:|");
        for &broker in brokers
            .iter()
            .filter(|broker| matches!(broker, Broker::RabbitMq | Broker::Nats))
        {
            let median_of = |variant| {
                let helds = memory.get(&(broker, variant))?;
                let bytes: Vec<f64> = helds.iter().map(|held| held.bytes).collect();
                let blocks: Vec<f64> = helds.iter().map(|held| held.blocks).collect();
                let low = bytes.iter().copied().fold(f64::INFINITY, f64::min);
                let high = bytes.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let held = Held {
                    bytes: median(&bytes)?,
                    blocks: median(&blocks)?,
                };
                Some((held, low, high))
            };
            let show = |held: Option<(Held, f64, f64)>| {
                held.map_or_else(
                    || "–".to_owned(),
                    |(held, low, high)| {
                        format!(
                            "{:.0} B ({low:.0}–{high:.0}), {:.1} allocations",
                            held.bytes, held.blocks
                        )
                    },
                )
            };
            let direct = median_of(Variant::Direct);
            let pump = median_of(Variant::Pump);
            let difference = match (direct.map(|held| held.0), pump.map(|held| held.0)) {
                (Some(direct), Some(pump)) => format!(
                    "{:+.0} B ({:+.1} allocations)",
                    pump.bytes - direct.bytes,
                    pump.blocks - direct.blocks
                ),
                _ => "–".to_owned(),
            };
            println!(
                "| {broker} | {} | {} | {difference} |",
                show(direct),
                show(pump)
            );
        }
        println!();
    }
    if bench.failures.is_empty() {
        println!("every run applied every message exactly once and left nothing unacknowledged");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("{} runs FAILED:", bench.failures.len());
        for failure in &bench.failures {
            println!("  {failure}");
        }
        Ok(ExitCode::FAILURE)
    }
}
