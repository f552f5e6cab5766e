//! Two consumer processes share one durable JetStream consumer; one is killed with SIGKILL in
//! the middle of a handler and started again; every message reaches the consumers twice.
//! Each message is still applied exactly once.
//!
//! ```text
//! cargo run --example nats                     # effects in SQLite, in a temporary directory
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --example nats --features inbox-broker-examples/postgres
//! DATABASE_URL=mysql://root@127.0.0.1:3306/test \
//!     cargo run --example nats --features inbox-broker-examples/mysql
//! ```
//!
//! The server is `NATS_URL` (by default `nats://127.0.0.1:4222`), with JetStream. The run
//! creates a stream of its own in memory, `inbox-broker-example-<pid>`, and on it the durable
//! pull consumer `inbox-broker-example-<pid>-consumer` (`ack_wait` 2 s), starts consumers
//! `a` and `b` — this binary again, as `nats consume <stream> <consumer> <database> <name>` —
//! and publishes 40 messages, each with its id as `Nats-Msg-Id`.
//!
//! **Twice, past JetStream's own deduplication.** JetStream drops a message whose
//! `Nats-Msg-Id` it stored within the stream's duplicate window (two minutes unless the
//! stream says otherwise): a retry inside the window never reaches a consumer, and
//! publishing every message twice in a row would show the broker's deduplication, not the
//! inbox's. So the stream's window here is 1 s, and the publisher, which sends a new message
//! every 100 ms, sends each three times. It retries each at once, as a publisher does whose
//! acknowledgement timed out: JetStream answers `duplicate` and drops that copy. It retries
//! each again 1.5 s after the first copy — a publisher restarted, or cut off longer than the
//! window — and JetStream stores that copy: 80 copies reach the consumers, new messages
//! among the late retries, and the table counts the 120 published and the 40 the broker
//! deduplicated.
//!
//! Each consumer runs `inbox_nats::Pump` (4 messages in hand, each reported in progress every
//! 500 ms, a quarter of `ack_wait`) with an `#[idempotent]` handler that writes one row to
//! `effects` in the inbox's transaction, then pauses 100 ms before the commit. The first
//! consumer to start its third handler — say `a` — is killed with SIGKILL the moment it
//! prints that the handler is in that pause: its transaction is rolled back, its progress
//! reports stop, and after `ack_wait` JetStream redelivers the messages it had not
//! acknowledged to `b` or to `a2`, the restarted `a`. The consumer's `max_ack_pending` is 12: 4 for each running
//! consumer, and 4 for what the killed one held until JetStream takes it back.
//!
//! The run ends when every message has its effect and JetStream has nothing left to deliver
//! or waiting for an acknowledgement; the consumers are stopped (their standard input closed:
//! the pump finishes what it holds), the stream deleted with its consumer — also when the run
//! fails — and the table printed. The exit code is non-zero unless every message has exactly
//! one effect. A stream that an interrupted run leaves behind empties itself after
//! 10 minutes (its `max_age`).

use std::process::ExitCode;
use std::time::Duration;

use async_nats::jetstream::{Context, Message};
use async_nats::{HeaderMap, header};
use inbox_broker_examples::brokers::{Stream, connect_nats};
use inbox_broker_examples::events::{Event, reported};
use inbox_broker_examples::fleet::{self, Fleet};
use inbox_broker_examples::scenario::Scenario;
use inbox_broker_examples::store::{Database, Failure, Store};
use inbox_broker_examples::{nats_url, without_password};
use inbox_diesel::Redelivery;
use inbox_nats::{Pump, delivery_count, key};
use tokio::time::Instant;

const SCENARIO: Scenario = Scenario {
    messages: 40,
    copies: 2,
    // Early, among the first messages, which are mostly new: the kill lands in the third
    // handler body a consumer starts.
    kill_after: 3,
    timeout: Duration::from_secs(90),
};
/// Messages each consumer handles at once, and database connections it pools.
const IN_HAND: usize = 4;
/// The handler's work before its commit, in which the kill lands.
const PAUSE: Duration = Duration::from_millis(100);
/// How long JetStream waits for a settlement or a progress report before it redelivers a
/// message: how long the killed consumer's messages stay away.
const ACK_WAIT: Duration = Duration::from_secs(2);
/// The stream's duplicate window: a copy with a `Nats-Msg-Id` stored less than this ago is
/// dropped by JetStream.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(1);
/// How long after a message's first copy the publisher retries it again: past the window.
const RETRY_AFTER_WINDOW: Duration = Duration::from_millis(1500);
/// The publisher sends a new message this often, and keeps sending new ones among the late
/// retries, as a live publisher does.
const PACE: Duration = Duration::from_millis(100);
/// The stream's `max_age`: a stream an interrupted run leaves behind holds nothing after it.
const ABANDONED_AFTER: Duration = Duration::from_secs(600);

/// The consumers' pump: a retry (a busy database) redelivered after 100 ms, then 200 ms, …
/// at most 2 s; a running handler's message reported in progress four times per `ack_wait`,
/// so that a handler slowed by a busy machine keeps its message.
const PUMP: Pump = Pump::new()
    .max_ack_pending(IN_HAND)
    .ack_wait(ACK_WAIT)
    .progress_every(Duration::from_millis(500))
    .redelivery(Redelivery::exponential(
        Duration::from_millis(100),
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
        ["consume", stream, durable, database, name] => {
            match consume(stream, durable, database, name).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("consumer {name}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!("usage: nats  (the orchestrator; it starts its consumers itself)");
            ExitCode::from(2)
        }
    }
}

/// What the publisher sent, and what JetStream did with it.
#[derive(Debug, Default)]
struct Publication {
    /// Copies sent, each answered by the server.
    sent: u64,
    /// Of those, copies JetStream dropped as duplicates within its window.
    dropped: u64,
}

/// The run's stream, in memory, taking the subjects `<name>.>`, and the durable pull
/// consumer the consumer processes share, named for this process.
async fn create_stream(jetstream: &Context) -> Result<Stream, String> {
    let name = format!("inbox-broker-example-{}", std::process::id());
    // The two running consumers' messages in hand, and the killed one's until JetStream
    // takes them back.
    let consumer = |durable: &str| PUMP.max_ack_pending(3 * IN_HAND).consumer_config(durable);
    Stream::create(jetstream, name, DUPLICATE_WINDOW, ABANDONED_AFTER, consumer).await
}

/// Each message with `Nats-Msg-Id` set to its id, one every [`PACE`]: sent, retried at
/// once (inside the window: dropped), and retried [`RETRY_AFTER_WINDOW`] after it was
/// first sent (stored). Fresh messages keep arriving among the late retries, as they do
/// from a live publisher, so that the consumers still have new work when the kill comes.
async fn publish(
    stream: &Stream,
    jetstream: &Context,
    ids: &[String],
) -> Result<Publication, String> {
    let mut publication = Publication::default();
    let start = Instant::now();
    let sent_at = |n: usize| start + PACE * u32::try_from(n).unwrap_or(u32::MAX);
    let (mut first, mut late) = (0, 0);
    while late < ids.len() {
        let late_at = sent_at(late) + RETRY_AFTER_WINDOW;
        if first < ids.len() && sent_at(first) <= late_at {
            tokio::time::sleep_until(sent_at(first)).await;
            for _ in 0..2 {
                send(stream, jetstream, &ids[first], &mut publication).await?;
            }
            first += 1;
        } else {
            tokio::time::sleep_until(late_at).await;
            send_after_window(stream, jetstream, &ids[late], &mut publication).await?;
            late += 1;
        }
    }
    Ok(publication)
}

/// Publishes `id` until JetStream stores it: a copy it still takes for a duplicate (its
/// window not yet over, the publisher having fallen behind) is sent again 250 ms later.
async fn send_after_window(
    stream: &Stream,
    jetstream: &Context,
    id: &str,
    publication: &mut Publication,
) -> Result<(), String> {
    for _ in 0..20 {
        if send(stream, jetstream, id, publication).await? {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!(
        "JetStream still drops {id} as a duplicate 5 s after its {DUPLICATE_WINDOW:?} window"
    ))
}

/// Publishes one copy of `id` and waits for the server's answer: whether JetStream
/// stored it (not a duplicate).
async fn send(
    stream: &Stream,
    jetstream: &Context,
    id: &str,
    publication: &mut Publication,
) -> Result<bool, String> {
    let mut headers = HeaderMap::new();
    headers.insert(header::NATS_MESSAGE_ID, id);
    let ack = jetstream
        .publish_with_headers(
            format!("{}.messages", stream.name),
            headers,
            id.to_owned().into(),
        )
        .await
        .map_err(|e| format!("publish {id}: {e}"))?
        .await
        .map_err(|e| format!("publish {id}: {e}"))?;
    publication.sent += 1;
    if ack.duplicate {
        publication.dropped += 1;
    }
    Ok(!ack.duplicate)
}

/// The orchestrator: stream, database, consumers, messages, the kill, the table.
async fn orchestrate() -> Result<ExitCode, String> {
    let url = nats_url();
    let jetstream = connect_nats(&url).await?;
    let stream = create_stream(&jetstream).await?;
    let outcome = run(&jetstream, &stream).await;
    stream.delete(&jetstream).await;
    outcome
}

async fn run(jetstream: &Context, stream: &Stream) -> Result<ExitCode, String> {
    let store = Store::prepare().await?;
    println!(
        "NATS {}, stream {} (in memory, duplicate window {} s), consumer {} (ack_wait {} s)\n\
         effects in {}\n\
         {} messages, one every {} ms, each published {} times with one Nats-Msg-Id: once, \
         again at once (inside the window), and again {:.1} s later (after it); consumers \
         a and b (processes, {IN_HAND} messages in hand each, {} ms in each handler)\n",
        without_password(&nats_url()),
        stream.name,
        DUPLICATE_WINDOW.as_secs_f64(),
        stream.durable,
        ACK_WAIT.as_secs_f64(),
        store.describe(),
        SCENARIO.messages,
        PACE.as_millis(),
        SCENARIO.copies + 1,
        RETRY_AFTER_WINDOW.as_secs_f64(),
        PAUSE.as_millis(),
    );
    let mut fleet = Fleet::new([
        "consume",
        stream.name.as_str(),
        stream.durable.as_str(),
        store.url(),
    ])
    .map_err(|e| format!("find this program to start consumers: {e}"))?;
    SCENARIO.start(&mut fleet).await?;
    // Published while the run is driven: the kill must land while a consumer's handler is
    // in its pause, not when the publisher is done.
    let ids = SCENARIO.message_ids();
    let pending = async || stream.pending().await;
    let outcome = tokio::try_join!(
        publish(stream, jetstream, &ids),
        SCENARIO.drive(&mut fleet, &store, pending),
    );
    let ended = fleet.stop(Duration::from_secs(15)).await;
    let (publication, mut tally) = outcome?;
    tally.stopped(ended);
    tally.published = publication.sent;
    tally.deduplicated_by_broker = publication.dropped;
    println!(
        "JetStream dropped {} of the {} copies published, as duplicates inside its {} s \
         window, and stored {}; what a killed consumer held comes back after ack_wait ({} s)",
        publication.dropped,
        publication.sent,
        DUPLICATE_WINDOW.as_secs_f64(),
        publication.sent - publication.dropped,
        ACK_WAIT.as_secs_f64(),
    );
    Ok(tally.report())
}

/// The message's `Nats-Msg-Id`, or `-`.
fn message_id(message: &Message) -> String {
    message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(header::NATS_MESSAGE_ID))
        .map_or_else(|| "-".to_owned(), |id| id.as_str().to_owned())
}

/// A consumer process: the pump on the shared durable consumer, the `#[idempotent]` handler
/// on the database, an event line per delivery and per answer, until standard input closes.
async fn consume(stream: &str, durable: &str, database: &str, name: &str) -> Result<(), String> {
    let connections = u32::try_from(IN_HAND).expect("a few connections");
    let inbox = Database::connect(database, connections).await?;
    let jetstream = connect_nats(&nats_url()).await?;
    let consumer = PUMP
        .consumer(&jetstream, stream, durable)
        .await
        .map_err(|e| format!("the consumer {durable} of {stream}: {e}"))?;
    Event::Ready.emit();
    let inbox = &inbox;
    let report = PUMP
        .run(
            &jetstream,
            &consumer,
            fleet::until_stdin_closes(),
            |message| async move {
                let id = message_id(&message);
                let count = delivery_count(&message);
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
