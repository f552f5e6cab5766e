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
}

impl<T> Outcome<T> {
    /// Whether the message pump should acknowledge the message.
    ///
    /// `true` for [`Outcome::Processed`] and [`Outcome::Duplicate`]: in both cases the work is
    /// committed and a redelivery would only be recognised as a duplicate again.
    pub fn should_ack(&self) -> bool {
        match self {
            Outcome::Processed(_) | Outcome::Duplicate { .. } => true,
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

    /// The handler's value, if it ran.
    pub fn processed(self) -> Option<T> {
        match self {
            Outcome::Processed(value) => Some(value),
            Outcome::Duplicate { .. } => None,
        }
    }

    /// Maps the handler's value, keeping a duplicate as it is.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Processed(value) => Outcome::Processed(f(value)),
            Outcome::Duplicate { consumer, key } => Outcome::Duplicate { consumer, key },
        }
    }
}
