//! RabbitMQ consumers for `inbox-diesel` handlers, through [lapin]: each delivery is settled
//! by what the handler answered ([`Settle`]), with manual acknowledgements.
//!
//! ```no_run
//! use inbox_diesel::{Outcome, Settle, Settlement};
//! use inbox_lapin::{Pump, key};
//!
//! # async fn credit(key: inbox_diesel::MessageKey, body: &[u8]) -> Result<Outcome<()>, inbox_diesel::Error> { Ok(Outcome::Processed(())) }
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let connection =
//!     lapin::Connection::connect("amqp://127.0.0.1:5672/%2f", Default::default()).await?;
//! let channel = connection.create_channel().await?;
//! let pump = Pump::new().prefetch(32);
//! let consumer = pump.subscribe(&channel, "credits", "credit-service").await?;
//! // Until the process is asked to stop (`tokio::signal::ctrl_c()`, say).
//! let shutdown = std::future::pending::<()>();
//! let report = pump
//!     .run(&channel, consumer, shutdown, |delivery| async move {
//!         // The publisher's message_id; a message without one is dead-lettered.
//!         let key = match key(&delivery) {
//!             Ok(key) => key,
//!             Err(missing) => return Err(inbox_diesel::Error::InvalidKey(missing)),
//!         };
//!         credit(key, &delivery.data).await // an #[idempotent] handler, say
//!     })
//!     .await?;
//! println!("{report:?}");
//! # Ok(())
//! # }
//! ```
//!
//! | the handler answered | [`Settlement`] | what the pump does |
//! |---|---|---|
//! | `Processed`, `Duplicate` | `Ack` | `basic.ack` |
//! | `InFlight` on an uncommitted marker, a transient failure | `Retry` | holds the delivery for [`Redelivery`]'s delay, then `basic.nack` with requeue |
//! | `InFlight` on a live claim (claim mode) | `Held` | as `Retry`; from the message's second delivery on, holds it until the claim's lease has ended ([`Redelivery::delay_of`]) |
//! | a failure of the connection (`Action::Reconnect`) | `Retry { reconnect: true }` | as `Retry`; the connection is the handler's, and the handler drops it (see below) |
//! | a business constraint, a missing or invalid key, a stale claim | `DeadLetter` | `basic.reject` without requeue: to the queue's dead-letter exchange, if it has one |
//! | misuse, a schema fault, a missing privilege | `Halt` | stops taking deliveries, cancels its consumers, requeues it, finishes those in hand, and returns [`Stopped::Halted`] |
//!
//! **Delays.** RabbitMQ has no delayed redelivery. The pump keeps a message it retries for
//! the delay, then requeues it: no topology to declare, and the delay is exact, but the
//! delivery holds one of the channel's `prefetch` slots while it waits (size `prefetch`
//! above the number of messages you expect to be retrying at once). The delivery count
//! comes from the quorum queue's `x-delivery-count` header (classic queues only say whether
//! the message was redelivered); bound redeliveries with the quorum queue's
//! `x-delivery-limit`, and keep markers that long
//! ([`broker::rabbitmq_quorum_retention`](inbox_diesel::broker::rabbitmq_quorum_retention)).
//! A claim-mode message found held a second time is held until the claim's lease ends (up
//! to `lease_ms`): a claim whose holder crashed then costs the message three deliveries of
//! the limit, whatever the lease; keep `lease_ms` below the broker's `consumer_timeout`
//! (30 minutes by default), which closes a channel that holds a delivery longer.
//!
//! **Reconnect.** The database connection is the handler's, which the pump cannot reach: on
//! an error whose action is `Action::Reconnect` (a connection lost, a read-only session after
//! a failover, prepared statements dropped by a pooler) the runtime puts the connection's
//! transaction manager in error, and the handler's pool (r2d2, deadpool, bb8) discards
//! it when it comes back: the redelivery runs on a new session. A handler that keeps a
//! connection of its own, without a pool, reconnects it there, or every redelivery meets
//! the same session and fails the same way until the queue's `x-delivery-limit`
//! dead-letters the message. The database itself may be what fails (a
//! pool pointed at a read-only standby, a server down): after such a delivery the pump
//! starts no handler for a pause, doubling while it lasts, then lets one delivery try
//! alone ([`Pump::outage`]). The others wait in hand meanwhile (each holds a `prefetch`
//! slot, so the broker sends no more): requeued, each turn of a long outage would count
//! against the queue's `x-delivery-limit`, and dead-letter messages that never ran. An
//! outage longer than the broker's `consumer_timeout` (30 minutes by default) ends the
//! channel as for a slow handler (below): one delivery counted per such spell.
//!
//! **A process that dies** (`panic = "abort"`, an out-of-memory kill, a handler that exits)
//! has every delivery it held counted once more. The pump starts with one delivery at a
//! time and widens once a message of its own was answered, and a message that was in hand
//! when a process died runs alone ([`Pump::slow_start`]): after a restart, the message that
//! killed the process comes alone and dies alone, and the others lose one delivery, the
//! first death's.
//!
//! **Pool checkouts.** A closure that takes the handler's connection from a pool (bb8,
//! deadpool, r2d2) before calling it answers a failed checkout with
//! [`inbox_diesel::Error::checkout`]: nothing ran, and its class (`ConnectionLost`) settles
//! it as the database's outage — retried after a delay, the pump pausing as above — never as
//! a dead letter: `pool.get().await.map_err(inbox_diesel::Error::checkout)?`.
//!
//! **Shutdown.** When `shutdown` completes (or the pump halts), the pump cancels its
//! consumers, lets the deliveries in hand finish and settle (a retry's delay cut short), and
//! requeues those the channel had buffered but no handler had started. A consumer the broker
//! ends (its queue deleted) stops the pump with [`Stopped::Cancelled`]. A pump whose future
//! is dropped instead (a `tokio::time::timeout` around `run`) settles nothing: what it held
//! stays unacknowledged on the channel until the channel closes — close it, or the
//! connection, with the pump; a new pump on the same channel never sees those deliveries.
//!
//! **The broker's faults.** A channel the broker closes — a handler slower than its
//! `consumer_timeout`, whose delivery stayed unacknowledged too long — and a connection that
//! fails — the broker killed or restarted — stop the pump with [`Stopped::Broker`]. What was
//! not acknowledged comes again, a delivery whose handler had committed included (counted in
//! [`Report::unsettled`]): the handler answers `Duplicate` and it is acknowledged then.
//! Restart the pump on a new connection (tested on a private broker killed with `SIGKILL`,
//! and one whose consumer timeout a handler outlived). Messages the broker never confirmed
//! to their publisher may not survive its crash: publish persistent messages with
//! confirms.
//!
//! **Traces.** Each delivery is handled and settled in one span,
//! [`process_span`]`("rabbitmq", queue, delivery_count)`: named `process {queue}` in the
//! OpenTelemetry messaging conventions, with the delivery's `message_id` and routing key,
//! the handler's consumer, the stored id, the outcome and the settlement recorded on it
//! ([`inbox_diesel::telemetry`]).
//!
//! [lapin]: https://docs.rs/lapin

pub mod outbox;

use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt;
use inbox_diesel::pump::{self, InHand, Processed, process};
use inbox_diesel::telemetry::{process_span, record_settlement};
use inbox_diesel::{KeyError, MessageKey, Outage, Redelivery, Settle, Settlement};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    BasicRejectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Consumer};
use tracing::Instrument;

mod consumers;
mod report;
mod topology;
mod window;
mod work;

use consumers::*;
pub use report::{Report, Stopped};
pub use topology::Topology;
use window::*;
use work::*;

/// The key of a delivery: its `message_id` property ([`inbox_diesel::broker::amqp`]).
///
/// # Errors
/// [`KeyError::Missing`] when the publisher left `message_id` unset or empty: the message
/// cannot be deduplicated, and is refused rather than given an id that would be new on every
/// redelivery.
pub fn key(delivery: &Delivery) -> Result<MessageKey, KeyError> {
    inbox_diesel::broker::amqp(
        delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str()),
    )
}

/// How many times this message has been delivered, this time included: the quorum queue's
/// `x-delivery-count` (the deliveries before this one) plus one; on a classic queue 2 for a
/// redelivery, 1 otherwise.
pub fn delivery_count(delivery: &Delivery) -> u32 {
    let before = delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get("x-delivery-count"))
        .and_then(|count| match count {
            AMQPValue::LongLongInt(n) => u32::try_from(*n).ok(),
            AMQPValue::LongInt(n) => u32::try_from(*n).ok(),
            AMQPValue::LongUInt(n) => Some(*n),
            AMQPValue::ShortInt(n) => u32::try_from(*n).ok(),
            AMQPValue::ShortUInt(n) => Some(u32::from(*n)),
            _ => None,
        });
    match before {
        Some(n) => n.saturating_add(1),
        None if delivery.redelivered => 2,
        None => 1,
    }
}

/// A consumer loop's settings: how many deliveries it has in hand at once, and how long a
/// retried message waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pump {
    prefetch: u16,
    redelivery: Redelivery,
    outage: Redelivery,
    slow_start: bool,
}

impl Default for Pump {
    fn default() -> Self {
        Self::new()
    }
}

impl Pump {
    /// 16 deliveries in hand, [`Redelivery::DEFAULT`], [`Outage::DEFAULT`].
    pub const fn new() -> Self {
        Self {
            prefetch: 16,
            redelivery: Redelivery::DEFAULT,
            outage: Outage::DEFAULT,
            slow_start: true,
        }
    }

    /// How many unacknowledged deliveries the broker sends the consumer (`basic.qos`), and
    /// how many handlers run at once, once the pump has started ([`Pump::slow_start`]). At
    /// least 1.
    pub const fn prefetch(self, prefetch: u16) -> Self {
        Self {
            prefetch: if prefetch == 0 { 1 } else { prefetch },
            ..self
        }
    }

    /// How long a retried message waits before it is requeued.
    pub const fn redelivery(self, redelivery: Redelivery) -> Self {
        Self { redelivery, ..self }
    }

    /// How long the pump starts no handler after a delivery that needed a new database
    /// connection ([`Outage`]): a pause per such delivery in a row, then one delivery tries
    /// alone.
    pub const fn outage(self, outage: Redelivery) -> Self {
        Self { outage, ..self }
    }

    /// Whether the pump starts narrow (the default): one delivery in hand after it starts,
    /// `prefetch` once a message of its own was answered; and whether a stranger's
    /// redelivery runs alone.
    ///
    /// A process that dies with deliveries in hand — a build with `panic = "abort"`, an
    /// out-of-memory kill, a handler that exits — has each of them delivered again, and each
    /// death counts against the queue's `x-delivery-limit`. RabbitMQ pushes up to `prefetch`
    /// deliveries to a consumer, and a delivery counts whether a handler started or not: at
    /// full width after a restart, the message that killed the process would come back with
    /// the others the broker returned, and take them down again until their deliveries ran
    /// out. Narrow, it comes alone and dies alone.
    ///
    /// - **Narrow start.** [`Pump::subscribe`] consumes one delivery at a time. RabbitMQ
    ///   keeps a consumer's prefetch for its life, and a consumer cancelled to change it has
    ///   the deliveries on their way to it requeued, counted once more: the pump widens by
    ///   adding a second consumer, tagged `{tag}.wide`, for `prefetch` less one. It does so
    ///   once a message delivered for the first time (or one this pump handed back) was
    ///   answered, or once a delivery is held for a retry's delay (it keeps its slot, and
    ///   the pump would stand still meanwhile).
    /// - **A stranger's redelivery runs alone.** A stranger's redelivery is a message
    ///   delivered before (`x-delivery-count`, or a classic queue's `redelivered`) that this
    ///   pump did not hand back itself: one in hand when a process died, this one's or
    ///   another's. It waits, unstarted, until the handlers in hand have answered, and runs
    ///   alone; the settlements of the others wait until it has answered (each would free a
    ///   slot that the broker fills), and no handler starts meanwhile. If it kills the
    ///   process, what dies with it is what the broker had sent before it: answered messages,
    ///   whose redelivery answers `Duplicate`, and at most the deliveries buffered behind it.
    ///
    /// While the narrow start's one delivery runs, or a stranger's redelivery runs alone,
    /// no other handler starts: a slow handler there holds the pump as long as it runs.
    /// Bound a handler's slow calls (an HTTP client's timeout) so that it stays short.
    ///
    /// Off, [`Pump::subscribe`] consumes `prefetch` at once and strangers run beside the
    /// others: for a queue with `x-single-active-consumer`, where the added consumer would
    /// only wait its turn, so the pump would run one delivery at a time.
    pub const fn slow_start(self, slow_start: bool) -> Self {
        Self { slow_start, ..self }
    }

    /// Sets the channel's prefetch (one delivery with [`Pump::slow_start`], `prefetch`
    /// without) and starts a consumer of `queue` with manual acknowledgements, tagged
    /// `consumer_tag` (the pump adds `{consumer_tag}.wide` when it widens).
    ///
    /// # Errors
    /// The broker's refusal (no such queue, a closed channel).
    pub async fn subscribe(
        &self,
        channel: &Channel,
        queue: &str,
        consumer_tag: &str,
    ) -> lapin::Result<Consumer> {
        let prefetch = if self.slow_start { 1 } else { self.prefetch };
        consume(channel, queue, consumer_tag, prefetch).await
    }

    /// Runs `handler` on each delivery of `consumer`, up to `prefetch` at once, and settles
    /// each by its answer, until `shutdown` completes, the handler's answer says
    /// [`Settlement::Halt`], or the consumer ends.
    ///
    /// A handler that panics settles its own delivery only ([`Settlement::of_panic`]): the
    /// runtime rolled its transaction back as the panic unwound, the delivery is handed back
    /// with the redelivery's delay (counted as retried), and the pump goes on with the
    /// others; the queue's `x-delivery-limit` dead-letters a message that panics every time.
    ///
    /// After a delivery that needed a new database connection (`Retry { reconnect: true }`:
    /// the server lost, a read-only standby) the pump starts no handler for a pause
    /// ([`Pump::outage`], [`Outage`]): a delivery it takes meanwhile waits in hand,
    /// unstarted (requeued only if the pump stops first), and after the pause one delivery
    /// tries the database alone while the others wait for its answer.
    ///
    /// # Errors
    /// [`Stopped::Halted`] when an answer halted the pump; [`Stopped::Broker`] when the
    /// channel failed (deliveries not acknowledged are redelivered by the broker).
    pub async fn run<H, F, A, S>(
        &self,
        channel: &Channel,
        consumer: Consumer,
        shutdown: S,
        handler: H,
    ) -> Result<Report, Stopped>
    where
        H: Fn(Delivery) -> F,
        F: Future<Output = A>,
        A: Settle + std::fmt::Debug,
        S: Future<Output = ()>,
    {
        let queue_name = consumer.queue();
        let outage = Outage::new(self.outage);
        // Set once the pump stops taking deliveries: a retry's delay is cut short by it.
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let window = std::sync::Mutex::new(Window::new(self.slow_start));
        let lane = tokio::sync::RwLock::new(());
        let shared = Shared {
            pump: self,
            handler: &handler,
            queue: queue_name.as_str(),
            outage: &outage,
            stopping: &stopping,
            window: &window,
            lane: &lane,
        };
        let mut delivered = Delivered {
            channel,
            consumers: Consumers::new(consumer, self),
            window: &window,
            prefetch: usize::from(self.prefetch),
            requeue_deadline: None,
        };
        let shared = &shared;
        let ended = pump::run(
            &mut delivered,
            shutdown,
            &stop,
            |arrived| work(shared, arrived),
            give_back,
        )
        .await;
        let report = Report::from(ended.counts);
        // The first failure: one that stopped the loop, else the channel's as its stream ended.
        match (ended.end, ended.failed, ended.halted) {
            (Some(End::Broker(failure)), _, _) | (_, Some(failure), _) => {
                Err(Stopped::Broker { failure, report })
            }
            (_, None, Some(answer)) => Err(Stopped::Halted { answer, report }),
            (Some(End::Cancelled), None, None) => Err(Stopped::Cancelled { report }),
            (None, None, None) => Ok(report),
        }
    }
}

/// Starts a consumer of `queue` with manual acknowledgements and `prefetch` deliveries.
async fn consume(
    channel: &Channel,
    queue: &str,
    consumer_tag: &str,
    prefetch: u16,
) -> lapin::Result<Consumer> {
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    channel
        .basic_consume(
            queue.into(),
            consumer_tag.into(),
            BasicConsumeOptions {
                no_ack: false,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
}

fn lock(window: &std::sync::Mutex<Window>) -> std::sync::MutexGuard<'_, Window> {
    window
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What tells a delivery of a message from its other deliveries: its `message_id`, or its
/// body when it has none.
fn identity(delivery: &Delivery) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    match delivery.properties.message_id() {
        Some(id) if !id.as_str().is_empty() => (0_u8, id.as_str()).hash(&mut hasher),
        _ => (1_u8, &delivery.data).hash(&mut hasher),
    }
    hasher.finish()
}
