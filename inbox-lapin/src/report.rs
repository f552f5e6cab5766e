//! What a pump did before it stopped, and why it stopped.

use inbox_diesel::pump::Counts;

/// What a pump did before it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Deliveries acknowledged (processed, or duplicates).
    pub acked: u64,
    /// Deliveries requeued to be retried after a delay.
    pub retried: u64,
    /// Deliveries rejected without requeue (to the dead-letter exchange, if any).
    pub dead_lettered: u64,
    /// Deliveries whose answer halted the pump (requeued).
    pub halted: u64,
    /// Deliveries the channel had buffered when the pump stopped, requeued unstarted.
    pub requeued_unstarted: u64,
    /// Deliveries whose settlement never reached the broker: the channel or the connection
    /// failed first (the broker killed, say). The broker delivers them again — a handler
    /// that had processed one answers `Duplicate` then.
    pub unsettled: u64,
}

impl From<Counts> for Report {
    fn from(counts: Counts) -> Self {
        Report {
            acked: counts.acked,
            retried: counts.retried,
            dead_lettered: counts.dead_lettered,
            halted: counts.halted,
            requeued_unstarted: counts.returned_unstarted,
            unsettled: counts.unsettled,
        }
    }
}

/// Why a pump stopped before its shutdown.
#[derive(Debug)]
#[non_exhaustive]
pub enum Stopped {
    /// A handler's answer was [`Settlement::Halt`](inbox_diesel::Settlement::Halt): a deployment fault that every delivery
    /// would meet. That delivery was requeued; the pump finished the others in hand.
    Halted {
        /// The answer, as `Debug` prints it.
        answer: String,
        /// What the pump did before.
        report: Report,
    },
    /// The broker ended the consumer (its queue was deleted, the consumer cancelled): the
    /// deliveries in hand were finished and settled.
    Cancelled {
        /// What the pump did before.
        report: Report,
    },
    /// The channel or the connection failed; the broker redelivers what was not
    /// acknowledged.
    Broker {
        /// The failure.
        failure: String,
        /// What the pump did before.
        report: Report,
    },
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stopped::Halted { answer, .. } => write!(
                f,
                "the consumer halted: a handler answered {answer}, which every delivery would \
                 meet until the deployment is fixed"
            ),
            Stopped::Broker { failure, .. } => {
                write!(f, "the consumer's channel failed: {failure}")
            }
            Stopped::Cancelled { .. } => f.write_str("the broker ended the consumer"),
        }
    }
}

impl std::error::Error for Stopped {}
