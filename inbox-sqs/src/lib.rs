//! Amazon SQS consumers for `inbox-diesel` handlers, through the [AWS SDK for Rust]: each
//! message is settled by what the handler answered ([`Settle`]), its visibility extended
//! while the handler runs, and deleted only once it is settled.
//!
//! ```no_run
//! use inbox_diesel::Outcome;
//! use inbox_sqs::{Pump, key};
//!
//! # async fn credit(key: inbox_diesel::MessageKey, body: &str) -> Result<Outcome<()>, inbox_diesel::Error> { Ok(Outcome::Processed(())) }
//! # async fn run(client: aws_sdk_sqs::Client) -> Result<(), Box<dyn std::error::Error>> {
//! // `client`: from `aws_config::load_from_env()`, say.
//! let pump = Pump::new().max_in_hand(16);
//! // The queue's visibility timeout, redrive policy and kind, read once.
//! let queue = pump.queue(&client, "https://sqs.eu-west-1.amazonaws.com/123456789012/credits").await?;
//! // Until the process is asked to stop (`tokio::signal::ctrl_c()`, say).
//! let shutdown = std::future::pending::<()>();
//! let report = pump
//!     .run(&client, &queue, shutdown, |message| async move {
//!         // The `message-id` attribute, else the MessageId.
//!         let key = match key(&message) {
//!             Ok(key) => key,
//!             Err(invalid) => return Err(inbox_diesel::Error::InvalidKey(invalid)),
//!         };
//!         credit(key, message.body().unwrap_or_default()).await
//!     })
//!     .await?;
//! println!("{report:?}");
//! # Ok(())
//! # }
//! ```
//!
//! | the handler answered | [`Settlement`] | what the pump does |
//! |---|---|---|
//! | `Processed`, `Duplicate` | `Ack` | `DeleteMessage` |
//! | `InFlight`, a transient failure, a panic | `Retry`, `Held` | `ChangeMessageVisibility` to [`Redelivery`]'s delay for its receive count: SQS delivers it again then, and after the redrive policy's `maxReceiveCount` receives moves it to the dead-letter queue |
//! | a business constraint, an invalid key, a stale claim | `DeadLetter` | sends it to the redrive policy's dead-letter queue at once, then deletes it |
//! | misuse, a schema fault, a missing privilege | `Halt` | stops receiving, makes the message visible again, finishes the messages in hand, and returns [`Stopped::Halted`] |
//!
//! **Visibility.** While a handler runs, the pump extends its message's visibility to the
//! queue's visibility timeout every half of it ([`Pump::progress_every`] to choose): SQS
//! does not deliver it to another consumer however long the handler works. A process that
//! dies stops the extensions, and the message comes back once the last one ran out, its
//! receive count one higher: a message that kills its consumer every time reaches the
//! redrive policy's `maxReceiveCount` and is moved to the dead-letter queue by SQS itself.
//!
//! **Receives and deletes.** The pump long-polls (`WaitTimeSeconds`, [`Pump::wait_time`])
//! for at most its free slots, so that no message waits invisible in its hands for a slot
//! (but a FIFO group's, above); a receive in flight is kept until it answers. Of a batch,
//! each message is deleted on its own once it is settled: a message whose handler failed
//! stays in the queue, whatever became of the others. A delete, a visibility change or a
//! dead letter that SQS refuses for good — no permission, no such queue, a KMS key the role
//! cannot use — stops the pump ([`Stopped::Broker`]): every message would otherwise be
//! processed and come back until the redrive policy moved it, processed, to the dead-letter
//! queue.
//!
//! **FIFO queues.** SQS delivers a message group's messages in order, and no more of a
//! group while one is in flight; a receive may still bring several of one group. The pump
//! runs them one after the other in that order, groups beside each other, and extends the
//! visibility of those waiting behind with that of the one in hand. A retried FIFO message
//! runs again in place after the delay, its visibility and its group's extended meanwhile:
//! handed back, it would come again with the messages behind it, and each would count a
//! receive against the redrive policy. The handler is given the message with its receives
//! and runs so far as `ApproximateReceiveCount` ([`receive_count`]); once they reach the
//! policy's `maxReceiveCount` the pump moves it to the dead-letter queue itself. A message
//! that is not deleted (its dead letter or its delete failed) sends the rest of its group
//! the pump holds back at once, to come after it.
//!
//! **Keys.** [`key`] is the message's `message-id` attribute ([`MESSAGE_ID`], which the
//! outbox's [`OutboxSink`](outbox::OutboxSink) sets to the outbox id) when the sender set
//! one, else its `MessageId`. SQS assigns the `MessageId` at each `SendMessage`: a sender
//! that retries a send makes a second message with a new id, which the inbox cannot tell
//! from a new one — set the attribute. A FIFO queue drops a copy with the same
//! deduplication id within five minutes only, and is not keyed by it (see [`key`]).
//!
//! **Dead letters and retention.** The queue must have a redrive policy ([`Pump::queue`]
//! refuses one without): a dead letter goes to its dead-letter queue at once, with the
//! attributes [`DEAD_LETTER_QUEUE`], [`DEAD_LETTER_MESSAGE_ID`] and [`DEAD_LETTER_REASON`]
//! beside the message's own (SQS takes ten attributes; the message's own come first). A
//! marker must outlive every delivery of its message: [`Queue::retention`] is the visibility
//! timeout or the longest retry delay, times `maxReceiveCount`
//! ([`broker::sqs_retention`]); add the queue's message retention period where messages may
//! wait that long.
//!
//! **Reconnect and outages.** As in the other pumps ([`inbox_diesel::pump`]). A receive
//! that fails (SQS out of reach, throttling the SDK's retries did not outlast) is retried
//! after a pause, doubling up to 30 s.
//!
//! **Pool checkouts.** A closure that takes the handler's connection from a pool (bb8,
//! deadpool, r2d2) before calling it answers a failed checkout with
//! [`inbox_diesel::Error::checkout`]: nothing ran, and its class (`ConnectionLost`) settles
//! it as the database's outage — retried after a delay, the pump pausing as above — never as
//! a dead letter: `pool.get().await.map_err(inbox_diesel::Error::checkout)?`.
//!
//! **Shutdown.** When `shutdown` completes (or the pump halts), the pump stops receiving,
//! waits for a receive in flight (at most [`Pump::wait_time`]) and makes what it received
//! but did not start visible again at once, lets the handlers in hand finish and settle,
//! and returns.
//!
//! **Traces.** Each message is handled in one span, [`process_span`]`("aws_sqs", queue,
//! receive count)`, with the SQS `MessageId` as `messaging.message.id`.
//!
//! [AWS SDK for Rust]: https://docs.rs/aws-sdk-sqs

pub mod outbox;

use std::future::Future;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::types::{Message, MessageSystemAttributeName, QueueAttributeName};
use inbox_diesel::pump;
use inbox_diesel::telemetry::process_span;
use inbox_diesel::{
    KeyError, MessageKey, Outage, Redelivery, Retention, Settle, Settlement, broker,
};
use tracing::Instrument;

mod source;
mod work;

use work::*;

/// The message attribute [`key`] reads a message's id from, and the outbox's sink writes
/// the outbox id to.
pub const MESSAGE_ID: &str = "message-id";
/// On a dead letter: the name of the queue it came from.
pub const DEAD_LETTER_QUEUE: &str = "inbox-dead-letter-queue";
/// On a dead letter: its `MessageId` there.
pub const DEAD_LETTER_MESSAGE_ID: &str = "inbox-dead-letter-message-id";
/// On a dead letter: why — the handler's answer, as `Debug` prints it.
pub const DEAD_LETTER_REASON: &str = "inbox-dead-letter-reason";

/// The key of an SQS message: its [`MESSAGE_ID`] attribute when the sender set one, else
/// its `MessageId` ([`broker::sqs`]).
///
/// Not a FIFO queue's `MessageDeduplicationId`: SQS deduplicates by it for five minutes
/// only, and a queue with content-based deduplication derives it from the body — two
/// messages with one body sent an hour apart would share it, and the second be answered
/// `Duplicate` and deleted unapplied. A sender that wants its retries recognised after the
/// five minutes sets the attribute (the outbox's sink sets it to the outbox id, and on a
/// FIFO queue the deduplication id too).
///
/// # Errors
/// [`KeyError::Missing`] for a message without either (never from SQS itself);
/// [`KeyError::TooLong`] past [`MessageKey::MAX_LEN`].
pub fn key(message: &Message) -> Result<MessageKey, KeyError> {
    let sender = message
        .message_attributes()
        .and_then(|attributes| attributes.get(MESSAGE_ID))
        .and_then(|value| value.string_value())
        .filter(|id| !id.is_empty());
    match sender {
        Some(id) => MessageKey::text(id),
        None => broker::sqs(message.message_id().unwrap_or_default()),
    }
}

/// How many times SQS has delivered `message`, this delivery included
/// (`ApproximateReceiveCount`; 1 where it is missing).
pub fn receive_count(message: &Message) -> u32 {
    attribute(message, MessageSystemAttributeName::ApproximateReceiveCount)
        .and_then(|count| count.parse().ok())
        .unwrap_or(1)
}

pub(crate) fn attribute(message: &Message, name: MessageSystemAttributeName) -> Option<&str> {
    message
        .attributes()
        .and_then(|attributes| attributes.get(&name))
        .map(String::as_str)
}

/// An SDK error with the service's code and message, which its `Display` leaves out.
pub(crate) fn described<E, R>(error: &aws_sdk_sqs::error::SdkError<E, R>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match (error.code(), error.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_owned(),
        _ => {
            let mut text = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            text
        }
    }
}

/// A queue as the pump runs it, read by [`Pump::queue`].
#[derive(Debug, Clone)]
pub struct Queue {
    url: String,
    name: String,
    fifo: bool,
    visibility_timeout: Duration,
    max_receive_count: u32,
    dead_letter_url: String,
    dead_letter_fifo: bool,
}

impl Queue {
    /// Its URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether it is a FIFO queue.
    pub fn is_fifo(&self) -> bool {
        self.fifo
    }

    /// Its visibility timeout.
    pub fn visibility_timeout(&self) -> Duration {
        self.visibility_timeout
    }

    /// Its redrive policy's `maxReceiveCount`.
    pub fn max_receive_count(&self) -> u32 {
        self.max_receive_count
    }

    /// The URL of its redrive policy's dead-letter queue.
    pub fn dead_letter_url(&self) -> &str {
        &self.dead_letter_url
    }

    /// How long the inbox must keep a marker for the deliveries of this queue's messages
    /// under `pump`: at most `maxReceiveCount` receives, each after at most the visibility
    /// timeout (no settlement) or the pump's longest retry delay. Add the queue's message
    /// retention period ([`Retention::message_ttl`]) where a message may wait that long.
    pub fn retention(&self, pump: &Pump) -> Retention {
        let longest_wait = self.visibility_timeout.max(pump.redelivery.delay(u32::MAX));
        broker::sqs_retention(longest_wait, self.max_receive_count)
    }
}

/// What a pump did before it stopped. Each message it took is counted once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Messages deleted (processed, or duplicates).
    pub acked: u64,
    /// Messages made visible again after a delay, to be retried.
    pub retried: u64,
    /// Messages moved to the dead-letter queue.
    pub dead_lettered: u64,
    /// Messages whose answer halted the pump, made visible again at once.
    pub halted: u64,
    /// Messages received as the pump stopped, made visible again unstarted — and the
    /// messages of a FIFO group held behind one that was not deleted, sent back to come
    /// after it.
    pub returned_unstarted: u64,
    /// Settlements SQS did not take (a receipt handle expired, SQS out of reach): those
    /// messages come back after their visibility timeout.
    pub unconfirmed: u64,
}

/// Why a pump stopped before its shutdown.
#[derive(Debug)]
#[non_exhaustive]
pub enum Stopped {
    /// A handler's answer was [`Settlement::Halt`]: a deployment fault that every message
    /// would meet. That message was made visible again; the pump finished the others.
    Halted {
        /// The answer, as `Debug` prints it.
        answer: String,
        /// What the pump did before.
        report: Report,
    },
    /// SQS refused a settlement for good (no permission, no such queue, a KMS key the role
    /// cannot use); the messages not deleted come back after their visibility timeout.
    Broker {
        /// The refusal.
        failure: String,
        /// What the pump did before.
        report: Report,
    },
    /// The pump cannot run this queue.
    Unsuitable {
        /// Why.
        reason: String,
    },
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stopped::Halted { answer, .. } => write!(
                f,
                "the consumer halted: a handler answered {answer}, which every message would \
                 meet until the deployment is fixed"
            ),
            Stopped::Broker { failure, .. } => write!(f, "the SQS consumer failed: {failure}"),
            Stopped::Unsuitable { reason } => f.write_str(reason),
        }
    }
}

impl std::error::Error for Stopped {}

/// Runs handlers on SQS messages and settles each by the handler's answer: how many at
/// once, how retries wait, how long a receive waits.
#[derive(Debug, Clone, Copy)]
pub struct Pump {
    max_in_hand: usize,
    redelivery: Redelivery,
    outage: Redelivery,
    wait_time: Duration,
    progress_every: Option<Duration>,
}

impl Default for Pump {
    fn default() -> Self {
        Self::new()
    }
}

impl Pump {
    /// 10 messages in hand, [`Redelivery::DEFAULT`], [`Outage::DEFAULT`], receives waiting
    /// up to 10 s, visibility extended every half the queue's visibility timeout.
    pub const fn new() -> Self {
        Self {
            max_in_hand: 10,
            redelivery: Redelivery::DEFAULT,
            outage: Outage::DEFAULT,
            wait_time: Duration::from_secs(10),
            progress_every: None,
        }
    }

    /// How many handlers run at once; a receive asks for at most the free ones (and SQS for
    /// at most 10 at a time). At least 1.
    pub const fn max_in_hand(self, max_in_hand: usize) -> Self {
        Self {
            max_in_hand: if max_in_hand == 0 { 1 } else { max_in_hand },
            ..self
        }
    }

    /// How long a retried message stays invisible before SQS delivers it again, by its
    /// receive count. SQS counts in whole seconds: a delay is rounded up to one.
    pub const fn redelivery(self, redelivery: Redelivery) -> Self {
        Self { redelivery, ..self }
    }

    /// How long the pump starts no handler after a message that needed a new database
    /// connection ([`Outage`]): a pause per such message in a row, then one tries alone. The
    /// messages received meanwhile (no more than the free slots) wait in hand, their
    /// visibility extended, rather than count a receive each time they come back.
    pub const fn outage(self, outage: Redelivery) -> Self {
        Self { outage, ..self }
    }

    /// How long a receive waits for messages (`WaitTimeSeconds`, whole seconds from 1 to 20),
    /// and a stopping pump at most for a receive in flight.
    pub const fn wait_time(self, wait_time: Duration) -> Self {
        Self { wait_time, ..self }
    }

    /// How often a running handler's message has its visibility extended, instead of half
    /// the queue's visibility timeout. Keep it well below the timeout.
    pub const fn progress_every(self, interval: Duration) -> Self {
        Self {
            progress_every: Some(interval),
            ..self
        }
    }

    /// Reads the queue at `url`: its visibility timeout, whether it is FIFO, and its redrive
    /// policy — the dead-letter queue dead letters go to, and the `maxReceiveCount` after
    /// which SQS moves a message there itself. Warns when a database outage shorter than
    /// [`OUTAGE_TO_RIDE_OUT`](pump::OUTAGE_TO_RIDE_OUT) can spend `maxReceiveCount` under
    /// this pump's redelivery delays ([`pump::outage_tolerance`]).
    ///
    /// # Errors
    /// [`Stopped::Unsuitable`] when the queue cannot be read, or has no redrive policy (a
    /// dead letter would have nowhere to go, and a retried message no bound on its
    /// receives).
    pub async fn queue(&self, client: &Client, url: &str) -> Result<Queue, Stopped> {
        let unsuitable = |reason: String| Stopped::Unsuitable { reason };
        let output = client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .map_err(|e| unsuitable(format!("reading the queue {url}: {}", described(&e))))?;
        let attributes = output.attributes.unwrap_or_default();
        let get = |name: QueueAttributeName| attributes.get(&name).map(String::as_str);
        let name = url.rsplit('/').next().unwrap_or(url).to_owned();
        let visibility_timeout = get(QueueAttributeName::VisibilityTimeout)
            .and_then(|seconds| seconds.parse().ok())
            .map_or(Duration::from_secs(30), Duration::from_secs);
        let policy = get(QueueAttributeName::RedrivePolicy).ok_or_else(|| {
            unsuitable(format!(
                "the queue {name} has no redrive policy: a dead letter would have nowhere to \
                 go, and a retried message no bound on its receives; give it one \
                 (a dead-letter queue and maxReceiveCount)"
            ))
        })?;
        let (target, max_receive_count) = redrive_policy(policy).ok_or_else(|| {
            unsuitable(format!(
                "the queue {name}'s redrive policy is not understood: {policy}"
            ))
        })?;
        // arn:aws:sqs:<region>:<account>:<name>
        let mut arn = target.rsplitn(3, ':');
        let (dead_name, account) = (arn.next().unwrap_or_default(), arn.next());
        let dead_letter_url = client
            .get_queue_url()
            .queue_name(dead_name)
            .set_queue_owner_aws_account_id(account.map(str::to_owned))
            .send()
            .await
            .map_err(|e| {
                unsuitable(format!(
                    "the dead-letter queue {target} of {name}: {}",
                    described(&e)
                ))
            })?
            .queue_url
            .unwrap_or_default();
        pump::warn_short_tolerance(
            &format!("the queue {name}"),
            &self.redelivery,
            max_receive_count,
        );
        Ok(Queue {
            url: url.to_owned(),
            fifo: name.ends_with(".fifo"),
            name,
            visibility_timeout,
            max_receive_count,
            dead_letter_fifo: dead_name.ends_with(".fifo"),
            dead_letter_url,
        })
    }

    /// Runs `handler` on each message of `queue`, up to [`Pump::max_in_hand`] at once, and
    /// settles each by its answer, until `shutdown` completes or the handler's answer says
    /// [`Settlement::Halt`].
    ///
    /// A handler that panics settles its own message only ([`Settlement::of_panic`]): the
    /// runtime rolled its transaction back as the panic unwound, and the message is made
    /// visible again after the redelivery's delay.
    ///
    /// # Errors
    /// [`Stopped::Halted`] when an answer halted the pump; [`Stopped::Broker`] when SQS
    /// refused a settlement for good.
    pub async fn run<H, F, A, S>(
        &self,
        client: &Client,
        queue: &Queue,
        shutdown: S,
        handler: H,
    ) -> Result<Report, Stopped>
    where
        H: Fn(Message) -> F,
        F: Future<Output = A>,
        A: Settle + std::fmt::Debug,
        S: Future<Output = ()>,
    {
        let settings = Settings {
            redelivery: self.redelivery,
            progress_every: self
                .progress_every
                .unwrap_or(queue.visibility_timeout / 2)
                .max(Duration::from_millis(100)),
        };
        let outage = Outage::new(self.outage);
        let wait_seconds = i32::try_from(self.wait_time.as_secs().clamp(1, 20)).unwrap_or(20);
        let mut receiving = source::Receiving::new(client, queue, wait_seconds, self.max_in_hand);
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let (settings, outage, handler, stopping) = (&settings, &outage, &handler, &stopping);
        let ended = pump::run(
            &mut receiving,
            shutdown,
            &stop,
            |delivery| work(handler, settings, client, queue, outage, stopping, delivery),
            |message, halted| give_back(client, queue, message, halted),
        )
        .await;
        let counts = ended.counts;
        let report = Report {
            acked: counts.acked,
            retried: counts.retried,
            dead_lettered: counts.dead_lettered,
            halted: counts.halted,
            returned_unstarted: counts.returned_unstarted,
            unconfirmed: counts.unsettled,
        };
        match (ended.halted, ended.failed) {
            (Some(answer), _) => Err(Stopped::Halted { answer, report }),
            (None, Some(failure)) => Err(Stopped::Broker { failure, report }),
            (None, None) => Ok(report),
        }
    }
}

/// The dead-letter queue's ARN and `maxReceiveCount` of a redrive policy (JSON, the count a
/// number or a string).
fn redrive_policy(policy: &str) -> Option<(String, u32)> {
    let policy: serde_json::Value = serde_json::from_str(policy).ok()?;
    let target = policy.get("deadLetterTargetArn")?.as_str()?.to_owned();
    let count = match policy.get("maxReceiveCount")? {
        serde_json::Value::Number(n) => u32::try_from(n.as_u64()?).ok()?,
        serde_json::Value::String(s) => s.parse().ok()?,
        _ => return None,
    };
    Some((target, count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redrive_policies_are_read_with_either_count() {
        let arn = "arn:aws:sqs:eu-west-1:123456789012:credits-dead";
        assert_eq!(
            redrive_policy(&format!(
                r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":5}}"#
            )),
            Some((arn.to_owned(), 5))
        );
        assert_eq!(
            redrive_policy(&format!(
                r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"7"}}"#
            )),
            Some((arn.to_owned(), 7))
        );
        assert_eq!(redrive_policy(r#"{"maxReceiveCount":5}"#), None);
    }

    #[test]
    fn keys_prefer_the_senders_id() {
        use aws_sdk_sqs::types::MessageAttributeValue;
        let plain = Message::builder().message_id("m-1").build();
        assert_eq!(key(&plain).unwrap(), MessageKey::text("m-1").unwrap());
        // Not the deduplication id: content-based, it is the body's hash.
        let fifo = Message::builder()
            .message_id("m-2")
            .attributes(
                MessageSystemAttributeName::MessageDeduplicationId,
                "order-7",
            )
            .build();
        assert_eq!(key(&fifo).unwrap(), MessageKey::text("m-2").unwrap());
        let sent = Message::builder()
            .message_id("m-3")
            .attributes(
                MessageSystemAttributeName::MessageDeduplicationId,
                "order-7",
            )
            .message_attributes(
                MESSAGE_ID,
                MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value("outbox-1")
                    .build()
                    .unwrap(),
            )
            .build();
        assert_eq!(key(&sent).unwrap(), MessageKey::text("outbox-1").unwrap());
        assert!(matches!(
            key(&Message::builder().build()),
            Err(KeyError::Missing { .. })
        ));
    }
}
