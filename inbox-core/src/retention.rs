use std::time::Duration;

/// How long an inbox row must be kept: as long as the broker may still deliver its message.
///
/// A marker deleted while a copy of its message can still arrive lets that copy be processed
/// a second time. A copy can arrive as long as
///
/// ```text
/// lock (visibility) timeout × max deliveries   — redeliveries of an unacknowledged message
/// + message TTL                                — a copy waiting in the queue before its first delivery
/// + replay margin                              — a dead-lettered copy sent back by hand, a replayed topic
/// ```
///
/// so [`Retention::keep_for`] is that sum. Pick each number from the broker's settings:
///
/// | broker | lock timeout | max deliveries | message TTL |
/// |---|---|---|---|
/// | RabbitMQ | the consumer acknowledgement timeout (`consumer_timeout`, 30 min by default) | the quorum queue's `delivery-limit` (classic queues have none: bound it in the consumer) | the queue's `x-message-ttl`, or the longest a message may wait |
/// | Amazon SQS | the queue's visibility timeout (30 s by default) | `maxReceiveCount` of the redrive policy | the retention period (4 days by default, 14 at most) |
/// | Azure Service Bus | the lock duration (1 min by default, 5 min at most) | `MaxDeliveryCount` (10 by default) | the message's time to live |
/// | Kafka | the longest a record can be re-read after it was processed: the time to detect a dead consumer and rebalance (`max.poll.interval.ms`, `session.timeout.ms`) | 1, with the timeout above | the topic's `retention.ms` (7 days by default), if consumers may reset their offsets |
///
/// The replay margin covers what no setting bounds: an operator moving a dead-letter queue
/// back, a consumer group reset to an earlier offset. Make it as long as such a replay can
/// happen after the fact — days, not minutes.
///
/// ```
/// use std::time::Duration;
/// use inbox_core::Retention;
///
/// const MINUTE: Duration = Duration::from_secs(60);
/// const DAY: Duration = Duration::from_secs(86_400);
///
/// // SQS: 30 s visibility timeout, maxReceiveCount 5, 4 days retention, a week for replays.
/// let sqs = Retention::redeliveries(Duration::from_secs(30), 5)
///     .message_ttl(4 * DAY)
///     .replay_margin(7 * DAY);
/// assert_eq!(sqs.keep_for(), 11 * DAY + 150 * Duration::from_secs(1));
///
/// // Azure Service Bus: 1 min lock, 10 deliveries, 1 day TTL.
/// let asb = Retention::redeliveries(MINUTE, 10).message_ttl(DAY);
/// assert_eq!(asb.keep_for(), DAY + 10 * MINUTE);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    lock_timeout: Duration,
    max_deliveries: u32,
    message_ttl: Duration,
    replay_margin: Duration,
}

impl Retention {
    /// A message redelivered up to `max_deliveries` times, each after `lock_timeout`; no TTL
    /// and no replay margin yet.
    pub const fn redeliveries(lock_timeout: Duration, max_deliveries: u32) -> Self {
        Self {
            lock_timeout,
            max_deliveries,
            message_ttl: Duration::ZERO,
            replay_margin: Duration::ZERO,
        }
    }

    /// A fixed period — "keep markers 7 days" — for a broker whose redelivery window is not
    /// worked out from its settings. Choose it above that window.
    pub const fn fixed(keep_for: Duration) -> Self {
        Self {
            lock_timeout: Duration::ZERO,
            max_deliveries: 0,
            message_ttl: Duration::ZERO,
            replay_margin: keep_for,
        }
    }

    /// How long a message may wait in the queue before its first delivery.
    pub const fn message_ttl(self, ttl: Duration) -> Self {
        Self {
            message_ttl: ttl,
            ..self
        }
    }

    /// How long after the fact a dead-lettered or replayed copy may still arrive.
    pub const fn replay_margin(self, margin: Duration) -> Self {
        Self {
            replay_margin: margin,
            ..self
        }
    }

    /// How long a completed row must be kept: `lock_timeout × max_deliveries + message_ttl +
    /// replay_margin`, saturating rather than overflowing.
    pub fn keep_for(&self) -> Duration {
        self.lock_timeout
            .saturating_mul(self.max_deliveries)
            .saturating_add(self.message_ttl)
            .saturating_add(self.replay_margin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturates_instead_of_overflowing() {
        let forever = Retention::redeliveries(Duration::MAX, u32::MAX).message_ttl(Duration::MAX);
        assert_eq!(forever.keep_for(), Duration::MAX);
    }

    #[test]
    fn sums_every_part() {
        let r = Retention::redeliveries(Duration::from_secs(2), 3)
            .message_ttl(Duration::from_secs(5))
            .replay_margin(Duration::from_secs(7));
        assert_eq!(r.keep_for(), Duration::from_secs(18));
    }
}
