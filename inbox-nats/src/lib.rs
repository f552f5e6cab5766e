//! NATS JetStream consumers for `inbox-diesel` handlers, through [async-nats]: each message
//! is settled by what the handler answered ([`Settle`]), on a durable pull consumer with
//! explicit acknowledgements.
//!
//! ```no_run
//! use inbox_diesel::Outcome;
//! use inbox_nats::{Pump, key};
//!
//! # async fn credit(key: inbox_diesel::MessageKey, body: &[u8]) -> Result<Outcome<()>, inbox_diesel::Error> { Ok(Outcome::Processed(())) }
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let jetstream =
//!     inbox_nats::connect("nats://127.0.0.1:4222", async_nats::ConnectOptions::new()).await?;
//! let pump = Pump::new().max_ack_pending(32);
//! // The durable pull consumer `credit-service` of the stream CREDITS, created if missing.
//! let consumer = pump.consumer(&jetstream, "CREDITS", "credit-service").await?;
//! // Until the process is asked to stop (`tokio::signal::ctrl_c()`, say).
//! let shutdown = std::future::pending::<()>();
//! let report = pump
//!     .run(&jetstream, &consumer, shutdown, |message| async move {
//!         // The publisher's Nats-Msg-Id, else the stream, the message's stream sequence and
//!         // the time the stream stored it.
//!         let key = match key(&message) {
//!             Ok(key) => key,
//!             Err(invalid) => return Err(inbox_diesel::Error::InvalidKey(invalid)),
//!         };
//!         credit(key, &message.payload).await // an #[idempotent] handler, say
//!     })
//!     .await?;
//! println!("{report:?}");
//! # Ok(())
//! # }
//! ```
//!
//! | the handler answered | [`Settlement`] | what the pump does |
//! |---|---|---|
//! | `Processed`, `Duplicate` | `Ack` | `AckKind::Ack` |
//! | `InFlight` on an uncommitted marker, a transient failure | `Retry` | `AckKind::Nak` with [`Redelivery`]'s delay: JetStream redelivers the message after it |
//! | `InFlight` on a live claim (claim mode) | `Held` | as `Retry`; from the message's second delivery on, the delay is at least the claim's lease left ([`Redelivery::delay_of`]) |
//! | a failure of the connection (`Action::Reconnect`) | `Retry { reconnect: true }` | as `Retry`; the connection is the handler's, and the handler drops it (see below) |
//! | a business constraint, an invalid key, a stale claim | `DeadLetter` | `AckKind::Term`: never delivered to this consumer again |
//! | misuse, a schema fault, a missing privilege | `Halt` | stops pulling, `AckKind::Nak` without delay, finishes the messages in hand, and returns [`Stopped::Halted`] |
//!
//! Every settlement is sent with a reply subject and the pump waits for the server's
//! confirmation (async-nats' `double_ack_with`): one round trip per message, and a
//! [`Report`] that counts what the server took. A settlement the server does not confirm
//! (the connection was down) is counted in [`Report::unconfirmed`]; JetStream redelivers that
//! message after `ack_wait`, and the inbox answers `Duplicate` if it had been processed.
//!
//! **Keys.** [`key`] is the publisher's `Nats-Msg-Id`, else the stream, the message's
//! stream sequence and the time the stream stored it (a stream deleted and created again
//! under its name numbers from 1 again: the time tells its messages apart). JetStream itself drops a message whose `Nats-Msg-Id` it stored within the
//! stream's duplicate window (two minutes by default); the inbox catches what gets past it —
//! a publisher's retry after the window, and every redelivery.
//!
//! **Delays.** JetStream delays a redelivery itself: a retried message is `Nak`ed with the
//! delay for its delivery number (`delivered` in the message's metadata, see
//! [`delivery_count`]), and its handler's slot is free at once. Until it is redelivered the
//! message still counts against the consumer's `max_ack_pending`: a consumer whose every
//! pending slot holds a message waiting out its delay is delivered nothing else meanwhile,
//! so size `max_ack_pending` above the number of messages you expect to be retrying at once.
//! The consumer's `max_deliver` bounds the deliveries: a message past it is no longer
//! delivered, and the server publishes the advisory
//! `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>`. A claim-mode message
//! found held a second time waits until the claim's lease ends: a claim whose holder
//! crashed then costs the message three deliveries of `max_deliver`, whatever the lease.
//!
//! **Heartbeats.** While a handler runs, the pump sends `AckKind::Progress` for its message
//! every half of the consumer's `ack_wait` ([`Pump::progress_every`] to choose): the server
//! restarts the message's ack timer each time, and does not redeliver it to another consumer
//! while the handler works, however long that takes. A process that dies stops them, and the
//! message is redelivered `ack_wait` later. A handler that hangs keeps its message and its
//! slot for as long as the pump runs: give handlers timeouts of their own. The slots are
//! the durable consumer's `max_ack_pending`, which every instance on it shares: an
//! operator's trial with every tenth handler hanging (two instances, `max_ack_pending` 8)
//! applied 63 of 100 in 45 s, the hung ones holding back healthy messages that another,
//! healthy instance could not take either.
//!
//! **Reconnect.** The database connection is the handler's, which the pump cannot reach: on
//! an error whose action is `Action::Reconnect` (a connection lost, a read-only session after
//! a failover, prepared statements dropped by a pooler) the runtime puts the connection's
//! transaction manager in error, and the handler's pool (r2d2, deadpool, bb8) discards
//! it when it comes back: the redelivery runs on a new session. A handler that keeps a
//! connection of its own, without a pool, reconnects it there, or every redelivery meets
//! the same session and fails the same way until the consumer's `max_deliver` is used
//! up. The database itself may be what fails (a pool pointed at a
//! read-only standby, a server down): after such a message the pump pulls nothing and
//! starts no handler for a pause, doubling while it lasts, then lets one message try alone
//! ([`Pump::outage`]); the messages in hand wait for it, reported in progress. The NATS connection is async-nats': it reconnects by itself, and the
//! pump carries on when it is back (tested: a server killed with `SIGKILL` while a handler
//! held a committed message, started again a second later — the same pump went on, each
//! message applied once). JetStream keeps what it stored on file storage; a stream in
//! memory loses its messages with the server.
//!
//! **Pool checkouts.** A closure that takes the handler's connection from a pool (bb8,
//! deadpool, r2d2) before calling it answers a failed checkout with
//! [`inbox_diesel::Error::checkout`]: nothing ran, and its class (`ConnectionLost`) settles
//! it as the database's outage — retried after a delay, the pump pausing as above — never as
//! a dead letter: `pool.get().await.map_err(inbox_diesel::Error::checkout)?`.
//!
//! **Shutdown.** When `shutdown` completes (or the pump halts), the pump stops pulling: it
//! unsubscribes from its pull requests' replies, `Nak`s without delay the messages that had
//! arrived but that no handler had started (another consumer takes them at once), lets the
//! handlers in hand finish and settle, and returns. A consumer deleted on the server (or its
//! stream) stops the pump with [`Stopped::Deleted`].
//!
//! **Dead letters.** JetStream has no dead-letter queue: a terminated message is never
//! delivered to this consumer again, and the server publishes the advisory
//! `$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.<stream>.<consumer>`, whose `stream_seq`
//! names it. In a stream with the default limits retention the message stays there: an
//! application that keeps dead letters subscribes to that advisory (and to
//! `MAX_DELIVERIES`) and copies the message by its sequence.
//!
//! **Consumers and retention.** [`Pump::consumer`] creates a durable pull consumer with
//! explicit acknowledgements, `ack_wait` 30 s, `max_deliver` 20 and the pump's
//! `max_ack_pending` ([`Pump::consumer_config`] to start from those and change more). A
//! marker must outlive every delivery of its message: JetStream redelivers a message at
//! most `max_deliver` times, each after at most `ack_wait` or the longest `Nak` delay, and
//! [`Pump::retention`] is that window ([`broker::jetstream_retention`] of the longer of the
//! two). Add the stream's `max_age` ([`Retention::message_ttl`]) where a new consumer may
//! replay the stream from its start, and a margin for replays by hand.
//!
//! **Traces.** Each message is handled and settled in one span,
//! [`process_span`]`("nats", stream, delivery_count)`:
//! named `process {stream}` in the OpenTelemetry messaging conventions, with the message's
//! `Nats-Msg-Id` (else its stream sequence), the handler's consumer, the stored id, the
//! outcome and the settlement recorded on it ([`inbox_diesel::telemetry`]).
//!
//! [async-nats]: https://docs.rs/async-nats

pub mod outbox;

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::{self, BatchConfig};
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer};
use async_nats::jetstream::context::{ConsumerInfoError, ConsumerInfoErrorKind};
use async_nats::jetstream::message::Acker;
use async_nats::jetstream::stream::{ConsumerError, ConsumerErrorKind};
use async_nats::jetstream::{AckKind, Context, ErrorCode, Message};
use async_nats::{ConnectOptions, StatusCode};
use futures_util::future::{Fuse, FusedFuture, FutureExt};
use futures_util::stream::StreamExt;
use inbox_diesel::pump::{self, InHand, Processed, process};
use inbox_diesel::telemetry::process_span;
use inbox_diesel::{
    KeyError, MessageKey, Outage, Redelivery, Retention, Settle, Settlement, broker,
};
use tokio::time::Instant;
use tracing::Instrument;

mod report;
mod source;
mod window;
mod work;

pub use report::{Report, Stopped};
use source::*;
use window::*;
use work::*;

/// How long one pull request waits on the server for messages before it expires and the
/// pump sends the next. Short enough that a request lost with a server restart is replaced
/// soon, long enough that an idle consumer costs one request every few seconds.
const PULL_EXPIRES: Duration = Duration::from_secs(10);
/// How long past its expiry the pump waits for a pull request's end (status 408) before it
/// takes the request for lost.
const PULL_GRACE: Duration = Duration::from_secs(2);
/// The pause before pulling again after the server refused or could not take a pull request.
const PULL_PAUSE: Duration = Duration::from_secs(1);
/// How long a stopping pump waits for the replies still on their way once it unsubscribed.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// JetStream's `ack_wait` for a consumer created without one.
const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// Connects to the NATS server at `address` and returns its JetStream context.
///
/// # Errors
/// [`Unreachable::Server`], naming the address, when no connection could be made (nothing
/// listens there, a TLS or authentication failure: its `source()` says which);
/// [`Unreachable::NoJetStream`] when the server runs without JetStream.
pub async fn connect(address: &str, options: ConnectOptions) -> Result<Context, Unreachable> {
    let client = options
        .connect(address)
        .await
        .map_err(|source| Unreachable::Server {
            address: address.to_owned(),
            source,
        })?;
    if !client.server_info().jetstream {
        return Err(Unreachable::NoJetStream {
            address: address.to_owned(),
        });
    }
    Ok(async_nats::jetstream::new(client))
}

/// Why [`connect`] returned no JetStream context.
#[derive(Debug)]
#[non_exhaustive]
pub enum Unreachable {
    /// No connection to a NATS server could be made at the address.
    Server {
        /// The address given to [`connect`].
        address: String,
        /// async-nats' error: refused, timed out, TLS, authentication.
        source: async_nats::ConnectError,
    },
    /// The server answered, but runs without JetStream (`nats-server -js` enables it).
    NoJetStream {
        /// The address given to [`connect`].
        address: String,
    },
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // async-nats' reason is the `source()`: reporters print it after this.
            Unreachable::Server { address, .. } => {
                write!(f, "cannot connect to the NATS server at {address}")
            }
            Unreachable::NoJetStream { address } => write!(
                f,
                "the NATS server at {address} runs without JetStream (start it with `-js`)"
            ),
        }
    }
}

impl std::error::Error for Unreachable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Unreachable::Server { source, .. } => Some(source),
            Unreachable::NoJetStream { .. } => None,
        }
    }
}

/// The key of a JetStream message ([`inbox_diesel::broker::jetstream`]): its `Nats-Msg-Id`
/// header when the publisher set one — the id JetStream deduplicates by within the stream's
/// duplicate window, and the inbox after it — else the stream, the message's stream
/// sequence and the time the stream stored it (`published`): a stream deleted and created
/// again under its name numbers from 1 again, and its messages were answered `Duplicate` by
/// the old stream's markers — acknowledged, never applied.
///
/// Without `Nats-Msg-Id`, a publisher's retry is stored as a new message with a sequence of
/// its own, and the inbox applies it again: only redeliveries of one stored message are
/// recognised. Publishers that retry must set `Nats-Msg-Id` (the outbox's sink does).
///
/// # Errors
/// [`KeyError::Missing`] for a message without JetStream metadata (one that no JetStream
/// consumer delivered); [`KeyError::TooLong`] for an id past [`MessageKey::MAX_LEN`].
pub fn key(message: &Message) -> Result<MessageKey, KeyError> {
    let msg_id = message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
        .map(|id| id.as_str());
    let info = message.info().map_err(|_| KeyError::Missing {
        field: "JetStream metadata (stream and sequence)",
    })?;
    broker::jetstream(
        msg_id,
        info.stream,
        info.stream_sequence,
        info.published.unix_timestamp_nanos(),
    )
}

/// How many times this message has been delivered, this time included: `delivered` in its
/// metadata; 1 for a message without JetStream metadata.
pub fn delivery_count(message: &Message) -> u32 {
    message
        .info()
        .ok()
        .and_then(|info| u32::try_from(info.delivered).ok())
        .map_or(1, |count| count.max(1))
}

/// A consumer loop's settings: how many messages it has in hand at once, how long a retried
/// message waits, how often a running handler's message is kept alive, and the settings of
/// the consumers it creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pump {
    max_ack_pending: usize,
    redelivery: Redelivery,
    outage: Redelivery,
    progress_every: Option<Duration>,
    ack_wait: Duration,
    max_deliver: i64,
    slow_start: bool,
}

impl Default for Pump {
    fn default() -> Self {
        Self::new()
    }
}

impl Pump {
    /// 16 messages in hand, [`Redelivery::DEFAULT`], [`Outage::DEFAULT`], progress every half
    /// `ack_wait`; consumers
    /// created with `ack_wait` 30 s and `max_deliver` 20 (RabbitMQ 4's default delivery
    /// limit: with [`Redelivery::DEFAULT`] a message outlives a database outage of almost
    /// an hour, [`Pump::outage_tolerance`]).
    pub const fn new() -> Self {
        Self {
            max_ack_pending: 16,
            redelivery: Redelivery::DEFAULT,
            outage: Outage::DEFAULT,
            progress_every: None,
            ack_wait: DEFAULT_ACK_WAIT,
            max_deliver: 20,
            slow_start: true,
        }
    }

    /// Whether the pump takes one message at a time after it starts, and again while a
    /// stranger's redelivery arrives — a message delivered before that this pump did not
    /// hand back itself —, widening by doubling with each handler's answer (on by default).
    /// A message that kills the process then dies alone, instead of taking the messages
    /// pulled with it down again at every restart until their `max_deliver` ran out.
    ///
    /// While the window is one, a slow handler holds the pump as long as it runs: bound a
    /// handler's slow calls (an HTTP client's timeout) so that it stays short. Off, the pump
    /// takes `max_ack_pending` at once from the start.
    pub const fn slow_start(self, slow_start: bool) -> Self {
        Self { slow_start, ..self }
    }

    /// How many handlers run at once (the pump pulls no more messages than it has free
    /// slots), and the `max_ack_pending` of the consumers [`Pump::consumer`] creates. Several
    /// instances sharing one durable consumer share its `max_ack_pending`: give such a
    /// consumer the sum ([`Pump::consumer_config`]). At least 1.
    pub const fn max_ack_pending(self, max_ack_pending: usize) -> Self {
        Self {
            max_ack_pending: if max_ack_pending == 0 {
                1
            } else {
                max_ack_pending
            },
            ..self
        }
    }

    /// How long a retried message waits before JetStream redelivers it.
    pub const fn redelivery(self, redelivery: Redelivery) -> Self {
        Self { redelivery, ..self }
    }

    /// How long the pump starts no handler, and pulls nothing, after a message that needed a
    /// new database connection ([`Outage`]): a pause per such message in a row, then one
    /// message tries alone. The messages in hand meanwhile wait, reported in progress, not
    /// handed back: each hand-back would count against `max_deliver`.
    pub const fn outage(self, outage: Redelivery) -> Self {
        Self { outage, ..self }
    }

    /// How often a message whose handler runs is reported in progress (`AckKind::Progress`),
    /// instead of half the consumer's `ack_wait`. Keep it well below `ack_wait`. At least
    /// 1 ms.
    pub const fn progress_every(self, interval: Duration) -> Self {
        Self {
            progress_every: Some(interval),
            ..self
        }
    }

    /// The `ack_wait` of the consumers [`Pump::consumer`] creates: how long JetStream waits
    /// for a settlement (or a progress report) before it redelivers the message.
    pub const fn ack_wait(self, ack_wait: Duration) -> Self {
        Self { ack_wait, ..self }
    }

    /// The `max_deliver` of the consumers [`Pump::consumer`] creates: how many times
    /// JetStream delivers a message at most. -1 is JetStream's "unlimited", which leaves
    /// markers no retention short of forever ([`Pump::retention`]).
    pub const fn max_deliver(self, max_deliver: i64) -> Self {
        Self {
            max_deliver,
            ..self
        }
    }

    /// How long the inbox must keep a marker for the redeliveries of the consumers this pump
    /// creates: at most `max_deliver` deliveries, each redelivered after at most `ack_wait`
    /// (no settlement) or the longest [`Redelivery`] delay (a retry). Such a consumer reads
    /// the stream from its start: deleted (by an operator, an `inactive_threshold`) and
    /// created again, it delivers every message the stream still keeps, and one whose marker
    /// was purged is applied again. Add the stream's `max_age` ([`Retention::message_ttl`];
    /// a stream that keeps messages for ever needs its markers for ever), and a replay
    /// margin. It reads this pump's settings, not a consumer's: for a consumer created
    /// elsewhere, compute it from that consumer's `ack_wait` and `max_deliver`
    /// ([`broker::jetstream_retention`]).
    pub fn retention(&self) -> Retention {
        let longest_wait = self.ack_wait.max(self.redelivery.delay(u32::MAX));
        broker::jetstream_retention(longest_wait, self.max_deliver)
    }

    /// The longest database outage a message outlives before the `max_deliver` of the
    /// consumers this pump creates is spent, at worst, under its redelivery delays
    /// ([`pump::outage_tolerance`]). [`Pump::consumer`] warns when it creates a consumer
    /// whose tolerance is under [`OUTAGE_TO_RIDE_OUT`](pump::OUTAGE_TO_RIDE_OUT).
    pub fn outage_tolerance(&self) -> Duration {
        pump::outage_tolerance(&self.redelivery, self.deliveries())
    }

    /// The `max_deliver` of the consumers this pump creates; JetStream's "unlimited" (0 or
    /// less) as `u32::MAX`.
    fn deliveries(&self) -> u32 {
        u32::try_from(self.max_deliver)
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or(u32::MAX)
    }

    /// The configuration [`Pump::consumer`] creates a consumer with: a durable pull consumer
    /// named `durable` over the whole stream, explicit acknowledgements, and this pump's
    /// `ack_wait`, `max_deliver` and `max_ack_pending`. Start from it to set more (a
    /// `filter_subject`, a higher `max_ack_pending` for several instances) and create the
    /// consumer with async-nats.
    pub fn consumer_config(&self, durable: &str) -> pull::Config {
        pull::Config {
            durable_name: Some(durable.to_owned()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            max_deliver: self.max_deliver,
            max_ack_pending: i64::try_from(self.max_ack_pending).unwrap_or(i64::MAX),
            ..pull::Config::default()
        }
    }

    /// The durable pull consumer `durable` of `stream`, created with
    /// [`Pump::consumer_config`] if it does not exist. An existing consumer is taken as it is:
    /// the pump's settings do not change it (its ack policy is checked by [`Pump::run`]).
    ///
    /// # Errors
    /// The server's refusal (no such stream, a name in use by a push consumer), or no answer.
    pub async fn consumer(
        &self,
        jetstream: &Context,
        stream: &str,
        durable: &str,
    ) -> Result<PullConsumer, ConsumerError> {
        match jetstream.get_consumer_from_stream(durable, stream).await {
            Err(e) if is_consumer_not_found(&e) => {
                pump::warn_short_tolerance(
                    &format!("the consumer {durable} of {stream}"),
                    &self.redelivery,
                    self.deliveries(),
                );
                jetstream
                    .create_consumer_on_stream(self.consumer_config(durable), stream)
                    .await
            }
            found => found,
        }
    }

    /// Runs `handler` on each message of `consumer`, up to `max_ack_pending` at once, and
    /// settles each by its answer, until `shutdown` completes, the handler's answer says
    /// [`Settlement::Halt`], or the consumer is deleted.
    ///
    /// A handler that panics settles its own message only ([`Settlement::of_panic`]): the
    /// runtime rolled its transaction back as the panic unwound, the message is handed back
    /// (`Nak` with the redelivery's delay, counted as retried), and the pump goes on with the
    /// others; the consumer's `max_deliver` ends a message that panics every time.
    ///
    /// A death the process does not survive (`panic = "abort"`, an out-of-memory kill)
    /// cannot be caught, and takes every message in hand with it. So the pump starts with
    /// one message at a time, doubling with each answer up to `max_ack_pending`,
    /// and goes back to one whenever a message arrives that was delivered before and that it
    /// did not hand back itself: after a restart, the message that killed the process is
    /// delivered alone and dies alone, and the others lose only the delivery of the first
    /// death.
    ///
    /// # Errors
    /// [`Stopped::Halted`] when an answer halted the pump; [`Stopped::Deleted`] when the
    /// consumer or its stream was deleted; [`Stopped::Broker`] when the client's connection
    /// closed for good or the server refused the pump's pull requests;
    /// [`Stopped::Unsuitable`] for a consumer whose acknowledgement policy is not
    /// `AckPolicy::Explicit`.
    pub async fn run<H, F, A, S>(
        &self,
        jetstream: &Context,
        consumer: &PullConsumer,
        shutdown: S,
        handler: H,
    ) -> Result<Report, Stopped>
    where
        H: Fn(Message) -> F,
        F: Future<Output = A>,
        A: Settle + std::fmt::Debug,
        S: Future<Output = ()>,
    {
        let config = &consumer.cached_info().config;
        if config.ack_policy != AckPolicy::Explicit {
            // `All` would acknowledge every earlier message still in another handler's hands.
            return Err(Stopped::Unsuitable {
                reason: format!(
                    "the consumer `{}` acknowledges with {:?}; the pump settles each message on \
                     its own and needs AckPolicy::Explicit",
                    consumer.cached_info().name,
                    config.ack_policy
                ),
            });
        }
        let ack_wait = if config.ack_wait.is_zero() {
            DEFAULT_ACK_WAIT
        } else {
            config.ack_wait
        };
        let settings = Settings {
            redelivery: self.redelivery,
            progress_every: self
                .progress_every
                .unwrap_or(ack_wait / 2)
                .max(Duration::from_millis(1)),
        };
        // A consumer may cap what one pull request asks for; a request past a cap is refused.
        let max_batch = usize::try_from(config.max_batch)
            .ok()
            .filter(|max| *max > 0)
            .unwrap_or(usize::MAX);
        let expires = if config.max_expires.is_zero() {
            PULL_EXPIRES
        } else {
            PULL_EXPIRES.min(config.max_expires)
        };

        let client = jetstream.client();
        let inbox = client.new_inbox();
        let replies =
            client
                .subscribe(format!("{inbox}.*"))
                .await
                .map_err(|e| Stopped::Broker {
                    failure: format!("subscribing to the pull replies failed: {e}"),
                    report: Report::default(),
                })?;
        let outage = Outage::new(self.outage);
        let outage = &outage;
        let mut pulled = Pulled {
            jetstream,
            consumer,
            outage,
            inbox,
            replies,
            window: Window::new(self.max_ack_pending, self.slow_start),
            max_ack_pending: self.max_ack_pending,
            max_batch,
            expires,
            pull: None,
            requests: 0,
            pull_after: Instant::now(),
            check: Fuse::terminated(),
            drain_deadline: None,
        };
        // Set once the pump stops pulling: a message waiting at the outage gate goes back.
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let handler = &handler;
        let ended = pump::run(
            &mut pulled,
            shutdown,
            &stop,
            |message| work(handler, settings, outage, &stopping, message),
            give_back,
        )
        .await;
        let report = Report::from(ended.counts);
        match (ended.end, ended.halted) {
            (Some(End::Broker(failure)), _) => Err(Stopped::Broker { failure, report }),
            (_, Some(answer)) => Err(Stopped::Halted { answer, report }),
            (Some(End::Deleted), None) => Err(Stopped::Deleted { report }),
            (None, None) => Ok(report),
        }
    }
}

fn is_consumer_not_found(error: &ConsumerError) -> bool {
    matches!(
        error.kind(),
        ConsumerErrorKind::JetStream(e) if e.error_code() == ErrorCode::CONSUMER_NOT_FOUND
    )
}

fn acker(message: &Message) -> Acker {
    Acker::new(message.context.clone(), message.reply.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_request_ends_are_told_apart() {
        let of = |code: u16, description: &str| {
            PullEnd::of(StatusCode::from_u16(code).unwrap(), description)
        };
        assert_eq!(of(408, "Request Timeout"), PullEnd::Expired);
        assert_eq!(of(404, "No Messages"), PullEnd::Expired);
        assert_eq!(of(409, "Consumer Deleted"), PullEnd::ConsumerDeleted);
        assert_eq!(of(409, "Exceeded MaxRequestBatch of 10"), PullEnd::Refused);
        assert_eq!(
            of(409, "Exceeded MaxRequestExpires of 1s"),
            PullEnd::Refused
        );
        assert_eq!(of(409, "Consumer is push based"), PullEnd::Refused);
        assert_eq!(of(409, "Exceeded MaxWaiting"), PullEnd::Other);
        assert_eq!(of(409, "Leadership Change"), PullEnd::Other);
        assert_eq!(of(503, ""), PullEnd::NoResponders);
    }

    #[test]
    fn consumers_are_created_for_explicit_acknowledgements() {
        let pump = Pump::new()
            .max_ack_pending(0)
            .ack_wait(Duration::from_secs(20))
            .max_deliver(5);
        let config = pump.consumer_config("credit-service");
        assert_eq!(config.durable_name.as_deref(), Some("credit-service"));
        assert_eq!(config.ack_policy, AckPolicy::Explicit);
        assert_eq!(config.ack_wait, Duration::from_secs(20));
        assert_eq!((config.max_deliver, config.max_ack_pending), (5, 1));
    }

    /// The window is the longer of `ack_wait` and the longest retry delay, per delivery.
    #[test]
    fn retention_covers_the_longest_wait_between_deliveries() {
        let pump = Pump::new()
            .ack_wait(Duration::from_secs(30))
            .max_deliver(10);
        // Redelivery::DEFAULT waits up to 5 minutes.
        assert_eq!(pump.retention().keep_for(), Duration::from_secs(10 * 300));
        let quick = pump.redelivery(Redelivery::exponential(
            Duration::from_millis(100),
            Duration::from_secs(1),
        ));
        assert_eq!(quick.retention().keep_for(), Duration::from_secs(10 * 30));
    }

    /// A pump runs on a multi-threaded runtime (`tokio::spawn`) when its handler's futures
    /// are `Send`.
    #[expect(
        dead_code,
        reason = "compiled, never called: the `Send` bound is the test"
    )]
    fn run_is_send<'a>(
        pump: &'a Pump,
        jetstream: &'a Context,
        consumer: &'a PullConsumer,
    ) -> impl Future<Output = Result<Report, Stopped>> + Send + 'a {
        pump.run(
            jetstream,
            consumer,
            std::future::pending(),
            |_message| async { Ok::<Settlement, Settlement>(Settlement::Ack) },
        )
    }
}
