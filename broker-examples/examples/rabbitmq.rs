//! Two consumer processes share one durable RabbitMQ queue; one is killed with SIGKILL in
//! the middle of a handler and started again; every message is published twice. Each
//! message is still applied exactly once.
//!
//! ```text
//! cargo run --example rabbitmq                 # effects in SQLite, in a temporary directory
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --example rabbitmq --features inbox-broker-examples/postgres
//! DATABASE_URL=mysql://root@127.0.0.1:3306/test \
//!     cargo run --example rabbitmq --features inbox-broker-examples/mysql
//! ```
//!
//! The broker is `AMQP_URL` (by default `amqp://guest:guest@127.0.0.1:5672/%2f`). The run
//! declares a quorum queue of its own (with a dead-letter queue), starts consumers `a` and
//! `b` — this binary again, as `rabbitmq consume <queue> <database> <name>` — and publishes
//! 40 messages twice each with the same `message_id` (all once, then all again), as a
//! publisher retrying after a lost confirm does; the retries reach the consumers while the
//! first copies are still in their handlers. Each consumer runs `inbox_lapin::Pump`
//! (prefetch 4) with an `#[idempotent]` handler that writes one row to `effects` in the
//! inbox's transaction, then pauses 100 ms before the commit. The first consumer to start its
//! third handler — say `a` — is killed with SIGKILL the moment it prints that the handler is
//! in that pause: its transaction is rolled back, and the broker hands its unacknowledged
//! deliveries to `b` (flagged redelivered), or to `a2`, the restarted `a`. Which consumer is
//! the run's to decide: on SQLite the two processes queue for one write lock, and one of
//! them may start two handlers and then none until the end.
//!
//! The run ends when every message has its effect and the queue is empty; the consumers
//! are stopped (their standard input closed: the pump finishes what it holds), the queues
//! deleted, and the table printed. The exit code is non-zero unless every message has exactly one effect.

use std::process::ExitCode;
use std::time::Duration;

use inbox_broker_examples::brokers::{Queues, connect_rabbitmq};
use inbox_broker_examples::events::{Event, reported};
use inbox_broker_examples::fleet::{self, Fleet};
use inbox_broker_examples::scenario::Scenario;
use inbox_broker_examples::store::{Database, Failure, Store};
use inbox_broker_examples::{amqp_url, without_password};
use inbox_diesel::Redelivery;
use inbox_lapin::{Pump, delivery_count, key};
use lapin::Channel;
use lapin::options::ConfirmSelectOptions;

const SCENARIO: Scenario = Scenario {
    messages: 40,
    copies: 2,
    kill_after: 3,
    timeout: Duration::from_secs(90),
};
/// Deliveries each consumer holds at once, and database connections it pools.
const PREFETCH: u16 = 4;
/// The handler's work before its commit, in which the kill lands.
const PAUSE: Duration = Duration::from_millis(100);

#[tokio::main]
async fn main() -> ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
    match arguments.as_slice() {
        [] => match orchestrate().await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        ["consume", queue, database, name] => match consume(queue, database, name).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("consumer {name}: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: rabbitmq  (the orchestrator; it starts its consumers itself)");
            ExitCode::from(2)
        }
    }
}

/// The run's quorum queue — delivery counts in `x-delivery-count`, redeliveries bounded —
/// and its dead-letter queue, named for this process.
async fn declare_queues(channel: &Channel) -> Result<Queues, String> {
    Queues::declare(
        channel,
        format!("inbox-broker-example-{}", std::process::id()),
    )
    .await
}

/// Each message `copies` times with the same `message_id`, each copy confirmed by the
/// broker before the next: every message once, then every message again, as a publisher
/// that retries what it has not seen confirmed. (Copies published back to back would go
/// to the two consumers in turn, and `a` could be handed only second copies: it would
/// wait for `b`'s lock, answer duplicates, and never start a handler to be killed in.)
async fn publish(
    queues: &Queues,
    channel: &Channel,
    ids: &[String],
    copies: u32,
) -> Result<(), String> {
    for _ in 0..copies {
        for id in ids {
            queues.publish_one(channel, id).await?;
        }
    }
    Ok(())
}

/// The orchestrator: queues, database, consumers, messages, the kill, the table.
async fn orchestrate() -> Result<ExitCode, String> {
    let url = amqp_url();
    let connection = connect_rabbitmq(&url).await?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| format!("open a channel on {}: {e}", without_password(&url)))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| format!("publisher confirms: {e}"))?;
    let queues = declare_queues(&channel).await?;
    let outcome = run(&channel, &queues).await;
    if let Ok(n @ 1..) = Queues::ready(&channel, &queues.dead).await {
        eprintln!("{n} messages were dead-lettered to {}", queues.dead);
    }
    queues.delete(&channel).await;
    let _ = connection.close(200, "done".into()).await;
    outcome
}

async fn run(channel: &Channel, queues: &Queues) -> Result<ExitCode, String> {
    let store = Store::prepare().await?;
    println!(
        "RabbitMQ {}, quorum queue {}\neffects in {}\n\
         {} messages, each published {} times with one message_id; consumers a and b \
         (processes, prefetch {PREFETCH}, {} ms in each handler)\n",
        without_password(&amqp_url()),
        queues.name,
        store.describe(),
        SCENARIO.messages,
        SCENARIO.copies,
        PAUSE.as_millis(),
    );
    let mut fleet = Fleet::new(["consume", queues.name.as_str(), store.url()])
        .map_err(|e| format!("find this program to start consumers: {e}"))?;
    SCENARIO.start(&mut fleet).await?;
    publish(queues, channel, &SCENARIO.message_ids(), SCENARIO.copies).await?;
    let pending = async || Queues::ready(channel, &queues.name).await;
    let tally = SCENARIO.drive(&mut fleet, &store, pending).await;
    let ended = fleet.stop(Duration::from_secs(15)).await;
    let mut tally = tally?;
    tally.stopped(ended);
    Ok(tally.report())
}

/// A consumer process: the pump on the queue, the `#[idempotent]` handler on the database,
/// an event line per delivery and per answer, until standard input closes.
async fn consume(queue: &str, database: &str, name: &str) -> Result<(), String> {
    let inbox = Database::connect(database, u32::from(PREFETCH)).await?;
    let url = amqp_url();
    let connection = connect_rabbitmq(&url).await?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| format!("open a channel: {e}"))?;
    // A busy database: requeued after 100 ms, then 200 ms, … at most 2 s.
    let pump = Pump::new()
        .prefetch(PREFETCH)
        .redelivery(Redelivery::exponential(
            Duration::from_millis(100),
            Duration::from_secs(2),
        ));
    let consumer = pump
        .subscribe(&channel, queue, name)
        .await
        .map_err(|e| format!("consume {queue}: {e}"))?;
    Event::Ready.emit();
    let inbox = &inbox;
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
                    delivery_count(&delivery),
                    name,
                    async {
                        match key(&delivery) {
                            Ok(key) => inbox.apply(&key, &id, name, PAUSE).await,
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
