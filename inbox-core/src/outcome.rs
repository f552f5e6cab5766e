use std::convert::Infallible;
use std::time::Duration;

use crate::{Consumer, MessageKey};

/// What a transaction-mode handler did with a message: the attribute's default.
///
/// An `#[idempotent]` handler declared to return `Result<T, E>` returns
/// `Result<Outcome<T>, E>`: an `Err` is a failure the broker should redeliver, an `Ok` is a
/// message that needs no further delivery. Each mode returns the outcome type that holds
/// only what it can answer, so a pump's `match` is exhaustive without dead arms:
///
/// | handler | returns |
/// |---|---|
/// | transaction mode (the default) | `Outcome<T>`: `Processed`, `Duplicate` |
/// | `on_locked = "in_flight"`; claim mode | [`InFlightOutcome<T>`]: and `InFlight` |
/// | claim mode with `on_expired = "report"` | [`StaleClaimOutcome<T>`]: and `StaleClaim` |
/// | `batch = …` | [`BatchOutcome<T>`] |
///
/// A pump serving handlers of several modes converts with `From` into the widest of them.
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
///     stored: None,
/// };
/// assert!(dup.should_ack() && dup.is_duplicate());
/// assert_eq!(settle(Outcome::Processed(1)), "ack");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "an Outcome says whether the message was processed or was a duplicate"]
// Deliberately exhaustive: a pump that matches every variant is told by the compiler when a
// new one (one it must not ack) appears.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
        /// The `Ok` value the delivery that processed the message stored with its marker,
        /// for a handler with `store_result`: a retried request or a redelivered command gets
        /// the original answer. `None` for a handler without it, or where the marker was
        /// written without one (before the handler stored results).
        stored: Option<T>,
    },
}

/// What a handler that may find the message in flight did with it: a transaction-mode
/// handler with `on_locked = "in_flight"`, or a claim-mode handler (whose expired claims are
/// taken over). [`Outcome`]'s answers, and `InFlight`.
///
/// ```
/// use inbox_core::InFlightOutcome;
///
/// fn settle(outcome: InFlightOutcome<()>) -> &'static str {
///     match outcome {
///         InFlightOutcome::Processed(()) | InFlightOutcome::Duplicate { .. } => "ack",
///         InFlightOutcome::InFlight { .. } => "nack with a delay",
///     }
/// }
/// assert_eq!(settle(InFlightOutcome::Processed(())), "ack");
/// ```
#[must_use = "an InFlightOutcome says whether the message was processed, a duplicate or in flight"]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum InFlightOutcome<T> {
    /// The handler ran: its work committed together with the inbox marker (transaction
    /// mode), or its side effect ran and its claim was stamped complete (claim mode).
    Processed(T),
    /// The work for this key and consumer was done before: the body did not run.
    Duplicate {
        /// The consumer whose marker was found.
        consumer: Consumer,
        /// The message key whose marker was found.
        key: MessageKey,
        /// The `Ok` value the delivery that processed the message stored with its marker,
        /// for a handler with `store_result`: a retried request or a redelivered command gets
        /// the original answer. `None` for a handler without it, or where the marker was
        /// written without one (before the handler stored results).
        stored: Option<T>,
    },
    /// Another delivery holds this key — its uncommitted marker (`on_locked = "in_flight"`)
    /// or a live claim (claim mode): its work may be running right now. The body did not
    /// run. Do not acknowledge: release the message for redelivery after a delay (RabbitMQ:
    /// `nack` with requeue after a pause, or a delayed retry queue; SQS:
    /// `ChangeMessageVisibility`; Azure Service Bus: `abandon` or `defer`; Kafka: pause the
    /// partition and retry the record). The redelivery finds the work done (`Duplicate`),
    /// still in flight, or — if the holder failed — free to run.
    InFlight {
        /// The consumer holding the key.
        consumer: Consumer,
        /// The message key held.
        key: MessageKey,
        /// Claim mode: how long the holder's lease lasts yet, on the database's clock. A
        /// delivery that comes back sooner finds the claim still held — unless its holder
        /// finished — and one that comes back later finds it done or free to take over.
        /// `None` for an uncommitted marker (`on_locked = "in_flight"`), which has no lease.
        /// The pumps wait it out from a message's second delivery on
        /// ([`Redelivery::delay_of`](crate::Redelivery::delay_of)).
        lease_left: Option<Duration>,
    },
}

/// What a claim-mode handler with `on_expired = "report"` did with a message:
/// [`InFlightOutcome`]'s answers, and `StaleClaim`.
///
/// ```
/// use inbox_core::StaleClaimOutcome;
///
/// fn settle(outcome: StaleClaimOutcome<()>) -> &'static str {
///     match outcome {
///         StaleClaimOutcome::Processed(()) | StaleClaimOutcome::Duplicate { .. } => "ack",
///         // Another delivery holds the claim and is doing the work now.
///         StaleClaimOutcome::InFlight { .. } => "nack with a delay",
///         // An earlier attempt's outcome is unknown; reconcile, do not repeat.
///         StaleClaimOutcome::StaleClaim { .. } => "dead-letter",
///     }
/// }
/// assert_eq!(settle(StaleClaimOutcome::Processed(())), "ack");
/// ```
#[must_use = "a StaleClaimOutcome says whether the message was processed, a duplicate, in flight or needs reconciling"]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StaleClaimOutcome<T> {
    /// The side effect ran and its claim was stamped complete.
    Processed(T),
    /// The work for this key and consumer was completed before: the body did not run.
    Duplicate {
        /// The consumer whose completed claim was found.
        consumer: Consumer,
        /// The message key whose completed claim was found.
        key: MessageKey,
        /// The `Ok` value the delivery that processed the message stored with its marker,
        /// for a handler with `store_result`: a retried request or a redelivered command gets
        /// the original answer. `None` for a handler without it, or where the marker was
        /// written without one (before the handler stored results).
        stored: Option<T>,
    },
    /// Another delivery holds a live claim on this key — its side effect may be running
    /// right now. The body did not run. Do not acknowledge: redeliver after a delay (see
    /// [`InFlightOutcome::InFlight`]).
    InFlight {
        /// The consumer holding the claim.
        consumer: Consumer,
        /// The message key claimed.
        key: MessageKey,
        /// How long the holder's lease lasts yet (see [`InFlightOutcome::InFlight`]).
        lease_left: Option<Duration>,
    },
    /// An earlier attempt claimed this key and its lease ran out without the work being
    /// stamped complete — it may have crashed before the side effect, during it, or after
    /// it. The body did not run. Do not acknowledge: let the message reach the dead-letter
    /// queue and reconcile it against the downstream system (look the key up there), then
    /// resolve the claim.
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
    /// Whether the message pump should acknowledge the message: always, for both answers
    /// mean the work is committed and a redelivery would only be a duplicate again.
    pub fn should_ack(&self) -> bool {
        true
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
            Outcome::Duplicate {
                consumer,
                key,
                stored,
            } => Outcome::Duplicate {
                consumer,
                key,
                stored: stored.map(f),
            },
        }
    }
}

impl<T> InFlightOutcome<T> {
    /// Whether the message pump should acknowledge the message: `true` for `Processed` and
    /// `Duplicate` (the work is done), `false` for `InFlight` (it is not known to be).
    pub fn should_ack(&self) -> bool {
        !self.is_in_flight()
    }

    /// `true` for [`InFlightOutcome::Processed`].
    pub fn is_processed(&self) -> bool {
        matches!(self, InFlightOutcome::Processed(_))
    }

    /// `true` for [`InFlightOutcome::Duplicate`].
    pub fn is_duplicate(&self) -> bool {
        matches!(self, InFlightOutcome::Duplicate { .. })
    }

    /// `true` for [`InFlightOutcome::InFlight`].
    pub fn is_in_flight(&self) -> bool {
        matches!(self, InFlightOutcome::InFlight { .. })
    }

    /// The handler's value, if it ran.
    pub fn processed(self) -> Option<T> {
        match self {
            InFlightOutcome::Processed(value) => Some(value),
            InFlightOutcome::Duplicate { .. } | InFlightOutcome::InFlight { .. } => None,
        }
    }

    /// Maps the handler's value, keeping the other answers as they are.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> InFlightOutcome<U> {
        match self {
            InFlightOutcome::Processed(value) => InFlightOutcome::Processed(f(value)),
            InFlightOutcome::Duplicate {
                consumer,
                key,
                stored,
            } => InFlightOutcome::Duplicate {
                consumer,
                key,
                stored: stored.map(f),
            },
            InFlightOutcome::InFlight {
                consumer,
                key,
                lease_left,
            } => InFlightOutcome::InFlight {
                consumer,
                key,
                lease_left,
            },
        }
    }
}

impl<T> StaleClaimOutcome<T> {
    /// Whether the message pump should acknowledge the message: `true` for `Processed` and
    /// `Duplicate` (the work is done), `false` for `InFlight` and `StaleClaim` (it is not
    /// known to be).
    pub fn should_ack(&self) -> bool {
        matches!(
            self,
            StaleClaimOutcome::Processed(_) | StaleClaimOutcome::Duplicate { .. }
        )
    }

    /// `true` for [`StaleClaimOutcome::Processed`].
    pub fn is_processed(&self) -> bool {
        matches!(self, StaleClaimOutcome::Processed(_))
    }

    /// `true` for [`StaleClaimOutcome::Duplicate`].
    pub fn is_duplicate(&self) -> bool {
        matches!(self, StaleClaimOutcome::Duplicate { .. })
    }

    /// `true` for [`StaleClaimOutcome::InFlight`].
    pub fn is_in_flight(&self) -> bool {
        matches!(self, StaleClaimOutcome::InFlight { .. })
    }

    /// `true` for [`StaleClaimOutcome::StaleClaim`].
    pub fn is_stale_claim(&self) -> bool {
        matches!(self, StaleClaimOutcome::StaleClaim { .. })
    }

    /// The handler's value, if it ran.
    pub fn processed(self) -> Option<T> {
        match self {
            StaleClaimOutcome::Processed(value) => Some(value),
            _ => None,
        }
    }

    /// Maps the handler's value, keeping the other answers as they are.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> StaleClaimOutcome<U> {
        match self {
            StaleClaimOutcome::Processed(value) => StaleClaimOutcome::Processed(f(value)),
            StaleClaimOutcome::Duplicate {
                consumer,
                key,
                stored,
            } => StaleClaimOutcome::Duplicate {
                consumer,
                key,
                stored: stored.map(f),
            },
            StaleClaimOutcome::InFlight {
                consumer,
                key,
                lease_left,
            } => StaleClaimOutcome::InFlight {
                consumer,
                key,
                lease_left,
            },
            StaleClaimOutcome::StaleClaim {
                consumer,
                key,
                attempts,
            } => StaleClaimOutcome::StaleClaim {
                consumer,
                key,
                attempts,
            },
        }
    }
}

impl<T> From<Outcome<T>> for InFlightOutcome<T> {
    fn from(outcome: Outcome<T>) -> Self {
        match outcome {
            Outcome::Processed(value) => InFlightOutcome::Processed(value),
            Outcome::Duplicate {
                consumer,
                key,
                stored,
            } => InFlightOutcome::Duplicate {
                consumer,
                key,
                stored,
            },
        }
    }
}

impl<T> From<InFlightOutcome<T>> for StaleClaimOutcome<T> {
    fn from(outcome: InFlightOutcome<T>) -> Self {
        match outcome {
            InFlightOutcome::Processed(value) => StaleClaimOutcome::Processed(value),
            InFlightOutcome::Duplicate {
                consumer,
                key,
                stored,
            } => StaleClaimOutcome::Duplicate {
                consumer,
                key,
                stored,
            },
            InFlightOutcome::InFlight {
                consumer,
                key,
                lease_left,
            } => StaleClaimOutcome::InFlight {
                consumer,
                key,
                lease_left,
            },
        }
    }
}

/// The narrowing back: every outcome but a stale claim, which comes back as the error.
///
/// ```
/// use inbox_core::{Consumer, InFlightOutcome, MessageKey, StaleClaimOutcome};
///
/// let processed = InFlightOutcome::try_from(StaleClaimOutcome::Processed(1));
/// assert_eq!(processed.unwrap(), InFlightOutcome::Processed(1));
/// let stale = StaleClaimOutcome::<()>::StaleClaim {
///     consumer: Consumer::new("mail").unwrap(),
///     key: MessageKey::text("m-1").unwrap(),
///     attempts: 1,
/// };
/// assert!(InFlightOutcome::try_from(stale).is_err());
/// ```
impl<T> TryFrom<StaleClaimOutcome<T>> for InFlightOutcome<T> {
    type Error = StaleClaimOutcome<T>;

    fn try_from(outcome: StaleClaimOutcome<T>) -> Result<Self, Self::Error> {
        match outcome {
            StaleClaimOutcome::Processed(value) => Ok(InFlightOutcome::Processed(value)),
            StaleClaimOutcome::Duplicate {
                consumer,
                key,
                stored,
            } => Ok(InFlightOutcome::Duplicate {
                consumer,
                key,
                stored,
            }),
            StaleClaimOutcome::InFlight {
                consumer,
                key,
                lease_left,
            } => Ok(InFlightOutcome::InFlight {
                consumer,
                key,
                lease_left,
            }),
            stale @ StaleClaimOutcome::StaleClaim { .. } => Err(stale),
        }
    }
}

impl<T> From<Outcome<T>> for StaleClaimOutcome<T> {
    fn from(outcome: Outcome<T>) -> Self {
        InFlightOutcome::from(outcome).into()
    }
}

/// What the outcome types of the handler modes have in common — [`Outcome`],
/// [`InFlightOutcome`] and [`StaleClaimOutcome`] — for code generic over them (a pump that
/// serves handlers of several modes, or `inbox_diesel::handler::run_once` over any `Handler`).
/// Sealed.
///
/// ```
/// use inbox_core::{HandlerOutcome, InFlightOutcome, Outcome, StaleClaimOutcome};
///
/// fn settle<T, O: HandlerOutcome<T>>(outcome: O) -> &'static str {
///     match outcome.into() {
///         StaleClaimOutcome::Processed(_) | StaleClaimOutcome::Duplicate { .. } => "ack",
///         StaleClaimOutcome::InFlight { .. } => "nack with a delay",
///         StaleClaimOutcome::StaleClaim { .. } => "dead-letter",
///     }
/// }
/// assert_eq!(settle(Outcome::Processed(1)), "ack");
/// assert_eq!(settle(InFlightOutcome::<()>::Processed(())), "ack");
///
/// fn acked<T, O: HandlerOutcome<T>>(outcome: &O) -> bool {
///     outcome.should_ack()
/// }
/// assert!(acked(&Outcome::Processed(())));
/// assert!(!acked(&StaleClaimOutcome::<()>::StaleClaim {
///     consumer: inbox_core::Consumer::new("mail")?,
///     key: inbox_core::MessageKey::integer(1),
///     attempts: 1,
/// }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// The answers a type cannot hold are in its types, not in a check: an `InFlight` answer
/// needs a witness of type `InFlightWitness` — `()` for a type with that variant,
/// [`Infallible`] for one without — and the runtime answers `InFlight` only with a witness in
/// hand; for `Outcome` there is none. The same for `StaleClaim`.
pub trait HandlerOutcome<T>: Into<StaleClaimOutcome<T>> + Sized + sealed::Sealed {
    /// Whether the message pump should acknowledge the message: the work is done.
    fn should_ack(&self) -> bool;
    /// The handler ran now.
    fn is_processed(&self) -> bool;
    /// The work was done before; the body did not run.
    fn is_duplicate(&self) -> bool;
    /// The handler's value, if it ran.
    fn processed(self) -> Option<T>;
    #[doc(hidden)]
    /// `processed`, `duplicate`, `in_flight` or `stale_claim`: the outcome's label in traces
    /// and metrics.
    fn label(&self) -> &'static str;

    #[doc(hidden)]
    type InFlightWitness: Copy;
    #[doc(hidden)]
    type StaleClaimWitness: Copy;
    #[doc(hidden)]
    const IN_FLIGHT: Option<Self::InFlightWitness>;
    #[doc(hidden)]
    const STALE_CLAIM: Option<Self::StaleClaimWitness>;
    #[doc(hidden)]
    fn from_processed(value: T) -> Self;
    #[doc(hidden)]
    fn from_duplicate(consumer: Consumer, key: MessageKey, stored: Option<T>) -> Self;
    #[doc(hidden)]
    fn from_in_flight(
        consumer: Consumer,
        key: MessageKey,
        lease_left: Option<Duration>,
        witness: Self::InFlightWitness,
    ) -> Self;
    #[doc(hidden)]
    fn from_stale_claim(
        consumer: Consumer,
        key: MessageKey,
        attempts: u32,
        witness: Self::StaleClaimWitness,
    ) -> Self;
}

mod sealed {
    pub trait Sealed {}
    impl<T> Sealed for super::Outcome<T> {}
    impl<T> Sealed for super::InFlightOutcome<T> {}
    impl<T> Sealed for super::StaleClaimOutcome<T> {}
}

impl<T> HandlerOutcome<T> for Outcome<T> {
    fn label(&self) -> &'static str {
        match self {
            Outcome::Processed(_) => "processed",
            Outcome::Duplicate { .. } => "duplicate",
        }
    }
    fn should_ack(&self) -> bool {
        self.should_ack()
    }
    fn is_processed(&self) -> bool {
        self.is_processed()
    }
    fn is_duplicate(&self) -> bool {
        self.is_duplicate()
    }
    fn processed(self) -> Option<T> {
        self.processed()
    }
    type InFlightWitness = Infallible;
    type StaleClaimWitness = Infallible;
    const IN_FLIGHT: Option<Infallible> = None;
    const STALE_CLAIM: Option<Infallible> = None;
    fn from_processed(value: T) -> Self {
        Outcome::Processed(value)
    }
    fn from_duplicate(consumer: Consumer, key: MessageKey, stored: Option<T>) -> Self {
        Outcome::Duplicate {
            consumer,
            key,
            stored,
        }
    }
    fn from_in_flight(
        _: Consumer,
        _: MessageKey,
        _: Option<Duration>,
        witness: Infallible,
    ) -> Self {
        match witness {}
    }
    fn from_stale_claim(_: Consumer, _: MessageKey, _: u32, witness: Infallible) -> Self {
        match witness {}
    }
}

impl<T> HandlerOutcome<T> for InFlightOutcome<T> {
    fn label(&self) -> &'static str {
        match self {
            InFlightOutcome::Processed(_) => "processed",
            InFlightOutcome::Duplicate { .. } => "duplicate",
            InFlightOutcome::InFlight { .. } => "in_flight",
        }
    }
    fn should_ack(&self) -> bool {
        self.should_ack()
    }
    fn is_processed(&self) -> bool {
        self.is_processed()
    }
    fn is_duplicate(&self) -> bool {
        self.is_duplicate()
    }
    fn processed(self) -> Option<T> {
        self.processed()
    }
    type InFlightWitness = ();
    type StaleClaimWitness = Infallible;
    const IN_FLIGHT: Option<()> = Some(());
    const STALE_CLAIM: Option<Infallible> = None;
    fn from_processed(value: T) -> Self {
        InFlightOutcome::Processed(value)
    }
    fn from_duplicate(consumer: Consumer, key: MessageKey, stored: Option<T>) -> Self {
        InFlightOutcome::Duplicate {
            consumer,
            key,
            stored,
        }
    }
    fn from_in_flight(
        consumer: Consumer,
        key: MessageKey,
        lease_left: Option<Duration>,
        (): (),
    ) -> Self {
        InFlightOutcome::InFlight {
            consumer,
            key,
            lease_left,
        }
    }
    fn from_stale_claim(_: Consumer, _: MessageKey, _: u32, witness: Infallible) -> Self {
        match witness {}
    }
}

impl<T> HandlerOutcome<T> for StaleClaimOutcome<T> {
    fn label(&self) -> &'static str {
        match self {
            StaleClaimOutcome::Processed(_) => "processed",
            StaleClaimOutcome::Duplicate { .. } => "duplicate",
            StaleClaimOutcome::InFlight { .. } => "in_flight",
            StaleClaimOutcome::StaleClaim { .. } => "stale_claim",
        }
    }
    fn should_ack(&self) -> bool {
        self.should_ack()
    }
    fn is_processed(&self) -> bool {
        self.is_processed()
    }
    fn is_duplicate(&self) -> bool {
        self.is_duplicate()
    }
    fn processed(self) -> Option<T> {
        self.processed()
    }
    type InFlightWitness = ();
    type StaleClaimWitness = ();
    const IN_FLIGHT: Option<()> = Some(());
    const STALE_CLAIM: Option<()> = Some(());
    fn from_processed(value: T) -> Self {
        StaleClaimOutcome::Processed(value)
    }
    fn from_duplicate(consumer: Consumer, key: MessageKey, stored: Option<T>) -> Self {
        StaleClaimOutcome::Duplicate {
            consumer,
            key,
            stored,
        }
    }
    fn from_in_flight(
        consumer: Consumer,
        key: MessageKey,
        lease_left: Option<Duration>,
        (): (),
    ) -> Self {
        StaleClaimOutcome::InFlight {
            consumer,
            key,
            lease_left,
        }
    }
    fn from_stale_claim(consumer: Consumer, key: MessageKey, attempts: u32, (): ()) -> Self {
        StaleClaimOutcome::StaleClaim {
            consumer,
            key,
            attempts,
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
