use std::time::Duration;

use crate::ErrorClass;

/// How transient failures are retried: how many times, and how long to wait before each try.
///
/// Each retry runs in a fresh transaction, after an exponentially growing delay with jitter
/// (half fixed, half random), so that instances that collided once do not collide again in
/// lock step. Only [transient](ErrorClass::is_transient) failures are retried: a unique
/// violation or a handler's own error would fail the same way forever.
///
/// ```
/// use std::time::Duration;
/// use inbox_core::{ErrorClass, RetryDecision, RetryPolicy, TransientKind};
///
/// let policy = RetryPolicy::new(2);
/// let deadlock = ErrorClass::Transient(TransientKind::Deadlock);
/// assert!(matches!(policy.decide(&deadlock, 0, 0.5), RetryDecision::Retry { .. }));
/// assert_eq!(policy.decide(&deadlock, 2, 0.5), RetryDecision::GiveUp);
/// assert_eq!(policy.decide(&ErrorClass::Other, 0, 0.5), RetryDecision::GiveUp);
/// assert_eq!(policy.backoff(0, 0.0), Duration::from_millis(5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    max_retries: u32,
    base_delay: Duration,
    max_delay: Duration,
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Roll back, wait, and run the whole transaction again.
    Retry {
        /// How long to wait first.
        after: Duration,
    },
    /// Return the failure to the caller.
    GiveUp,
}

impl RetryPolicy {
    /// Retries used when `#[idempotent]` is given no `retries = …`.
    pub const DEFAULT_RETRIES: u32 = 3;

    /// `max_retries` retries after the first attempt, starting at 10 ms and capped at 1 s.
    pub const fn new(max_retries: u32) -> Self {
        Self {
            max_retries,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_secs(1),
        }
    }

    /// The same policy with other delays: the first retry waits about `base`, each later one
    /// twice as long as the one before, none longer than `max`.
    pub const fn with_delays(self, base: Duration, max: Duration) -> Self {
        Self {
            base_delay: base,
            max_delay: max,
            ..self
        }
    }

    /// Retries after the first attempt.
    pub const fn max_retries(&self) -> u32 {
        self.max_retries
    }

    /// Whether to retry after a failure of class `class`, when `retries_done` retries have
    /// already been made. `jitter` is a random number in `[0, 1)`.
    pub fn decide(&self, class: &ErrorClass, retries_done: u32, jitter: f64) -> RetryDecision {
        if class.is_transient() && retries_done < self.max_retries {
            RetryDecision::Retry {
                after: self.backoff(retries_done, jitter),
            }
        } else {
            RetryDecision::GiveUp
        }
    }

    /// The wait before retry number `retry` (0 for the first): `d/2 + jitter·d/2` with
    /// `d = min(base · 2^retry, max)`.
    pub fn backoff(&self, retry: u32, jitter: f64) -> Duration {
        let doubled = self
            .base_delay
            .saturating_mul(1_u32.checked_shl(retry).unwrap_or(u32::MAX));
        let delay = doubled.min(self.max_delay);
        delay / 2 + delay.mul_f64(jitter.clamp(0.0, 1.0) / 2.0)
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new(Self::DEFAULT_RETRIES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TransientKind;

    #[test]
    fn backoff_doubles_and_caps() {
        let policy = RetryPolicy::new(10);
        assert_eq!(policy.backoff(0, 1.0), Duration::from_millis(10));
        assert_eq!(policy.backoff(1, 1.0), Duration::from_millis(20));
        assert_eq!(policy.backoff(3, 0.0), Duration::from_millis(40));
        assert_eq!(policy.backoff(20, 1.0), Duration::from_secs(1));
        assert_eq!(policy.backoff(40, 1.0), Duration::from_secs(1));
    }

    #[test]
    fn only_transient_failures_are_retried() {
        let policy = RetryPolicy::new(3);
        for class in [
            ErrorClass::InboxDuplicate,
            ErrorClass::UniqueViolation { constraint: None },
            ErrorClass::TransactionAborted,
            ErrorClass::ConnectionLost,
            ErrorClass::Other,
        ] {
            assert_eq!(policy.decide(&class, 0, 0.0), RetryDecision::GiveUp);
        }
        let busy = ErrorClass::Transient(TransientKind::Busy);
        assert!(matches!(
            policy.decide(&busy, 2, 0.0),
            RetryDecision::Retry { .. }
        ));
        assert_eq!(policy.decide(&busy, 3, 0.0), RetryDecision::GiveUp);
        assert_eq!(
            RetryPolicy::new(0).decide(&busy, 0, 0.0),
            RetryDecision::GiveUp
        );
    }
}
