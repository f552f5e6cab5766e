//! Two consumer processes receive from one SQS queue; one is killed with SIGKILL in the
//! middle of a handler and started again; every message is sent twice. Each message is
//! still applied exactly once.
//!
//! ```text
//! MOTO=/path/to/moto_server cargo run --example sqs   # a private server; effects in SQLite
//! SQS_ENDPOINT=http://127.0.0.1:4566 cargo run --example sqs
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --example sqs --features inbox-broker-examples/postgres
//! ```
//!
//! The server is `SQS_ENDPOINT` (any SQS-compatible endpoint; credentials and region from
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_REGION`, else test ones); without
//! it the run starts a private moto server (`MOTO`, else `moto_server` on the PATH) on a free
//! port. The run creates a queue of its own, `inbox-broker-example-<pid>` (visibility timeout
//! 2 s), with its dead-letter queue after 1 000 receives (a half-hour database outage at the
//! retries' delays of 1–2 s), starts consumers `a` and `b` — this
//! binary again, as `sqs consume <endpoint> <queue url> <database> <name>` — and sends 40
//! messages twice each with one `message-id` attribute (all once, then all again), as a
//! sender does that retries after a lost answer: SQS gives each copy a `MessageId` of its
//! own, and only the attribute tells them for one message.
//!
//! Each consumer runs `inbox_sqs::Pump` (4 messages in hand, each message's visibility
//! extended every 500 ms) with an `#[idempotent]` handler that writes one row to `effects`
//! in the inbox's transaction, then pauses 100 ms before the commit. The first consumer to
//! start its third handler — say `a` — is killed with SIGKILL the moment it prints that the
//! handler is in that pause: its transaction is rolled back, its extensions stop, and within
//! the 2 s visibility timeout SQS delivers its messages again to `b` or to `a2`, the
//! restarted `a`, their receive count one higher.
//!
//! The run ends when every message has its effect and the queue is empty; the consumers are
//! stopped (their standard input closed: the pump finishes what it holds), the queues
//! deleted, and the table printed. The exit code is non-zero unless every message has
//! exactly one effect.

use std::process::ExitCode;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{Message, MessageAttributeValue};
use inbox_broker_examples::brokers::{Sqs, sqs_client};
use inbox_broker_examples::events::{Event, reported};
use inbox_broker_examples::fleet::{self, Fleet};
use inbox_broker_examples::scenario::Scenario;
use inbox_broker_examples::store::{Database, Failure, Store};
use inbox_diesel::Redelivery;
use inbox_sqs::{MESSAGE_ID, Pump, key, receive_count};

const SCENARIO: Scenario = Scenario {
    messages: 40,
    copies: 2,
    kill_after: 3,
    timeout: Duration::from_secs(120),
};
/// Messages each consumer handles at once, and database connections it pools.
const IN_HAND: usize = 4;
/// The handler's work before its commit, in which the kill lands.
const PAUSE: Duration = Duration::from_millis(100);
/// How long SQS keeps a received message from the others: how long the killed consumer's
/// messages stay away.
const VISIBILITY: Duration = Duration::from_secs(2);

/// The consumers' pump: a retry (a busy database) visible again after 1 s, then 2 s (SQS
/// counts whole seconds); a running handler's message extended four times per visibility
/// timeout, so that a handler slowed by a busy machine keeps it.
const PUMP: Pump = Pump::new()
    .max_in_hand(IN_HAND)
    .wait_time(Duration::from_secs(1))
    .progress_every(Duration::from_millis(500))
    .redelivery(Redelivery::exponential(
        Duration::from_secs(1),
        Duration::from_secs(2),
    ));

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
        ["consume", endpoint, url, database, name] => {
            match consume(endpoint, url, database, name).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("consumer {name}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!("usage: sqs  (the orchestrator; it starts its consumers itself)");
            ExitCode::from(2)
        }
    }
}

/// Each message `copies` times with one `message-id` attribute: every message once, then
/// every message again.
async fn send(client: &Client, url: &str, ids: &[String]) -> Result<(), String> {
    for _ in 0..SCENARIO.copies {
        for id in ids {
            let attribute = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(id)
                .build()
                .map_err(|e| e.to_string())?;
            client
                .send_message()
                .queue_url(url)
                .message_body(id)
                .message_attributes(MESSAGE_ID, attribute)
                .send()
                .await
                .map_err(|e| format!("send {id}: {e}"))?;
        }
    }
    Ok(())
}

/// The orchestrator: server, queues, database, consumers, messages, the kill, the table.
async fn orchestrate() -> Result<ExitCode, String> {
    let sqs = Sqs::start().await?;
    let name = format!("inbox-broker-example-{}", std::process::id());
    let url = sqs.create_queue(&name, VISIBILITY, 1000).await?;
    let outcome = run(&sqs, &url).await;
    sqs.delete_queue(&url).await;
    outcome
}

async fn run(sqs: &Sqs, url: &str) -> Result<ExitCode, String> {
    let store = Store::prepare().await?;
    println!(
        "{}, queue {url} (visibility timeout {} s)\neffects in {}\n\
         {} messages, each sent {} times with one message-id attribute; consumers a and b \
         (processes, {IN_HAND} messages in hand each, {} ms in each handler)\n",
        sqs.describe(),
        VISIBILITY.as_secs(),
        store.describe(),
        SCENARIO.messages,
        SCENARIO.copies,
        PAUSE.as_millis(),
    );
    let mut fleet = Fleet::new(["consume", sqs.endpoint.as_str(), url, store.url()])
        .map_err(|e| format!("find this program to start consumers: {e}"))?;
    SCENARIO.start(&mut fleet).await?;
    send(&sqs.client(), url, &SCENARIO.message_ids()).await?;
    let pending = async || sqs.pending(url).await;
    let tally = SCENARIO.drive(&mut fleet, &store, pending).await;
    let ended = fleet.stop(Duration::from_secs(15)).await;
    let mut tally = tally?;
    tally.stopped(ended);
    Ok(tally.report())
}

/// The message's `message-id` attribute, or `-`.
fn message_id(message: &Message) -> String {
    message
        .message_attributes()
        .and_then(|attributes| attributes.get(MESSAGE_ID))
        .and_then(|value| value.string_value())
        .unwrap_or("-")
        .to_owned()
}

/// A consumer process: the pump on the queue, the `#[idempotent]` handler on the database,
/// an event line per delivery and per answer, until standard input closes.
async fn consume(endpoint: &str, url: &str, database: &str, name: &str) -> Result<(), String> {
    let connections = u32::try_from(IN_HAND).expect("a few connections");
    let inbox = Database::connect(database, connections).await?;
    let client = sqs_client(endpoint);
    let queue = PUMP.queue(&client, url).await.map_err(|e| e.to_string())?;
    Event::Ready.emit();
    let inbox = &inbox;
    let report = PUMP
        .run(
            &client,
            &queue,
            fleet::until_stdin_closes(),
            |message| async move {
                let id = message_id(&message);
                let count = receive_count(&message);
                reported(&id, count > 1, count, name, async {
                    match key(&message) {
                        Ok(key) => inbox.apply(&key, &id, name, PAUSE).await,
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
