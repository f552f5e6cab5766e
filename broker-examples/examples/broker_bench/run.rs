//! One run's terms: the payload, the brokers and variants measured, the tally of the
//! handlers' answers, the timing.

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use inbox_broker_examples::store::Failure;
use inbox_diesel::{KeyError, MessageKey, Outcome};
use tokio::sync::Notify;

use crate::database::Database;

/// Every message's payload: its size is the one the memory figures are stated for.
pub(crate) static PAYLOAD: [u8; 100] = [b'.'; 100];

/// What one run's handlers answered, and when the last message was answered.
pub(crate) struct Tally {
    expected: u64,
    answered: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) failed: AtomicU64,
    last: Mutex<Option<Instant>>,
    all_answered: Notify,
}

impl Tally {
    pub(crate) fn new(expected: usize) -> Self {
        Self {
            expected: expected as u64,
            answered: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            last: Mutex::new(None),
            all_answered: Notify::new(),
        }
    }

    /// The handler for one delivery, whoever calls it; the answer is counted.
    pub(crate) async fn handle(
        &self,
        database: &Database,
        key: Result<MessageKey, KeyError>,
        id: &str,
    ) -> Result<Outcome<()>, Failure> {
        let answer = match key {
            Ok(key) => database.apply(&key, id).await,
            Err(invalid) => Err(Failure::from(inbox_diesel::Error::InvalidKey(invalid))),
        };
        match &answer {
            Ok(outcome) => {
                if outcome.is_duplicate() {
                    self.duplicates.fetch_add(1, Ordering::Relaxed);
                }
                if self.answered.fetch_add(1, Ordering::Relaxed) + 1 == self.expected {
                    *self.last.lock().expect("not poisoned") = Some(Instant::now());
                    self.all_answered.notify_one();
                }
            }
            Err(e) => {
                if self.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!("  a handler failed (further failures are counted): {e}");
                }
            }
        }
        answer
    }

    /// Completes once every message of the run has been answered.
    pub(crate) async fn finished(&self) {
        self.all_answered.notified().await;
    }

    fn last(&self) -> Option<Instant> {
        *self.last.lock().expect("not poisoned")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Broker {
    RabbitMq,
    Nats,
    Kafka,
    Sqs,
}

impl fmt::Display for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Broker::RabbitMq => "RabbitMQ",
            Broker::Nats => "JetStream",
            Broker::Kafka => "Kafka",
            Broker::Sqs => "SQS",
        })
    }
}

impl Broker {
    /// The variants measured for this broker.
    pub(crate) fn variants(self) -> &'static [Variant] {
        match self {
            Broker::RabbitMq => &[Variant::Direct, Variant::Pump],
            Broker::Nats => &[Variant::Direct, Variant::DirectConfirmed, Variant::Pump],
            Broker::Kafka | Broker::Sqs => &[Variant::Direct, Variant::Pump],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Variant {
    /// The broker's client, the handler, an acknowledgement sent without waiting for more.
    Direct,
    /// JetStream only: as `Direct`, with the acknowledgement confirmed by the server.
    DirectConfirmed,
    /// The adapter's pump.
    Pump,
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Variant::Direct => "direct",
            Variant::DirectConfirmed => "direct, double_ack",
            Variant::Pump => "Pump",
        })
    }
}

/// One timed run: from the subscription to the last answer, and from the last answer until
/// the consumer had stopped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) consuming: Duration,
    pub(crate) stopping: Duration,
}

/// Why a run does not count: the consumer failed, or a message was not applied exactly once.
pub(crate) type RunError = String;

pub(crate) fn message_ids(run: usize, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("r{run}-m{i:06}")).collect()
}

pub(crate) fn timing(start: Instant, tally: &Tally, stopped: Instant) -> Result<Timing, RunError> {
    let last = tally.last().ok_or_else(|| {
        format!(
            "the consumer stopped after {} of {} answers",
            tally.answered.load(Ordering::Relaxed),
            tally.expected
        )
    })?;
    Ok(Timing {
        consuming: last - start,
        stopping: stopped.saturating_duration_since(last),
    })
}
