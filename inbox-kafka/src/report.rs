//! What a pump did before it stopped, and why it stopped.

use inbox_diesel::pump::Counts;

/// What a pump did before it stopped. Each record it took is counted once, by what finally
/// became of it; [`Report::retries`] counts the handler's runs it repeated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Records acknowledged (processed, or duplicates): their offsets stored for the next
    /// commit.
    pub acked: u64,
    /// Records written to the dead-letter topic (the handler's answer, or its retries used
    /// up), then their offsets stored.
    pub dead_lettered: u64,
    /// Records whose answer halted the pump: their offsets not stored.
    pub halted: u64,
    /// Records the pump had taken but not started, or was waiting to retry, when it
    /// stopped: their offsets not stored, so the group delivers them again.
    pub returned_unstarted: u64,
    /// Records whose offset was not stored though their handler answered: the partition was
    /// revoked while the record was in hand (its owner delivers it again, and the inbox
    /// answers `Duplicate` if it was processed), or its dead letter could not be written
    /// ([`Stopped::DeadLetter`]).
    pub unstored: u64,
    /// Handler runs repeated in place after a retrying answer (a busy database, a claim
    /// held, a panic).
    pub retries: u64,
}

impl Report {
    pub(crate) fn of(counts: Counts, retries: u64) -> Self {
        Report {
            acked: counts.acked,
            dead_lettered: counts.dead_lettered,
            halted: counts.halted,
            returned_unstarted: counts.returned_unstarted + counts.retried,
            unstored: counts.unsettled,
            retries,
        }
    }
}

/// Why a pump stopped before its shutdown.
#[derive(Debug)]
#[non_exhaustive]
pub enum Stopped {
    /// A handler's answer was [`Settlement::Halt`](inbox_diesel::Settlement::Halt): a
    /// deployment fault that every record would meet. Its offset was not stored; the pump
    /// finished the records in hand on other partitions.
    Halted {
        /// The answer, as `Debug` prints it.
        answer: String,
        /// What the pump did before.
        report: Report,
    },
    /// A record to be dead-lettered could not be written to its dead-letter topic (the
    /// topic does not exist and the broker creates none, the producer timed out): its
    /// offset was not stored, so that nothing past it is committed, and the pump stopped.
    DeadLetter {
        /// The producer's failure.
        failure: String,
        /// What the pump did before.
        report: Report,
    },
    /// The consumer failed for good (a fatal librdkafka error).
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
                "the consumer halted: a handler answered {answer}, which every record would \
                 meet until the deployment is fixed"
            ),
            Stopped::DeadLetter { failure, .. } => write!(
                f,
                "a record could not be dead-lettered, and the pump stopped before committing \
                 past it: {failure}"
            ),
            Stopped::Broker { failure, .. } => write!(f, "the Kafka consumer failed: {failure}"),
        }
    }
}

impl std::error::Error for Stopped {}
