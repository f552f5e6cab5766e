//! What a pump did before it stopped, and why it stopped.

use inbox_diesel::pump::Counts;

/// What a pump did before it stopped. Each message it took is counted once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Messages acknowledged (processed, or duplicates).
    pub acked: u64,
    /// Messages handed back with a delay, to be retried.
    pub retried: u64,
    /// Messages terminated: never delivered to this consumer again.
    pub dead_lettered: u64,
    /// Messages whose answer halted the pump, handed back without delay.
    pub halted: u64,
    /// Messages that arrived as the pump stopped, handed back unstarted without delay.
    pub returned_unstarted: u64,
    /// Settlements the server did not confirm (the connection was down): JetStream
    /// redelivers those messages after `ack_wait`.
    pub unconfirmed: u64,
}

impl From<Counts> for Report {
    fn from(counts: Counts) -> Self {
        Report {
            acked: counts.acked,
            retried: counts.retried,
            dead_lettered: counts.dead_lettered,
            halted: counts.halted,
            returned_unstarted: counts.returned_unstarted,
            unconfirmed: counts.unsettled,
        }
    }
}

/// Why a pump stopped before its shutdown.
#[derive(Debug)]
#[non_exhaustive]
pub enum Stopped {
    /// A handler's answer was [`Settlement::Halt`](inbox_diesel::Settlement::Halt): a deployment fault that every message
    /// would meet. That message was handed back; the pump finished the others in hand.
    Halted {
        /// The answer, as `Debug` prints it.
        answer: String,
        /// What the pump did before.
        report: Report,
    },
    /// The consumer, or its stream, was deleted on the server: the messages in hand were
    /// finished (their settlements went nowhere).
    Deleted {
        /// What the pump did before.
        report: Report,
    },
    /// The client's connection closed for good, or the server refused the pump's pull
    /// requests (a consumer's `max_batch` or `max_expires` the pump cannot meet, a push
    /// consumer); JetStream redelivers what was not settled.
    Broker {
        /// The failure.
        failure: String,
        /// What the pump did before.
        report: Report,
    },
    /// The pump cannot run this consumer; nothing was pulled.
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
            Stopped::Deleted { .. } => f.write_str("the JetStream consumer was deleted"),
            Stopped::Broker { failure, .. } => write!(f, "the NATS consumer failed: {failure}"),
            Stopped::Unsuitable { reason } => f.write_str(reason),
        }
    }
}

impl std::error::Error for Stopped {}
