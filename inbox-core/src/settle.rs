//! How a delivery is settled with its broker, decided once for every outcome and every
//! failure — the `match` each message pump would otherwise write by hand.

use std::time::Duration;

use crate::{
    Action, BatchOutcome, ErrorClass, InFlightOutcome, KeyError, Outcome, StaleClaimOutcome,
};

/// What a message pump does with a delivery once the handler answered.
///
/// | answer | settlement | RabbitMQ | NATS JetStream | SQS |
/// |---|---|---|---|---|
/// | `Processed`, `Duplicate`, a batch | [`Ack`](Settlement::Ack) | `basic.ack` | `Ack` | `DeleteMessage` |
/// | `InFlight` (another delivery holds the message's uncommitted marker), a transient failure (`Action::RetryLater`) | [`Retry`](Settlement::Retry) | requeue after a delay | `Nak(delay)` | leave it; `ChangeMessageVisibility(delay)` |
/// | `InFlight` on a live claim (claim mode), with the lease left | [`Held`](Settlement::Held) | as `Retry`; from the second delivery on, after the lease ([`Redelivery::delay_of`]) | as `Retry` | as `Retry` |
/// | a connection that must go (`Action::Reconnect`: connection lost, read-only session, a lost prepared statement) | [`Retry`](Settlement::Retry) `{ reconnect: true }` | drop the connection, then as above | as above | as above |
/// | a business constraint, an invalid key, a poison message (`Action::DeadLetter`); a `StaleClaim` left for reconciliation | [`DeadLetter`](Settlement::DeadLetter) | `basic.reject`, no requeue (to the dead-letter exchange) | `Term` | to the DLQ by the redrive policy |
/// | misuse, a schema fault, a missing privilege (`Action::Alert`) | [`Halt`](Settlement::Halt) | stop consuming, requeue | stop consuming, `Nak` | stop receiving |
/// | a claim-mode side effect that ran but could not be recorded (`ErrorClass::EffectNotRecorded`, also `Action::Alert`) | [`DeadLetter`](Settlement::DeadLetter), and alert | as dead-letter | as dead-letter | as dead-letter |
///
/// ```
/// use inbox_core::{Action, Outcome, Settle, Settlement};
///
/// assert_eq!(Outcome::Processed(()).settlement(), Settlement::Ack);
/// assert_eq!(Action::Reconnect.settlement(), Settlement::Retry { reconnect: true });
/// assert_eq!(Action::Alert.settlement(), Settlement::Halt);
///
/// // A handler's whole answer: its outcome, or its error's.
/// let answer: Result<Outcome<()>, Action> = Err(Action::DeadLetter);
/// assert_eq!(answer.settlement(), Settlement::DeadLetter);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Settlement {
    /// Acknowledge: the work is done, by this delivery or an earlier one.
    Ack,
    /// Hand the message back to be delivered again after a delay ([`Redelivery`]): it may
    /// succeed then. With `reconnect`, drop the database connection first (a pool discards
    /// it): the failure was the connection's.
    Retry {
        /// Drop the database connection before the next attempt.
        reconnect: bool,
    },
    /// Another delivery holds the message's claim (claim mode's `InFlight`), for
    /// `lease_left` yet: hand it back as [`Retry`](Settlement::Retry) does, and from the
    /// message's second delivery on not before the lease ends
    /// ([`Redelivery::delay_of`]). A first delivery that finds the claim held is most
    /// likely a copy of a message whose holder is at work, and comes back after the usual
    /// delay; a message found held again is most likely one whose holder crashed, and
    /// comes back when the claim can be taken over — so that a crashed claim costs the
    /// message at most three deliveries of the broker's delivery limit, whatever the lease.
    Held {
        /// How long the holder's lease lasts yet, on the database's clock.
        lease_left: Duration,
    },
    /// Never deliver it to this consumer again: dead-letter it (or terminate it). It fails
    /// on its own merits, or waits for a person (a stale claim).
    DeadLetter,
    /// Stop consuming and alert: every delivery would fail the same way until someone fixes
    /// the deployment. The message is handed back, not acknowledged.
    Halt,
}

impl Settlement {
    /// The settlement of a failure a pump routes by its [`Action`].
    pub const fn of_action(action: Action) -> Self {
        match action {
            Action::RetryLater => Settlement::Retry { reconnect: false },
            Action::Reconnect => Settlement::Retry { reconnect: true },
            Action::Alert => Settlement::Halt,
            Action::DeadLetter => Settlement::DeadLetter,
        }
    }

    /// The settlement of a delivery whose handler panicked, and what the panic said (for the
    /// log). A pump catches the panic, settles that delivery only and goes on with the
    /// others: `Retry { reconnect: true }`. The runtime rolled the handler's transaction back
    /// as the panic unwound, so nothing of the delivery is kept; the connection it ran on was
    /// inside a transaction and is dropped; the broker redelivers the message after the
    /// pump's delay, and its delivery limit (RabbitMQ's `x-delivery-limit`, JetStream's
    /// `max_deliver`) dead-letters one that panics every time. The deliveries beside it are
    /// not touched.
    ///
    /// ```
    /// use inbox_core::Settlement;
    ///
    /// let panic = std::panic::catch_unwind(|| panic!("no account 7")).unwrap_err();
    /// assert_eq!(
    ///     Settlement::of_panic(panic.as_ref()),
    ///     (Settlement::Retry { reconnect: true }, "no account 7")
    /// );
    /// ```
    pub fn of_panic(panic: &(dyn std::any::Any + Send)) -> (Self, &str) {
        let said = match panic.downcast_ref::<&'static str>() {
            Some(said) => said,
            None => panic
                .downcast_ref::<String>()
                .map_or("a panic without a message", String::as_str),
        };
        (Settlement::Retry { reconnect: true }, said)
    }

    /// The label of this settlement in logs and metrics: `ack`, `retry` (also
    /// [`Held`](Settlement::Held)), `dead_letter`, `halt`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Settlement::Ack => "ack",
            Settlement::Retry { .. } | Settlement::Held { .. } => "retry",
            Settlement::DeadLetter => "dead_letter",
            Settlement::Halt => "halt",
        }
    }
}

/// Something a message pump can settle a delivery by: each outcome type, each failure (an
/// [`Action`], an [`ErrorClass`], a [`KeyError`]; `inbox_diesel::Error` in its crate), and a
/// handler's `Result` of one and the other. An application's error type implements it by
/// its inbox error's action, or its own judgement:
///
/// ```
/// use inbox_core::{Action, Settle, Settlement};
///
/// enum AppError {
///     Inbox(Action),
///     Rejected,
/// }
///
/// impl Settle for AppError {
///     fn settlement(&self) -> Settlement {
///         match self {
///             AppError::Inbox(action) => action.settlement(),
///             AppError::Rejected => Settlement::DeadLetter,
///         }
///     }
/// }
/// ```
pub trait Settle {
    /// How the delivery is settled.
    fn settlement(&self) -> Settlement;
}

impl Settle for Settlement {
    fn settlement(&self) -> Settlement {
        *self
    }
}

impl Settle for Action {
    fn settlement(&self) -> Settlement {
        Settlement::of_action(*self)
    }
}

impl Settle for ErrorClass {
    fn settlement(&self) -> Settlement {
        match self {
            // Parked for a person, and alerted on (`Action::Alert`): requeued, it would be
            // taken over when the lease ends and the effect run again.
            ErrorClass::EffectNotRecorded => Settlement::DeadLetter,
            other => Settlement::of_action(other.action()),
        }
    }
}

/// A key the message cannot give (empty, too long, missing): it will never be processed.
impl Settle for KeyError {
    fn settlement(&self) -> Settlement {
        Settlement::DeadLetter
    }
}

impl<T> Settle for Outcome<T> {
    fn settlement(&self) -> Settlement {
        Settlement::Ack
    }
}

/// `InFlight` with a lease left (claim mode) is [`Settlement::Held`]; an uncommitted
/// marker's (`on_locked = "in_flight"`) is a plain [`Settlement::Retry`].
fn in_flight(lease_left: Option<Duration>) -> Settlement {
    match lease_left {
        Some(lease_left) => Settlement::Held { lease_left },
        None => Settlement::Retry { reconnect: false },
    }
}

impl<T> Settle for InFlightOutcome<T> {
    fn settlement(&self) -> Settlement {
        match self {
            InFlightOutcome::InFlight { lease_left, .. } => in_flight(*lease_left),
            InFlightOutcome::Processed(_) | InFlightOutcome::Duplicate { .. } => Settlement::Ack,
        }
    }
}

impl<T> Settle for StaleClaimOutcome<T> {
    fn settlement(&self) -> Settlement {
        match self {
            StaleClaimOutcome::InFlight { lease_left, .. } => in_flight(*lease_left),
            // Whether the side effect happened is for a person to find out: parked, not
            // retried (a retry would take the claim over and might run it again).
            StaleClaimOutcome::StaleClaim { .. } => Settlement::DeadLetter,
            StaleClaimOutcome::Processed(_) | StaleClaimOutcome::Duplicate { .. } => {
                Settlement::Ack
            }
        }
    }
}

/// A batch settles as one: its transaction committed (or every message was a duplicate).
impl<T> Settle for BatchOutcome<T> {
    fn settlement(&self) -> Settlement {
        Settlement::Ack
    }
}

impl<O: Settle, E: Settle> Settle for Result<O, E> {
    fn settlement(&self) -> Settlement {
        match self {
            Ok(outcome) => outcome.settlement(),
            Err(error) => error.settlement(),
        }
    }
}

impl<S: Settle + ?Sized> Settle for &S {
    fn settlement(&self) -> Settlement {
        (**self).settlement()
    }
}

/// How long a message handed back ([`Settlement::Retry`]) waits before its next delivery:
/// doubling from `first` with each delivery, up to `max`, so that a dependency that is down
/// is not hammered and a message in flight elsewhere has time to finish.
///
/// ```
/// use std::time::Duration;
/// use inbox_core::Redelivery;
///
/// let policy = Redelivery::DEFAULT;
/// assert_eq!(policy.delay(1), Duration::from_secs(1));
/// assert_eq!(policy.delay(3), Duration::from_secs(4));
/// assert_eq!(policy.delay(60), Duration::from_secs(300));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redelivery {
    first: Duration,
    max: Duration,
}

impl Redelivery {
    /// 1 s after the first delivery, doubling, at most 5 minutes.
    pub const DEFAULT: Redelivery =
        Redelivery::exponential(Duration::from_secs(1), Duration::from_secs(5 * 60));

    /// `first` after the first delivery, doubling with each delivery after it, at most `max`.
    pub const fn exponential(first: Duration, max: Duration) -> Self {
        Self { first, max }
    }

    /// The delay after delivery number `delivery` (1 for the first) failed or found the
    /// message in flight.
    pub fn delay(&self, delivery: u32) -> Duration {
        let doublings = delivery.saturating_sub(1).min(32);
        self.first
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.max)
    }

    /// The delay before the message of delivery number `delivery`, settled by
    /// `settlement`, is delivered again: [`delay`](Self::delay), and for a message whose
    /// claim another delivery holds ([`Settlement::Held`]) from its second delivery on at
    /// least the lease left — each delivery sooner would find the claim held again and
    /// count against the broker's delivery limit (RabbitMQ's `x-delivery-limit`,
    /// JetStream's `max_deliver`), which would dead-letter the message while a crashed
    /// claim kept it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use inbox_core::{Redelivery, Settlement};
    ///
    /// let policy = Redelivery::DEFAULT;
    /// let held = Settlement::Held { lease_left: Duration::from_secs(50) };
    /// // A first delivery found the claim held: a copy, most likely; the usual delay.
    /// assert_eq!(policy.delay_of(held, 1), Duration::from_secs(1));
    /// // Held again: the holder may have crashed; back when the lease has ended.
    /// assert_eq!(policy.delay_of(held, 2), Duration::from_secs(50));
    /// assert_eq!(policy.delay_of(Settlement::Retry { reconnect: false }, 2), Duration::from_secs(2));
    /// ```
    pub fn delay_of(&self, settlement: Settlement, delivery: u32) -> Duration {
        let delay = self.delay(delivery);
        match settlement {
            Settlement::Held { lease_left } if delivery >= 2 => delay.max(lease_left),
            _ => delay,
        }
    }
}

impl Default for Redelivery {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Consumer, MessageKey, TransientKind};

    #[test]
    fn every_outcome_and_every_action_settles() {
        let consumer = || Consumer::new("c").unwrap();
        let key = || MessageKey::integer(1);
        assert_eq!(Outcome::Processed(()).settlement(), Settlement::Ack);
        assert_eq!(
            Outcome::<()>::Duplicate {
                consumer: consumer(),
                key: key(),
                stored: None,
            }
            .settlement(),
            Settlement::Ack
        );
        assert_eq!(
            InFlightOutcome::<()>::InFlight {
                consumer: consumer(),
                key: key(),
                lease_left: None,
            }
            .settlement(),
            Settlement::Retry { reconnect: false }
        );
        assert_eq!(
            StaleClaimOutcome::<()>::InFlight {
                consumer: consumer(),
                key: key(),
                lease_left: Some(Duration::from_millis(900)),
            }
            .settlement(),
            Settlement::Held {
                lease_left: Duration::from_millis(900)
            }
        );
        assert_eq!(
            StaleClaimOutcome::<()>::StaleClaim {
                consumer: consumer(),
                key: key(),
                attempts: 2
            }
            .settlement(),
            Settlement::DeadLetter
        );
        for (class, settlement) in [
            (
                ErrorClass::Transient(TransientKind::Deadlock),
                Settlement::Retry { reconnect: false },
            ),
            (
                ErrorClass::ConnectionLost,
                Settlement::Retry { reconnect: true },
            ),
            (ErrorClass::ReadOnly, Settlement::Retry { reconnect: true }),
            (
                ErrorClass::StatementLost,
                Settlement::Retry { reconnect: true },
            ),
            (ErrorClass::Schema, Settlement::Halt),
            (ErrorClass::Misuse, Settlement::Halt),
            (ErrorClass::PermissionDenied, Settlement::Halt),
            (ErrorClass::ResourceExhausted, Settlement::Halt),
            (ErrorClass::ServerSetting, Settlement::Halt),
            (ErrorClass::TransactionAborted, Settlement::Halt),
            (
                ErrorClass::UniqueViolation { constraint: None },
                Settlement::DeadLetter,
            ),
            (ErrorClass::Other, Settlement::DeadLetter),
            (ErrorClass::EffectNotRecorded, Settlement::DeadLetter),
            (
                ErrorClass::ClaimLost,
                Settlement::Retry { reconnect: false },
            ),
        ] {
            assert_eq!(class.settlement(), settlement, "{class:?}");
        }
        assert_eq!(KeyError::Empty.settlement(), Settlement::DeadLetter);
    }

    #[test]
    fn redelivery_doubles_and_caps_without_overflow() {
        let policy = Redelivery::exponential(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(policy.delay(0), Duration::from_millis(100));
        assert_eq!(policy.delay(2), Duration::from_millis(200));
        assert_eq!(policy.delay(5), Duration::from_secs(1));
        assert_eq!(policy.delay(u32::MAX), Duration::from_secs(1));
    }
}
