use crate::{Consumer, MessageKey};

/// What an idempotent handler did with a message.
///
/// An `#[idempotent]` handler declared to return `Result<T, E>` returns
/// `Result<Outcome<T>, E>`: an `Err` is a failure the broker should redeliver, an `Ok` is a
/// message that needs no further delivery.
///
/// ```
/// use inbox_core::{Consumer, MessageKey, Outcome};
///
/// fn settle(outcome: Outcome<u64>) -> &'static str {
///     match outcome {
///         Outcome::Processed(_receipt) => "ack",
///         // Another delivery already did the work and committed it.
///         Outcome::Duplicate { .. } => "ack",
///         // Claim mode: another delivery holds the claim and is doing the work now.
///         Outcome::InFlight { .. } => "nack with a delay",
///         // Claim mode: an earlier attempt's outcome is unknown; reconcile, do not repeat.
///         Outcome::StaleClaim { .. } => "dead-letter",
///     }
/// }
///
/// let dup = Outcome::<u64>::Duplicate {
///     consumer: Consumer::new("credit")?,
///     key: MessageKey::integer(7),
/// };
/// assert!(dup.should_ack() && dup.is_duplicate());
/// assert_eq!(settle(Outcome::Processed(1)), "ack");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "an Outcome says whether the message was processed or was a duplicate"]
// Deliberately exhaustive: a pump that matches every variant is told by the compiler when a
// new one (one it must not ack) appears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The handler ran and its work committed together with the inbox marker.
    Processed(T),
    /// The marker for this key and consumer already existed (or a concurrent delivery
    /// committed it first): the handler's body did not run.
    Duplicate {
        /// The consumer whose marker was found.
        consumer: Consumer,
        /// The message key whose marker was found.
        key: MessageKey,
    },
    /// Claim mode: another delivery holds a live claim on this key — its side effect may be
    /// running right now. The body did not run. Do not acknowledge: release the message for
    /// redelivery after a delay (RabbitMQ: `nack` with requeue after a pause, or a delayed
    /// retry queue; SQS: `ChangeMessageVisibility`; Azure Service Bus: `abandon` or
    /// `defer`; Kafka: pause the partition and retry the record). The redelivery finds the
    /// work completed (`Duplicate`), still in flight, or — if the holder failed — free to run.
    InFlight {
        /// The consumer holding the claim.
        consumer: Consumer,
        /// The message key claimed.
        key: MessageKey,
    },
    /// Claim mode with `on_expired = "report"`: an earlier attempt claimed this key and its
    /// lease ran out without the work being stamped complete — it may have crashed before the
    /// side effect, during it, or after it. The body did not run. Do not acknowledge: let the
    /// message reach the dead-letter queue and reconcile it against the downstream system
    /// (look the key up there), then resolve the claim.
    StaleClaim {
        /// The consumer whose claim went stale.
        consumer: Consumer,
        /// The message key of the stale claim.
        key: MessageKey,
        /// How many attempts claimed this key so far.
        attempts: u32,
    },
}

impl<T> Outcome<T> {
    /// Whether the message pump should acknowledge the message.
    ///
    /// `true` for [`Outcome::Processed`] and [`Outcome::Duplicate`]: in both cases the work is
    /// committed and a redelivery would only be recognised as a duplicate again. `false` for
    /// [`Outcome::InFlight`] and [`Outcome::StaleClaim`]: the work is not known to be done.
    pub fn should_ack(&self) -> bool {
        match self {
            Outcome::Processed(_) | Outcome::Duplicate { .. } => true,
            Outcome::InFlight { .. } | Outcome::StaleClaim { .. } => false,
        }
    }

    /// `true` for [`Outcome::Processed`].
    pub fn is_processed(&self) -> bool {
        matches!(self, Outcome::Processed(_))
    }

    /// `true` for [`Outcome::Duplicate`].
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate { .. })
    }

    /// `true` for [`Outcome::InFlight`].
    pub fn is_in_flight(&self) -> bool {
        matches!(self, Outcome::InFlight { .. })
    }

    /// The handler's value, if it ran.
    pub fn processed(self) -> Option<T> {
        match self {
            Outcome::Processed(value) => Some(value),
            _ => None,
        }
    }

    /// Maps the handler's value, keeping the other outcomes as they are.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Processed(value) => Outcome::Processed(f(value)),
            Outcome::Duplicate { consumer, key } => Outcome::Duplicate { consumer, key },
            Outcome::InFlight { consumer, key } => Outcome::InFlight { consumer, key },
            Outcome::StaleClaim {
                consumer,
                key,
                attempts,
            } => Outcome::StaleClaim {
                consumer,
                key,
                attempts,
            },
        }
    }
}

/// What an idempotent batch handler (`batch = …`) did with a batch of messages.
///
/// The messages are named by their positions in the batch as it was passed in. Every
/// message of a batch that returned `Ok` is done: each was processed now, processed before,
/// or repeated the key of an earlier message of the same batch — acknowledge them all.
#[must_use = "a BatchOutcome says which messages of the batch were processed"]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOutcome<T> {
    /// The body's value; `None` when no message was new and the body did not run.
    pub value: Option<T>,
    /// The positions of the messages the body was given, in the batch's order: the first
    /// message of each key not processed before.
    pub processed: Vec<usize>,
    /// The positions of the others: processed before, or repeating an earlier key.
    pub duplicates: Vec<usize>,
}

impl<T> BatchOutcome<T> {
    /// `true`: every message of a batch whose handler returned `Ok` is done.
    pub fn should_ack(&self) -> bool {
        true
    }
}
